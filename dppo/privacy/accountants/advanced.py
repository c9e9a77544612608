"""Advanced composition of pure-DP releases (the accounting of the DP-GFA paper).

Dwork, Rothblum & Vadhan 2010 (Dwork & Roth 2014, Thm 3.20): k adaptive eps_i-DP releases are
(eps', delta')-DP for every delta' > 0 with

    eps' = sqrt(2 ln(1/delta') sum_i eps_i^2) + sum_i eps_i (e^{eps_i} - 1)

(the theorem is stated for equal eps_i = eps_0: sqrt(2 k ln(1/delta')) eps_0 + k eps_0 (e^{eps_0} - 1);
its proof, Azuma's inequality on privacy losses bounded by eps_i with means <= eps_i (e^{eps_i} - 1),
gives the sum form for unequal ones). Basic composition ``sum_i eps_i`` (delta' = 0) is also valid,
so ``spent`` reports the smaller of the two.

The paper sets ``eps_0 = eps / sqrt(2 (K/B) log(1/delta))``, which keeps only the first term and so
overshoots the target by ``k eps_0 (e^{eps_0} - 1)``; ``largest_eps0`` instead solves the full bound.
"""
from __future__ import annotations

import math

from scipy.optimize import brentq

from dppo.errors import ConfigError
from dppo.privacy.accountants.base import Accountant, register


def advanced_composition_eps(eps_list, delta: float) -> float:
    """Total eps of pure eps_i-DP releases at slack delta (min of advanced and basic composition)."""
    eps_list = [float(e) for e in eps_list if e > 0]
    if not eps_list:
        return 0.0
    basic = sum(eps_list)
    adv = math.sqrt(2 * math.log(1 / delta) * sum(e * e for e in eps_list)) + sum(e * math.expm1(e) for e in eps_list)
    return min(basic, adv)


def paper_eps0(eps: float, releases: int, delta: float) -> float:
    """The paper's per-release budget eps_0 = eps / sqrt(2 M log(1/delta)) (first-order term only)."""
    return eps / math.sqrt(2 * releases * math.log(1 / delta))


@register
class AdvancedAccountant(Accountant):
    """Advanced composition over every pure-DP release (releases must have delta = 0)."""

    name = "advanced"

    def __init__(self):
        self.eps_list: list[float] = []

    def step(self, release: dict) -> None:
        if float(release.get("delta", 0.0)) > 0:
            raise ConfigError("the advanced-composition accountant only composes pure-DP (delta=0) releases")
        if float(release["eps"]) > 0:
            self.eps_list.append(float(release["eps"]))

    def spent(self, delta: float | None = None) -> tuple[float, float]:
        if not self.eps_list:
            return 0.0, 0.0
        basic = sum(self.eps_list)
        if delta is None:
            return basic, 0.0
        adv = advanced_composition_eps(self.eps_list, delta)
        return (adv, float(delta)) if adv < basic else (basic, 0.0)

    @staticmethod
    def largest_eps0(eps: float, delta: float, releases: int, mechanism: str = "exponential") -> float:
        """Largest eps_0 such that ``releases`` eps_0-DP releases compose to at most ``eps`` (at ``delta``)."""
        if releases < 1:
            raise ConfigError(f"need at least one release, got {releases}")
        f = lambda e0: advanced_composition_eps([e0] * releases, delta) - eps
        hi = eps
        return brentq(f, 1e-12, hi, xtol=1e-14, rtol=1e-12) if f(hi) > 0 else hi
