"""Noise calibration: every noise scale in dppo is computed here from (eps, delta, sensitivity), with the
sensitivity derivations of the mechanisms that need more than one line (ssp) and the budget splits over
composed releases (DP-GFA)."""
from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass

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


# ---- sufficient-statistics perturbation (the ssp oracle) ---------------------------------------------------
@dataclass(frozen=True)
class SSPCalibration:
    """The noise of one SSP release of (S, b) (``ssp_calibration``): stds, the separate sensitivities, the
    joint bound, and the joint l2 sensitivity in units of ``sigma_gram`` (so the ledger's
    ``noise_multiplier = sigma_gram / sensitivity`` is the multiplier of the equivalent single Gaussian)."""

    sigma_gram: float
    sigma_moment: float
    sensitivity_gram: float
    sensitivity_moment: float
    joint_sensitivity_sq: float
    sensitivity: float


def ssp_calibration(eps: float, delta: float, *, gram_share: float, b_clip: float) -> SSPCalibration:
    """Stds of S~ = S + E and b~ = b + e whose joint release is exactly (eps, delta)-DP (replace-one user).

    Sensitivity (normalized units ||x|| <= 1, |y| <= 1): user i contributes S_i = (1/n_i) X_i^T X_i
    (n_i >= rows_i), PSD with trace <= 1, hence ||S_i||_F <= 1, so for a replaced user
    ||S_i - S_i'||_F^2 = ||S_i||_F^2 + ||S_i'||_F^2 - 2 tr(S_i S_i') <= 2 (tr(AB) >= 0 for PSD A, B):
    Delta_S = sqrt(2) for the vector (diag S, sqrt(2) upper-offdiag S), whose norm is ||S||_F. The moment
    b_i = (1/n_i) X_i^T y_i has ||b_i|| <= 1 and is clipped to ``b_clip`` (<= 1), so Delta_b = 2 b_clip.
    Calibration (exact, Gaussian DP): releasing S + N(0, sigma_S^2), b + N(0, sigma_b^2) is mu-GDP with
    mu^2 = sup over replaced users of ||dS||^2 / sigma_S^2 + ||db||^2 / sigma_b^2 (one Gaussian mechanism in
    whitened coordinates; Dong, Roth & Su 2019), and mu-GDP is (eps, delta)-DP iff
    mu <= 1 / analytic_gaussian_sigma(eps, delta, 1) (Balle & Wang 2018). ``gram_share`` fixes the ratio of
    the stds: with a = gram_share / Delta_S^2 and c = (1 - gram_share) / Delta_b^2 the separate bounds give
    mu^2 <= (2a + 4 b_clip^2 c) / t^2 = 1 / t^2 for stds (1/sqrt(a), 1/sqrt(c)) t.
    Joint bound, ``b_clip = 1``: the sup is jointly tighter, because the two terms peak at different pairs.
    f = a ||dS||^2 + c ||db||^2 is jointly convex in the two users' (S_i, b_i), which range over the convex
    hull of single rows (x x^T, y x), ||x|| <= 1, |y| <= 1 (weights 1/n_i sum to <= 1; 0 is a row with
    x = 0), so the sup is at single-row users; there, with u = x.x',
    f = a(|x|^4 + |x'|^4 - 2u^2) + c(y^2|x|^2 + y'^2|x'|^2 - 2yy'u), increasing in |x|^2, |x'|^2 and convex
    in (y, y'): the sup is at unit x, x', y = -y' sign(u):
    max_{0<=u<=1} 2a(1 - u^2) + 2c(1 + u) = 2a + 2c + c^2/(2a) (at u = c/(2a) <= 1), else 4c.
    With gram_share = 1/3 (sigma_S = sigma_b) that is the single Gaussian mechanism on (S, b) with
    Delta = sqrt(4.5), attained (x = e1, y = 1 vs x' = (1/2, sqrt3/2), y' = -1), not sqrt(6).
    (For b_clip < 1 the clipped b_i leave that hull, and the separate bounds are used.)
    """
    if not 0 < b_clip <= 1 or not 0 < gram_share < 1:
        raise ConfigError(f"ssp: need 0 < b_clip <= 1 and 0 < gram_share < 1, got {b_clip}, {gram_share}")
    d_s, d_b = math.sqrt(2.0), 2.0 * b_clip
    a, c = gram_share / d_s ** 2, (1.0 - gram_share) / d_b ** 2
    if b_clip < 1.0:
        joint_sq = a * d_s ** 2 + c * d_b ** 2  # = 1: the separate bounds
    else:
        joint_sq = 2 * a + 2 * c + c * c / (2 * a) if c <= 2 * a else 4 * c
    unit = analytic_gaussian_sigma(eps, delta, 1.0)
    mu = 1.0 / unit
    t = math.sqrt(joint_sq) / mu
    sigma_s, sigma_b = t * d_s / math.sqrt(gram_share), t * d_b / math.sqrt(1.0 - gram_share)
    return SSPCalibration(sigma_s, sigma_b, d_s, d_b, joint_sq, sigma_s / unit)


