"""Accountants, one per file, behind one interface and a registry by name."""
from dppo.privacy.accountants.base import Accountant, make_accountant, register
from dppo.privacy.accountants.basic import BasicAccountant
from dppo.privacy.accountants.parallel import ParallelAccountant
from dppo.privacy.accountants.opacus import PRVAccountant, RDPAccountant, multi_pass_noise_multiplier
from dppo.privacy.accountants.advanced import AdvancedAccountant  # noqa: F401  (registers 'advanced')
from dppo.privacy.accountants.zcdp import ZCDPAccountant  # noqa: F401  (registers 'zcdp')
from dppo.privacy.accountants.gdp import GDPAccountant  # noqa: F401  (registers 'gdp')

__all__ = ["Accountant", "make_accountant", "register", "BasicAccountant", "ParallelAccountant", "RDPAccountant",
           "PRVAccountant", "multi_pass_noise_multiplier"]
