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
    """Release S~ = S + E and b~ = b + e with one Gaussian mechanism, solve (PSD(S~) + ridge I) w = b~.

    Sensitivity (replace-one user, normalized units ||x|| <= 1, |y| <= 1): user i contributes
    S_i = (1/n_i) X_i^T X_i and b_i = (1/n_i) X_i^T y_i with n_i >= rows_i, so S_i is PSD with
    trace <= 1, hence ||S_i||_F <= 1, and ||b_i||_2 <= 1. For a replaced user (S_i', b_i'):
        ||S_i - S_i'||_F^2 = ||S_i||_F^2 + ||S_i'||_F^2 - 2 tr(S_i S_i') <= 2   (tr(AB) >= 0 for PSD A, B),
        ||b_i - b_i'||_2^2 <= (||b_i|| + ||b_i'||)^2 <= 4.
    The released vector v = (diag S, sqrt(2) * upper-off-diagonal S, b) has ||v||^2 = ||S||_F^2 + ||b||^2,
    so its l2-sensitivity is Delta = sqrt(2 + 4) = sqrt(6). Adding N(0, sigma^2 I) to v with
    sigma = analytic_gaussian_sigma(eps, delta, Delta) is (eps, delta)-DP (Balle & Wang 2018); the
    off-diagonal noise of S~ is then N(0, sigma^2 / 2), mirrored so S~ stays symmetric. The solve
    is post-processing.

    Args:
        psd_floor: eigenvalues of S~ are raised to at least this value (the PSD fix).
        ridge_noise: extra ridge added in private mode, in units of the noise's expected spectral
            norm ``sigma * sqrt(2 d)`` (0 disables); stabilizes the solve when the noise dominates.
        (others: see LeastSquaresOracle)
    """

    name = "ssp"

    def __init__(self, *, psd_floor: float = 0.0, ridge_noise: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        if psd_floor < 0 or ridge_noise < 0:
            raise ConfigError("oracle ssp: psd_floor and ridge_noise must be >= 0")
        self.psd_floor, self.ridge_noise = float(psd_floor), float(ridge_noise)

    @staticmethod
    def sensitivity() -> float:
        """l2-sensitivity of (diag S, sqrt2 offdiag S, b) under replace-one, normalized units."""
        return math.sqrt(6.0)

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float) -> torch.Tensor:
        d = data.dim
        sens = self.sensitivity()
        sigma = analytic_gaussian_sigma(eps, delta, sens)
        ridge = self.ridge + self.ridge_noise * sigma * math.sqrt(2 * d)
        self.last_release = privacy.release("ssp", round=round, users=data.users, eps=eps, delta=delta,
                                            sigma=sigma, sensitivity=sens, dim=d, ridge=ridge)
        S, b = data.gram(), data.moment()
        noise = privacy.noise.gaussian((d, d), sigma)
        upper = torch.triu(noise, diagonal=1) / math.sqrt(2.0)
        S_noisy = S + torch.diag(torch.diagonal(noise)) + upper + upper.T
        b_noisy = b + privacy.noise.gaussian((d,), sigma)
        return psd_ridge_solve(S_noisy, b_noisy, ridge, self.psd_floor)


def psd_ridge_solve(S: torch.Tensor, b: torch.Tensor, ridge: float, floor: float = 0.0) -> torch.Tensor:
    """Solve (PSD(S) + ridge I) w = b, PSD(S) = S with eigenvalues raised to ``floor``."""
    evals, evecs = torch.linalg.eigh((S + S.T) / 2)
    evals = evals.clamp_min(floor) + ridge
    if float(evals.min()) <= 0:
        evals = evals.clamp_min(1e-12)
    return evecs @ ((evecs.T @ b) / evals)