# ---- clipped Gaussian sums composed (every Gaussian-sum release: DP-PG, DP-PPO, the LM, the dp_gd oracle) ----
COMPOSITIONS = ("gdp", "rdp")


@dataclass(frozen=True)
class SumsCalibration:
    """The noise of a round of clipped Gaussian sums (``gaussian_sums_calibration``).

    Attributes:
        noise_multiplier: the ledger's: z of the round's k releases at equal shares (one-pass, independent),
            1 / mu of the whole stream (correlated), or the round's subsampled multiplier (Poisson: the
            accountant's input).
        multipliers: {part: z_p}, part p's noise std per unit of one sum's sensitivity (2 C replace-one, C
            add/remove), before a correlated stream's sensitivity factor.
        mu: the round's guarantee in Gaussian DP (exact under ``gdp``), per user taking part in it.
    """

    noise_multiplier: float
    multipliers: dict
    mu: float
    eps: float = 0.0
    delta: float = 0.0
    whole_stream: frozenset = frozenset()

    def sigma(self, part, sensitivity: float, stream_factor: float = 1.0) -> float:
        """Part ``part``'s noise std for one sum of l2 sensitivity ``sensitivity``: z_p x sensitivity; a correlated
        part holding the whole budget (DP-PG's one stream) is the analytic Gaussian at the stream's sensitivity,
        sensitivity x ``stream_factor`` (= sqrt(B_p)), to the bit."""
        if part in self.whole_stream:
            return analytic_gaussian_sigma(self.eps, self.delta, sensitivity * stream_factor)
        return self.multipliers[part] * sensitivity


def gaussian_sums_calibration(eps: float, delta: float, parts: dict, *, composition: str = "gdp",
                              stream_bounds: dict | None = None, sample_rate: float | None = None,
                              rounds: int = 1, accountant: str = "rdp") -> SumsCalibration:
    """The one calibration of k adaptive Gaussian releases of clipped per-user sums per user and round
    (``dppo.privacy.composed`` derives the sensitivities and the composition; this computes the numbers).

    ``parts``: {part: (k_p, w_p)}, part p's k_p releases per user with a share w_p of the budget (shares sum to 1);
    k = sum_p k_p. Each release of part p carries N(0, (z_p Delta)^2 I), Delta its sum's sensitivity.

    * one-pass, independent noise, ``gdp`` (exact): z = sqrt(k) analytic_gaussian_sigma(eps, delta, 1), the
      smallest multiplier for which k adaptive (1/z)-GDP releases compose to (eps, delta) (Dong, Roth & Su 2019,
      Cor. 3.3; Balle & Wang 2018); ``rdp``: Opacus' RDP accountant at sample rate 1 over k steps (an upper bound).
      Part p: z_p = z sqrt(k_p / (k w_p)), so mu^2 = sum_p k_p / z_p^2 = k / z^2 (the same (eps, delta)).
    * one-pass, correlated noise (``stream_bounds``: {part: B_p}, a user's participation bound in part p's stream,
      ``dppo.privacy.factorizations.participation_norm_sq``): mu = 1 / analytic_gaussian_sigma(eps, delta, 1),
      z_p = sqrt(B_p / w_p) / mu, so sum_p B_p / z_p^2 = mu^2 (``gdp`` only).
    * Poisson (``sample_rate`` q, multi-pass, add/remove): the round is one subsampled Gaussian of multiplier
      z_round, the smallest meeting (eps, delta) after ``rounds`` rounds under ``accountant`` (rdp / prv);
      z = sqrt(k) z_round split between the parts as above.
    """
    if composition not in COMPOSITIONS:
        raise ConfigError(f"algo.accountant must be one of {COMPOSITIONS}, got {composition!r}")
    k = sum(int(kp) for kp, _ in parts.values())
    if k < 1:
        raise ConfigError(f"releases per user must be >= 1, got {k}")
    if stream_bounds is not None:
        if composition != "gdp" or sample_rate is not None:
            raise ConfigError("privacy.noise_correlation composes its one-pass stream in Gaussian DP: use "
                              "algo.accountant=gdp and privacy.multi_pass=false")
        mu = 1.0 / analytic_gaussian_sigma(eps, delta, 1.0)
        zs = {p: math.sqrt(stream_bounds[p] / w) / mu for p, (_, w) in parts.items()}
        return SumsCalibration(1.0 / mu, zs, math.sqrt(sum(stream_bounds[p] / zs[p] ** 2 for p in parts)), eps, delta,
                               frozenset(p for p, (_, w) in parts.items() if w == 1.0))
    from dppo.privacy.accountants.opacus import multi_pass_noise_multiplier

    if sample_rate is not None:
        ledger = multi_pass_noise_multiplier(eps, delta, float(sample_rate), int(rounds), accountant)
        z = math.sqrt(k) * ledger
    elif composition == "gdp":
        z = ledger = math.sqrt(k) * analytic_gaussian_sigma(eps, delta, 1.0)
    else:
        z = ledger = multi_pass_noise_multiplier(eps, delta, sample_rate=1.0, steps=k, accountant="rdp")
    multipliers = {p: z if w * k == kp else z * math.sqrt(kp / (k * w)) for p, (kp, w) in parts.items()}
    return SumsCalibration(ledger, multipliers, math.sqrt(sum(kp / multipliers[p] ** 2
                                                              for p, (kp, _) in parts.items())))


