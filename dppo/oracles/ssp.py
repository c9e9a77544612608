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


class SSPOracle(LeastSquaresOracle):
    """Release S~ = S + E and b~ = b + e, solve (PSD(S_bar) + ridge I) w = b~.

    Sensitivity (replace-one user, normalized units ||x|| <= 1, |y| <= 1): user i contributes
    S_i = (1/n_i) X_i^T X_i (n_i >= rows_i), PSD with trace <= 1, hence ||S_i||_F <= 1, so for a
    replaced user ||S_i - S_i'||_F^2 = ||S_i||_F^2 + ||S_i'||_F^2 - 2 tr(S_i S_i') <= 2
    (tr(AB) >= 0 for PSD A, B): Delta_S = sqrt(2) for the vector (diag S, sqrt(2) upper-offdiag S),
    whose norm is ||S||_F. The moment b_i = (1/n_i) X_i^T y_i has ||b_i|| <= 1 and is further clipped
    to ``b_clip`` (<= 1), so Delta_b = 2 b_clip.
    Calibration (exact, Gaussian DP): the two Gaussian releases with noise sigma_S, sigma_b are
    mu_S = Delta_S/sigma_S and mu_b = Delta_b/sigma_b -GDP; together sqrt(mu_S^2 + mu_b^2)-GDP
    (Dong, Roth & Su 2019, Cor. 3.3), which is (eps, delta)-DP iff it is at most
    mu = 1 / analytic_gaussian_sigma(eps, delta, 1) (Balle & Wang 2018). ``gram_share`` is the
    fraction of mu^2 given to S: mu_S^2 = gram_share mu^2, mu_b^2 = (1 - gram_share) mu^2.
    (gram_share = 1/3, b_clip = 1 is the single Gaussian mechanism on (S, b) with Delta = sqrt(6).)
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
        """(Delta_S, Delta_b) under replace-one, normalized units."""
        return math.sqrt(2.0), 2.0 * self.b_clip

    def noise_stds(self, eps: float, delta: float) -> tuple[float, float]:
        """(sigma_S, sigma_b) whose composition is exactly (eps, delta)-DP (mu-GDP split by gram_share)."""
        mu = 1.0 / analytic_gaussian_sigma(eps, delta, 1.0)
        d_s, d_b = self.sensitivities()
        return d_s / (math.sqrt(self.gram_share) * mu), d_b / (math.sqrt(1 - self.gram_share) * mu)

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float) -> torch.Tensor:
        if getattr(self, "public_gram", None) is not None:
            return self._solve_public_gram(data, privacy, round, eps, delta)
        d = data.dim
        sigma_s, sigma_b = self.noise_stds(eps, delta)
        S = data.gram()
        b_users = self._clipped_moments(data)
        self.last_release = privacy.release("ssp", round=round, users=data.users, eps=eps, delta=delta,
                                            sigma=sigma_s, sigma_moment=sigma_b, sensitivity=self.sensitivities()[0],
                                            sensitivity_moment=self.sensitivities()[1], dim=d)
        noise = privacy.noise.gaussian((d, d), sigma_s)
        upper = torch.triu(noise, diagonal=1) / math.sqrt(2.0)
        S_noisy = S + torch.diag(torch.diagonal(noise)) + upper + upper.T
        b_noisy = b_users.sum(0) + privacy.noise.gaussian((d,), sigma_b)
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
                                            sigma_moment=sigma_b, sensitivity_moment=sens, dim=data.dim,
                                            gram="public")
        b_noisy = self._clipped_moments(data).sum(0) + privacy.noise.gaussian((data.dim,), sigma_b)
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
    """Solve (PSD(S) + ridge I) w = b, PSD(S) = S with eigenvalues raised to ``floor``."""
    evals, evecs = torch.linalg.eigh((S + S.T) / 2)
    evals = evals.clamp_min(floor) + ridge
    if float(evals.min()) <= 0:
        evals = evals.clamp_min(1e-12)
    return evecs @ ((evecs.T @ b) / evals)
