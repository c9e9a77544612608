"""Privacy core: calibration, noise, accountants, ledger, clipping and the privacy context."""
from dppo.privacy.calibration import analytic_gaussian_sigma, exp_mech_beta, gaussian_delta, laplace_scale
from dppo.privacy.context import PrivacyContext
from dppo.privacy.ledger import Ledger
from dppo.privacy.noise import NoiseSource

__all__ = ["analytic_gaussian_sigma", "exp_mech_beta", "gaussian_delta", "laplace_scale",
           "PrivacyContext", "Ledger", "NoiseSource"]