# ---- budget splits over composed releases (DP-GFA) ---------------------------------------------------------
def budget_schedule(accountant, eps: float, delta: float, releases: int, decay: float = 0.0) -> list[float]:
    """Per-release budgets ``eps_i = s i^{-decay}`` (i = 1..releases), s the largest scale whose composition
    under ``accountant`` is at most ``eps`` at ``delta``. ``decay = 0``: the equal split,
    ``accountant.largest_eps0``. Otherwise a copy of the accountant (as it is now: fresh at calibration time)
    is stepped with the trial schedule, so the composition rule is exactly the one that will account the
    real releases.
    """
    if releases < 1:
        raise ConfigError(f"need at least one release, got {releases}")
    if decay == 0:
        return [float(accountant.largest_eps0(eps, delta, releases, "exponential"))] * releases
    weights = [(i + 1) ** (-float(decay)) for i in range(releases)]

    def excess(scale: float) -> float:
        trial = copy.deepcopy(accountant)
        for i, w in enumerate(weights):
            trial.step({"mechanism": "exponential", "round": i + 1, "users": 0, "eps": scale * w, "delta": 0.0})
        return trial.spent(delta)[0] - eps

    hi = eps / weights[0]                                  # basic composition alone already reaches eps here
    scale = brentq(excess, 1e-12, hi, xtol=1e-14, rtol=1e-12) if excess(hi) > 0 else hi
    return [scale * w for w in weights]


class ExponentialSchedule:
    """The calibration of M composed exponential-mechanism releases (DP-GFA): release i = 1..M-1 gets
    eps_i (``budget_schedule``) and beta_i = eps_i / (2 Delta); release 0 sees no data (eps 0) and uses the
    first release's beta (it then weighs only the data-free optimism term).

    Attributes:
        eps: (eps_1, ..., eps_{M-1}); eps0 = eps_1; beta = exp_mech_beta(eps0, sensitivity).
    """

    def __init__(self, accountant, eps: float, delta: float, releases: int, decay: float, sensitivity: float):
        self.eps = budget_schedule(accountant, eps, delta, releases, decay)
        self.eps0 = self.eps[0]
        self.sensitivity = float(sensitivity)
        self.beta = exp_mech_beta(self.eps0, self.sensitivity)

    def budget(self, round_idx: int) -> tuple[float, float]:
        """(eps, beta) of the release at the start of round ``round_idx``
        (``beta_i = beta eps_i / eps_1 = eps_i / (2 Delta)``)."""
        if round_idx == 0:
            return 0.0, self.beta
        eps = self.eps[min(round_idx, len(self.eps)) - 1]
        return eps, self.beta * (eps / self.eps0)
