"""Sufficient-statistics perturbation (SSP): Gaussian noise on X^T X and X^T y, then a ridge solve.

[PO] Cor. 2 (low-dimensional log-linear DP-NPG); Wang 2018 "Revisiting differentially private
linear regression" for SSP itself.
"""
from __future__ import annotations

import math

import torch

from dppo.errors import ConfigError
from dppo.oracles.base import LeastSquaresOracle, UserRegression
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.mechanisms import noisy_clipped_sum, perturb_statistics


class SSPOracle(LeastSquaresOracle):
    """Release S~ = S + E and b~ = b + e, solve (PSD(S_bar) + ridge I) w = b~.

    Sensitivity (replace-one user, normalized units ||x|| <= 1, |y| <= 1): user i contributes
    S_i = (1/n_i) X_i^T X_i (n_i >= rows_i), PSD with trace <= 1, hence ||S_i||_F <= 1, so for a
    replaced user ||S_i - S_i'||_F^2 = ||S_i||_F^2 + ||S_i'||_F^2 - 2 tr(S_i S_i') <= 2
    (tr(AB) >= 0 for PSD A, B): Delta_S = sqrt(2) for the vector (diag S, sqrt(2) upper-offdiag S),
    whose norm is ||S||_F. The moment b_i = (1/n_i) X_i^T y_i has ||b_i|| <= 1 and is further clipped
    to ``b_clip`` (<= 1), so Delta_b = 2 b_clip.
    Calibration (exact, Gaussian DP): releasing S + N(0, sigma_S^2), b + N(0, sigma_b^2) is mu-GDP with
    mu^2 = sup over replaced users of ||dS||^2 / sigma_S^2 + ||db||^2 / sigma_b^2 (one Gaussian
    mechanism in whitened coordinates; Dong, Roth & Su 2019), and mu-GDP is (eps, delta)-DP iff
    mu <= 1 / analytic_gaussian_sigma(eps, delta, 1) (Balle & Wang 2018). ``gram_share`` fixes the
    ratio of the stds: with a = gram_share / Delta_S^2 and c = (1 - gram_share) / Delta_b^2 the
    separate bounds give mu^2 <= (2a + 4 b_clip^2 c) / t^2 = 1 / t^2 for stds (1/sqrt(a), 1/sqrt(c)) t.
    Joint bound, ``b_clip = 1`` (``joint_sensitivity_sq``): the sup is jointly tighter, because the two
    terms peak at different pairs. f = a ||dS||^2 + c ||db||^2 is jointly convex in the two users'
    (S_i, b_i), which range over the convex hull of single rows (x x^T, y x), ||x|| <= 1, |y| <= 1
    (weights 1/n_i sum to <= 1; 0 is a row with x = 0), so the sup is at single-row users; there,
    with u = x.x', f = a(|x|^4 + |x'|^4 - 2u^2) + c(y^2|x|^2 + y'^2|x'|^2 - 2yy'u), increasing in
    |x|^2, |x'|^2 and convex in (y, y'): the sup is at unit x, x', y = -y' sign(u):
    max_{0<=u<=1} 2a(1 - u^2) + 2c(1 + u) = 2a + 2c + c^2/(2a) (at u = c/(2a) <= 1), else 4c.
    With gram_share = 1/3 (sigma_S = sigma_b) that is the single Gaussian mechanism on (S, b) with
    Delta = sqrt(4.5), attained (x = e1, y = 1 vs x' = (1/2, sqrt3/2), y' = -1), not sqrt(6).
    (For b_clip < 1 the clipped b_i leave that hull, and the separate bounds are used.)
    The off-diagonal noise of S~ is N(0, sigma_S^2 / 2), mirrored so S~ is symmetric.

    Post-processing: ``gram_momentum`` beta > 0 solves with S_bar, the bias-corrected exponential
    average of the released S~ of this and earlier rounds (earlier rounds' users are disjoint and
    their S~ already released), which averages the noise down when m is small.
    With a ``public_gram`` (data-independent, e.g. the policy's Fisher matrix at public reference
    states) nothing is spent on S: b~ gets the whole budget, sigma_b = analytic(eps, delta, 2 b_clip).
    ``fisher_quadratic(w)`` returns w^T F_hat w from S_bar, a released quantity, so a learner may
    normalize its step by the KL divergence without touching the data again.

    Args:
        psd_floor: eigenvalues of S_bar are raised to at least this value (the PSD fix).
        ridge_noise: extra ridge added in private mode, in units of the expected spectral norm of
            the noise of S_bar, ``sigma_S sqrt(2 d)`` (times the EMA's noise reduction); 0 disables.
        b_clip: per-user clip of b_i (normalized units, <= 1).
        gram_share: fraction of the privacy budget (mu^2) spent on S.
        gram_momentum: beta of the average of released S~ across rounds (0: this round's only).
        (others: see LeastSquaresOracle)
    """

    name = "ssp"
    uses_public_gram = True   # a learner's public Gram (Fisher) replaces the released S~
    max_dim = 2048            # d x d statistics: larger spaces use dp_gd

    def __init__(self, *, psd_floor: float = 0.0, ridge_noise: float = 1.0, b_clip: float = 1.0,
                 gram_share: float = 1.0 / 3.0, gram_momentum: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if psd_floor < 0 or ridge_noise < 0:
            raise ConfigError("oracle ssp: psd_floor and ridge_noise must be >= 0")
        if not 0 < b_clip <= 1 or not 0 < gram_share < 1 or not 0 <= gram_momentum < 1:
            raise ConfigError("oracle ssp: need 0 < b_clip <= 1, 0 < gram_share < 1, 0 <= gram_momentum < 1")
        self.psd_floor, self.ridge_noise = float(psd_floor), float(ridge_noise)
        self.b_clip, self.gram_share, self.gram_momentum = float(b_clip), float(gram_share), float(gram_momentum)
        self.gram_sum: torch.Tensor | None = None
        self.gram_weight = 0.0
        self.gram_weight_sq = 0.0
        self.users_per_release = 1

    def sensitivities(self) -> tuple[float, float]:
        """(Delta_S, Delta_b) under replace-one, normalized units (each bound alone)."""
        return math.sqrt(2.0), 2.0 * self.b_clip

    def joint_sensitivity_sq(self) -> float:
        """sup over replaced users of a ||dS||^2 + c ||db||^2 for unit stds (1/sqrt(a), 1/sqrt(c)) (class doc)."""
        d_s, d_b = self.sensitivities()
        a, c = self.gram_share / d_s ** 2, (1.0 - self.gram_share) / d_b ** 2
        if self.b_clip < 1.0:
            return a * d_s ** 2 + c * d_b ** 2  # = 1: the separate bounds
        return 2 * a + 2 * c + c * c / (2 * a) if c <= 2 * a else 4 * c

    def noise_stds(self, eps: float, delta: float) -> tuple[float, float]:
        """(sigma_S, sigma_b) whose joint release is exactly (eps, delta)-DP at the joint sensitivity."""
        mu = 1.0 / analytic_gaussian_sigma(eps, delta, 1.0)
        d_s, d_b = self.sensitivities()
        t = math.sqrt(self.joint_sensitivity_sq()) / mu
        return t * d_s / math.sqrt(self.gram_share), t * d_b / math.sqrt(1.0 - self.gram_share)

    def joint_sensitivity(self, eps: float, delta: float) -> float:
        """The l2 sensitivity, in units of the Gram noise sigma_S, of the joint release (S~, b~): the Delta
        with sigma_S / Delta = 1 / mu, so the ledger's ``noise_multiplier`` = sigma / sensitivity is the
        multiplier of the equivalent single Gaussian mechanism (sqrt(4.5) at gram_share = 1/3)."""
        sigma_s, _ = self.noise_stds(eps, delta)
        return sigma_s / analytic_gaussian_sigma(eps, delta, 1.0)

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float) -> torch.Tensor:
        if getattr(self, "public_gram", None) is not None:
            return self._solve_public_gram(data, privacy, round, eps, delta)
        d = data.dim
        sigma_s, sigma_b = self.noise_stds(eps, delta)
        S = data.gram()
        b_users = self._clipped_moments(data)
        sens = self.joint_sensitivity(eps, delta)
        self.last_release = privacy.release("ssp", round=round, users=data.users, eps=eps, delta=delta,
                                            sigma=sigma_s, sensitivity=sens, noise_multiplier=sigma_s / sens,
                                            sigma_moment=sigma_b, sensitivity_gram=self.sensitivities()[0],
                                            sensitivity_moment=self.sensitivities()[1],
                                            joint_sensitivity_sq=self.joint_sensitivity_sq(), dim=d,
                                            adjacency="replace_one")
        S_noisy, b_noisy = perturb_statistics(privacy.noise, S, b_users.sum(0), sigma_s, sigma_b)
        S_bar, noise_scale = self._average(S_noisy)
        self.users_per_release = data.users
        ridge = self.ridge + self.ridge_noise * sigma_s * math.sqrt(2 * d) * noise_scale
        return psd_ridge_solve(S_bar, b_noisy, ridge, self.psd_floor)

    def _clipped_moments(self, data: UserRegression) -> torch.Tensor:
        b_users = data.per_user_moments()
        return b_users * torch.clamp(self.b_clip / b_users.norm(dim=1).clamp_min(1e-300), max=1.0)[:, None]

    def _solve_public_gram(self, data: UserRegression, privacy, round: int, eps: float, delta: float) -> torch.Tensor:
        """Public Gram (data-independent): the whole budget goes to b, sigma_b = analytic(eps, delta, 2 b_clip)."""
        sens = self.sensitivities()[1]
        sigma_b = analytic_gaussian_sigma(eps, delta, sens)
        self.last_release = privacy.release("ssp", round=round, users=data.users, eps=eps, delta=delta,
                                            sigma=sigma_b, sensitivity=sens, noise_multiplier=sigma_b / sens,
                                            sigma_moment=sigma_b, sensitivity_moment=sens, dim=data.dim,
                                            gram="public", adjacency="replace_one")
        b_noisy = noisy_clipped_sum(privacy.noise, self._clipped_moments(data), self.b_clip, sigma_b)
        return psd_ridge_solve(self.public_gram, b_noisy, self.ridge, self.psd_floor)

    def _average(self, S_noisy: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Bias-corrected EMA of released S~; returns it and its noise std relative to one release."""
        beta = self.gram_momentum
        if self.gram_sum is None or self.gram_sum.shape != S_noisy.shape or beta == 0:
            self.gram_sum, self.gram_weight, self.gram_weight_sq = S_noisy.clone(), 1.0, 1.0
        else:
            self.gram_sum = beta * self.gram_sum + S_noisy
            self.gram_weight = beta * self.gram_weight + 1.0
            self.gram_weight_sq = beta ** 2 * self.gram_weight_sq + 1.0
        return self.gram_sum / self.gram_weight, math.sqrt(self.gram_weight_sq) / self.gram_weight

    def fisher_quadratic(self, w: torch.Tensor) -> float | None:
        """w^T F_hat w with F_hat = x_bound^2 PSD(S_bar) / m (the released, averaged Gram), original units."""
        if self.gram_sum is None:
            return None
        S_bar = self.gram_sum / self.gram_weight
        evals, evecs = torch.linalg.eigh((S_bar + S_bar.T) / 2)
        proj = evecs.T @ w.to(torch.float64)
        return float((evals.clamp_min(0) * proj ** 2).sum()) * self.x_bound ** 2 / self.users_per_release

    def state_dict(self) -> dict:
        return {"gram_sum": None if self.gram_sum is None else self.gram_sum.clone(), "gram_weight": self.gram_weight,
                "gram_weight_sq": self.gram_weight_sq, "users_per_release": self.users_per_release}

    def load_state_dict(self, state: dict) -> None:
        self.gram_sum = None if state["gram_sum"] is None else state["gram_sum"].clone()
        self.gram_weight, self.gram_weight_sq = float(state["gram_weight"]), float(state["gram_weight_sq"])
        self.users_per_release = int(state["users_per_release"])


def psd_ridge_solve(S: torch.Tensor, b: torch.Tensor, ridge: float, floor: float = 0.0) -> torch.Tensor:
    """Solve (PSD(S) + ridge I) w = b, PSD(S) = S with eigenvalues raised to ``floor``.

    S (..., d, d) and b (..., d) may carry leading batch dimensions (independent solves).
    """
    evals, evecs = torch.linalg.eigh((S + S.mT) / 2)
    evals = evals.clamp_min(floor) + ridge
    if float(evals.min()) <= 0:
        evals = evals.clamp_min(1e-12)
    if S.dim() == 2 and b.dim() == 1:   # the learners' path, kept as it was so reference runs stay bit-exact
        return evecs @ ((evecs.T @ b) / evals)
    coef = (b.unsqueeze(-2) @ evecs).squeeze(-2) / evals
    return (evecs @ coef.unsqueeze(-1)).squeeze(-1)
