"""Noise calibration: every noise scale in dppo is computed here from (eps, delta, sensitivity)."""
from __future__ import annotations

import functools
import math

from scipy.optimize import brentq
from scipy.special import log_ndtr

from dppo.errors import ConfigError


def _check(eps: float, delta: float | None = None, sensitivity: float = 1.0) -> None:
    if not (eps > 0 and math.isfinite(eps)):
        raise ConfigError(f"eps must be a positive finite number, got {eps}")
    if delta is not None and not (0 < delta < 1):
        raise ConfigError(f"delta must lie in (0, 1), got {delta}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ConfigError(f"sensitivity must be positive, got {sensitivity}")


def gaussian_delta(eps: float, sigma: float, sensitivity: float = 1.0) -> float:
    """Exact delta(eps) of the Gaussian mechanism N(0, sigma^2), sensitivity Delta.

    Balle & Wang 2018, Thm 8: delta = Phi(D/2s - e s/D) - e^eps Phi(-D/2s - e s/D).
    Computed in log space so it stays accurate for tiny delta.
    """
    a = sensitivity / (2 * sigma)
    b = eps * sigma / sensitivity
    log_first = log_ndtr(a - b)
    log_second = eps + log_ndtr(-a - b)
    if log_second >= log_first:
        return 0.0
    return math.exp(log_first) * -math.expm1(log_second - log_first)


def analytic_gaussian_sigma(eps: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest sigma making N(0, sigma^2 I) (eps, delta)-DP for l2-sensitivity Delta.

    Analytic Gaussian mechanism (Balle & Wang 2018): root of gaussian_delta(eps, sigma) = delta.
    Valid for every eps > 0, unlike the classic sqrt(2 ln(1.25/delta)) Delta / eps (eps < 1 only).
    """
    _check(eps, delta, sensitivity)
    return _analytic_unit_sigma(float(eps), float(delta)) * sensitivity


@functools.lru_cache(maxsize=1024)
def _analytic_unit_sigma(eps: float, delta: float) -> float:
    """sigma of the analytic Gaussian mechanism at sensitivity 1 (cached: every round asks for the same)."""
    f = lambda log_s: math.log(max(gaussian_delta(eps, math.exp(log_s), 1.0), 1e-300)) - math.log(delta)
    lo, hi = math.log(1e-6), math.log(1e6)
    return math.exp(brentq(f, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500))


def classic_gaussian_sigma(eps: float, delta: float, sensitivity: float = 1.0) -> float:
    """Classic Gaussian mechanism scale sqrt(2 ln(1.25/delta)) Delta / eps (Dwork & Roth A.1); only for comparison."""
    _check(eps, delta, sensitivity)
    return math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / eps


def laplace_scale(eps: float, sensitivity: float = 1.0) -> float:
    """Laplace mechanism scale b = Delta_1 / eps, giving pure eps-DP."""
    _check(eps, None, sensitivity)
    return sensitivity / eps


def exp_mech_beta(eps: float, sensitivity: float) -> float:
    """Inverse temperature beta = eps / (2 Delta) of the exponential mechanism: pure eps-DP
    (and eps-bounded-range, hence eps^2/8-zCDP, Cesar & Rogers 2021)."""
    _check(eps, None, sensitivity)
    return eps / (2 * sensitivity)
