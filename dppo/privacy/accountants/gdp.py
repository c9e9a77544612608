"""Gaussian DP (GDP) accounting: exact composition of Gaussian releases.

A Gaussian mechanism with L2 sensitivity ``Delta`` and noise ``N(0, sigma^2 I)`` is ``mu``-GDP with
``mu = Delta / sigma``, and this is tight: its privacy profile is exactly that of ``N(0, 1)`` against
``N(mu, 1)`` (Dong, Roth & Su 2022, Def. 2.7 / Thm 2.7). Composing Gaussian releases is again exactly
Gaussian: ``mu = sqrt(sum_i mu_i^2)`` (Cor. 3.3; for the correlated-noise continual counters the whole
release is one Gaussian mechanism ``C X + Z``, and its ledger entries per statistic set are the blocks of
that one mechanism, whose ``mu_set^2`` add up to the joint ``mu^2``). Adaptively chosen inputs keep this
for lower-triangular factorizations with Gaussian noise (Denisov et al. 2022, Thm 2.1).

Conversion to (eps, delta), exact for ``mu``-GDP (Dong et al. 2022, Cor. 2.13; the same formula as the
analytic Gaussian mechanism, Balle & Wang 2018, Thm 8):
``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (``dppo.privacy.calibration.gaussian_delta``
at ``sigma = 1 / mu``); ``spent(delta)`` is the smallest eps with ``delta(eps) <= delta``. No zCDP or RDP
conversion is involved, so a Gaussian release calibrated with ``analytic_gaussian_sigma`` to (eps, delta)
reports exactly (eps, delta).

Only Gaussian releases are accepted: each entry must carry ``sigma`` and ``sensitivity`` (L2, replace-one
as the caller derived it). A pure-DP entry is refused (use the ``zcdp`` or ``basic`` accountant).
"""
from __future__ import annotations

import math

from scipy.optimize import brentq

from dppo.errors import ConfigError
from dppo.privacy.accountants.base import Accountant, register
from dppo.privacy.calibration import gaussian_delta


def gdp_to_dp(mu: float, delta: float) -> float:
    """Smallest eps with ``delta(eps) <= delta`` for ``mu``-GDP (module docstring); 0 for ``mu = 0``."""
    if mu <= 0:
        return 0.0
    if not 0 < delta < 1:
        raise ConfigError(f"delta must lie in (0, 1), got {delta}")
    f = lambda e: gaussian_delta(e, 1.0 / mu, 1.0) - delta       # decreasing in eps
    if f(0.0) <= 0:
        return 0.0
    hi = max(1.0, mu * mu)
    while f(hi) > 0:
        hi *= 2
    return float(brentq(f, 0.0, hi, xtol=1e-13, rtol=1e-13))


def release_mu(release: dict) -> float:
    """``mu = sensitivity / sigma`` of one Gaussian ledger entry."""
    sigma, sens = release.get("sigma"), release.get("sensitivity")
    if sigma is None or sens is None or not float(sigma) > 0:
        raise ConfigError(f"the gdp accountant composes Gaussian releases (sigma, sensitivity); "
                          f"'{release.get('mechanism')}' has none: use privacy.accountant=zcdp or basic")
    return float(sens) / float(sigma)


@register
class GDPAccountant(Accountant):
    """Composes Gaussian releases exactly (``mu^2`` adds up) and converts ``mu`` to (eps, delta) exactly."""

    name = "gdp"

    def __init__(self):
        self.mu_sq = 0.0

    def step(self, release: dict) -> None:
        self.mu_sq += release_mu(release) ** 2

    @property
    def mu(self) -> float:
        return math.sqrt(self.mu_sq)

    def spent(self, delta: float | None = None) -> tuple[float, float]:
        if self.mu_sq == 0:
            return 0.0, 0.0
        if delta is None:
            return math.inf, 0.0
        return gdp_to_dp(self.mu, delta), float(delta)
