"""Zero-concentrated DP (zCDP) accounting for pure-DP and bounded-range releases.

* The exponential mechanism with inverse temperature ``beta = eps_0 / (2 Delta)`` is eps_0-bounded-range
  (the privacy loss ``beta (S_D(f) - S_D'(f)) - log(Z_D/Z_D')`` varies by at most ``2 beta Delta = eps_0``
  over outcomes), hence ``eps_0^2 / 8``-zCDP (Cesar & Rogers 2021, Lemma 3.2). Any other eps-DP
  release is ``eps^2 / 2``-zCDP (Bun & Steinke 2016, Prop. 1.4).
* zCDP composes additively: rho = sum_i rho_i (Bun & Steinke 2016, Lemma 2.3).
* Conversion to (eps, delta):
  - ``standard``: eps = rho + 2 sqrt(rho log(1/delta)) (Bun & Steinke 2016, Prop. 1.3);
  - ``cks`` (default, tighter): rho-zCDP is (alpha, alpha rho)-RDP for all alpha > 1, and
    eps = min_alpha alpha rho + log(1/delta)/(alpha-1) + log(1 - 1/alpha) - log(alpha)/(alpha-1)
    (Canonne, Kamath & Steinke 2020, Prop. 12 / Cor. 13; the same conversion Opacus uses for RDP).
  Basic composition (sum of eps, delta = 0) is valid too; ``spent`` reports the smaller bound.
* Gaussian releases (continual counters) carry their own ``rho = sensitivity^2 / (2 sigma^2)``
  (Bun & Steinke 2016, Prop. 1.6) in the ledger entry; they add to rho, and once any is present
  basic composition no longer applies (only the converted bound is reported).
"""
from __future__ import annotations

import math

from scipy.optimize import brentq, minimize_scalar

from dppo.errors import ConfigError
from dppo.privacy.accountants.base import Accountant, register

BOUNDED_RANGE_MECHANISMS = ("exponential",)


def release_rho(mechanism: str, eps: float) -> float:
    """zCDP parameter of one pure eps-DP release: eps^2/8 if it is eps-bounded-range, else eps^2/2."""
    return eps * eps / 8 if mechanism in BOUNDED_RANGE_MECHANISMS else eps * eps / 2


def zcdp_to_dp(rho: float, delta: float, conversion: str = "cks") -> float:
    """eps such that rho-zCDP implies (eps, delta)-DP (module docstring)."""
    if rho <= 0:
        return 0.0
    L = math.log(1 / delta)
    if conversion == "standard":
        return rho + 2 * math.sqrt(rho * L)
    if conversion != "cks":
        raise ConfigError(f"unknown zCDP conversion '{conversion}' (standard | cks)")
    g = lambda a: a * rho + L / (a - 1) + math.log1p(-1 / a) - math.log(a) / (a - 1)
    a0 = 1 + math.sqrt(L / rho)                      # minimizer of a rho + L/(a-1), a good bracket centre
    res = minimize_scalar(lambda t: g(1 + math.exp(t)), bounds=(math.log(a0 - 1) - 6, math.log(a0 - 1) + 6),
                          method="bounded", options={"xatol": 1e-10})
    return float(min(res.fun, rho + 2 * math.sqrt(rho * L)))


def rho_for_target(eps: float, delta: float, conversion: str = "cks") -> float:
    """Largest rho whose conversion at ``delta`` is at most ``eps`` (calibrates Gaussian releases)."""
    if eps <= 0 or not 0 < delta < 1:
        raise ConfigError(f"need eps > 0 and delta in (0, 1), got eps={eps}, delta={delta}")
    f = lambda r: zcdp_to_dp(r, delta, conversion) - eps
    hi = eps
    while f(hi) < 0:
        hi *= 2
    return brentq(f, 1e-15, hi, xtol=1e-15, rtol=1e-13)


@register
class ZCDPAccountant(Accountant):
    """Sums the zCDP of every pure-DP release (bounded-range ones at eps^2/8) and converts at delta."""

    name = "zcdp"

    def __init__(self, conversion: str = "cks"):
        if conversion not in ("cks", "standard"):
            raise ConfigError(f"unknown zCDP conversion '{conversion}' (standard | cks)")
        self.conversion = conversion
        self.rho = 0.0
        self.eps_sum = 0.0
        self.gaussian = False

    def step(self, release: dict) -> None:
        if release.get("rho") is not None:              # a Gaussian release with its own zCDP parameter
            self.rho += float(release["rho"])
            self.gaussian = True
            return
        if float(release.get("delta", 0.0)) > 0:
            raise ConfigError("the zCDP accountant only composes pure-DP (delta=0) releases")
        eps = float(release["eps"])
        if eps > 0:
            self.rho += release_rho(release["mechanism"], eps)
            self.eps_sum += eps

    def spent(self, delta: float | None = None) -> tuple[float, float]:
        if self.rho == 0 and self.eps_sum == 0:
            return 0.0, 0.0
        if delta is None:
            return (math.inf, 0.0) if self.gaussian else (self.eps_sum, 0.0)
        conv = zcdp_to_dp(self.rho, delta, self.conversion)
        if self.gaussian:
            return conv, float(delta)
        return (conv, float(delta)) if conv < self.eps_sum else (self.eps_sum, 0.0)

    def largest_eps0(self, eps: float, delta: float, releases: int, mechanism: str = "exponential") -> float:
        """Largest eps_0 such that ``releases`` eps_0-DP releases of ``mechanism`` meet (eps, delta)."""
        if releases < 1:
            raise ConfigError(f"need at least one release, got {releases}")
        per = release_rho(mechanism, 1.0)               # rho of one release = per * eps_0^2
        f = lambda e0: min(zcdp_to_dp(releases * per * e0 * e0, delta, self.conversion), releases * e0) - eps
        hi = eps
        while f(hi) < 0:
            hi *= 2
        return brentq(f, 1e-12, hi, xtol=1e-14, rtol=1e-12)
