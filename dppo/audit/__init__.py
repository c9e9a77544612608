"""Empirical privacy audit: run each private mechanism of dppo on neighbouring inputs many times and
turn a distinguisher's error rates into a lower bound on eps (``python -m dppo.audit``)."""
from dppo.audit.bounds import ThresholdAudit, clopper_pearson_upper, eps_from_rates, threshold_audit
from dppo.audit.result import MechanismAudit
from dppo.audit.run import markdown, power_checks, run_suite, suite

__all__ = ["threshold_audit", "clopper_pearson_upper", "eps_from_rates", "ThresholdAudit", "MechanismAudit",
           "run_suite", "suite", "markdown", "power_checks"]
