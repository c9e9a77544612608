"""Sufficient-statistics perturbation (SSP): Gaussian noise on X^T X and X^T y, then a ridge solve.

[PO] Cor. 2 (low-dimensional log-linear DP-NPG); Wang 2018 "Revisiting differentially private
linear regression" for SSP itself. The release (its sensitivity, calibration and noise) is
``dppo.privacy.mechanisms.ssp_release``; this oracle forms the statistics and solves with the released ones.
"""
from __future__ import annotations

import math

import torch

from dppo.errors import ConfigError
from dppo.oracles.base import LeastSquaresOracle, UserRegression
from dppo.privacy.mechanisms import ssp_release


class SSPOracle(LeastSquaresOracle):
    """Release S~ = S + E and b~ = b + e (``ssp_release``), solve (PSD(S_bar) + ridge I) w = b~.

    The statistics, normalized units (rows clipped to ``x_bound``, targets to ``y_bound``, by ``prepare``):
    S = sum_i (1/n_i) X_i^T X_i and b = sum_i clip(b_i, b_clip), b_i = (1/n_i) X_i^T y_i; a replaced user
    moves (S, b) by at most sqrt(4.5) in the released coordinates at ``gram_share = 1/3``, ``b_clip = 1``
    (the joint bound, proved in ``dppo.privacy.calibration.ssp_calibration``).

    Post-processing: ``gram_momentum`` beta > 0 solves with S_bar, the bias-corrected exponential
    average of the released S~ of this and earlier rounds (earlier rounds' users are disjoint and
    their S~ already released), which averages the noise down when m is small.
    With a ``public_gram`` (data-independent, e.g. the policy's Fisher matrix at public reference
    states) nothing is spent on S: b~ gets the whole budget. ``gram_share``, ``ridge_noise`` and
    ``gram_momentum`` shape the released Gram matrix and do nothing then (``PUBLIC_GRAM_IGNORES``).

    Defaults: DP-NPG's (selected on CartPole, seeds 100-102: ridge 0.4 from {0.04, 0.4, 1.0}, b_clip 0.003 for
    group-baselined moments; conf/experiment/cartpole_dp_npg.yaml).

    Args:
        x_bound, y_bound: the rows' bounds (NPG's compatible features and standardized advantages).
        ridge: ridge coefficient (normalized units).
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
    PUBLIC_GRAM_IGNORES = ("gram_share", "ridge_noise", "gram_momentum")
    max_dim = 2048            # d x d statistics: larger spaces use dp_gd

    def __init__(self, *, x_bound: float = 0.5, y_bound: float = 3.0, ridge: float = 0.4, psd_floor: float = 0.0,
                 ridge_noise: float = 1.0, b_clip: float = 0.003, gram_share: float = 1.0 / 3.0,
                 gram_momentum: float = 0.0, **kwargs):
        super().__init__(x_bound=x_bound, y_bound=y_bound, ridge=ridge, **kwargs)
        if psd_floor < 0 or ridge_noise < 0:
            raise ConfigError("oracle ssp: psd_floor and ridge_noise must be >= 0")
        if not 0 < b_clip <= 1 or not 0 < gram_share < 1 or not 0 <= gram_momentum < 1:
            raise ConfigError("oracle ssp: need 0 < b_clip <= 1, 0 < gram_share < 1, 0 <= gram_momentum < 1")
        self.psd_floor, self.ridge_noise = float(psd_floor), float(ridge_noise)
        self.b_clip, self.gram_share, self.gram_momentum = float(b_clip), float(gram_share), float(gram_momentum)
        self.gram_sum: torch.Tensor | None = None
        self.gram_weight = 0.0
        self.gram_weight_sq = 0.0

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float,
                       ids=None) -> torch.Tensor:
        public = getattr(self, "public_gram", None) is not None
        S_noisy, b_noisy, self.last_release = ssp_release(
            privacy, None if public else data.gram(), data.per_user_moments(), round=round, eps=eps, delta=delta,
            gram_share=self.gram_share, b_clip=self.b_clip, public_gram=public)
        if public:
            return psd_ridge_solve(self.public_gram, b_noisy, self.ridge, self.psd_floor)
        S_bar, noise_scale = self._average(S_noisy)
        ridge = self.ridge + self.ridge_noise * self.last_release["sigma"] * math.sqrt(2 * data.dim) * noise_scale
        return psd_ridge_solve(S_bar, b_noisy, ridge, self.psd_floor)

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

    def state_dict(self) -> dict:
        return {"gram_sum": None if self.gram_sum is None else self.gram_sum.clone(), "gram_weight": self.gram_weight,
                "gram_weight_sq": self.gram_weight_sq}

    def load_state_dict(self, state: dict) -> None:
        self.gram_sum = None if state["gram_sum"] is None else state["gram_sum"].clone()
        self.gram_weight, self.gram_weight_sq = float(state["gram_weight"]), float(state["gram_weight_sq"])


def psd_ridge_solve(S: torch.Tensor, b: torch.Tensor, ridge: float, floor: float = 0.0) -> torch.Tensor:
    """Solve (PSD(S) + ridge I) w = b, PSD(S) = S with eigenvalues raised to ``floor``."""
    evals, evecs = torch.linalg.eigh((S + S.T) / 2)
    evals = evals.clamp_min(floor) + ridge
    if float(evals.min()) <= 0:
        evals = evals.clamp_min(1e-12)
    return evecs @ ((evecs.T @ b) / evals)
