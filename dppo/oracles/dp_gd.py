"""Noisy projected gradient descent on the least-squares loss, per-user clipping ([PO] Cor. 3)."""
from __future__ import annotations

import torch

from dppo.errors import ConfigError
from dppo.oracles.base import LeastSquaresOracle, UserRegression, project_ball
from dppo.privacy.calibration import noisy_gd_sigma
from dppo.privacy.mechanisms import noisy_gradient_descent


class DPGDOracle(LeastSquaresOracle):
    """k full-batch steps w <- Proj_R(w - lr (sum_i clip_C(grad L_i(w)) + N(0, s^2 I) + 2 ridge w) / m).

    Sensitivity of one step (replace-one user): the clipped per-user gradients have norm <= C, so
    replacing user i changes sum_i clip_C(g_i) by at most ||g_i - g_i'|| <= 2C: Delta = 2C. The k steps are
    adaptive Gaussian releases (step j reads w_{j-1}), released, calibrated and composed by
    ``dppo.privacy.mechanisms.noisy_gradient_descent`` (``accountant``: ``gdp``, exact, or ``rdp``; see
    ``dppo.privacy.calibration.noisy_gd_sigma``); the projection and the step are post-processing.
    m (the number of users of the round) is public under replace-one adjacency.
    The ledger gets one entry per round with the composed (eps, delta), k, z and s.

    Defaults: DP-REBEL's (one step from w = 0, no projection, clip 0.1; the rows' bounds 1).

    Args:
        x_bound, y_bound, ridge: the regression's bounds and ridge (see LeastSquaresOracle).
        steps: k, gradient steps per round.
        lr: step size on the per-user-averaged loss (smoothness <= 2 in normalized units).
        clip: C, per-user gradient clip (None: 2 (radius + 1), the bound that makes clipping a no-op).
        radius: R, projection radius of w in normalized units (None: no projection).
        accountant: how the k steps compose, "gdp" (exact Gaussian DP) or "rdp" (``oracle.accountant``).
        composition: the former name of ``accountant`` (deprecated; the next release drops it).
        (others: see LeastSquaresOracle)
    """

    name = "dp_gd"

    def __init__(self, *, x_bound: float = 1.0, y_bound: float = 1.0, ridge: float = 0.0, steps: int = 1,
                 lr: float = 0.5, clip: float | None = 0.1, radius: float | None = None, accountant: str = "gdp",
                 composition: str | None = None, **kwargs):
        super().__init__(x_bound=x_bound, y_bound=y_bound, ridge=ridge, **kwargs)
        if steps < 1 or lr <= 0:
            raise ConfigError(f"oracle dp_gd: steps must be >= 1 and lr > 0, got steps={steps}, lr={lr}")
        if composition is not None:   # the deprecated name (the builder says so in one line)
            if accountant not in ("gdp", composition):
                raise ConfigError(f"oracle dp_gd: accountant={accountant} and the deprecated composition={composition} "
                                  f"disagree; set accountant only")
            accountant = composition
        if accountant not in ("gdp", "rdp"):
            raise ConfigError(f"oracle dp_gd: accountant must be 'gdp' or 'rdp', got {accountant!r}")
        if clip is None and radius is None:
            raise ConfigError("oracle dp_gd: set clip or radius (the gradient bound needs one of them)")
        self.steps, self.lr, self.radius, self.accountant = int(steps), float(lr), radius, accountant
        self.clip = float(clip) if clip is not None else 2.0 * (float(radius) + 1.0)
        if not self.clip > 0:
            raise ConfigError(f"oracle dp_gd: clip must be > 0, got {clip}")

    def noise_std(self, eps: float, delta: float) -> tuple[float, float]:
        """(s, z): per-step noise std and noise multiplier z = s / Delta meeting (eps, delta) over k steps."""
        return noisy_gd_sigma(eps, delta, steps=self.steps, clip=self.clip, composition=self.accountant)

    def step(self, data: UserRegression, w: torch.Tensor, noisy_sum: torch.Tensor) -> torch.Tensor:
        """One descent step from a released noisy sum of clipped per-user gradients (post-processing)."""
        return project_ball(w - self.lr * (noisy_sum + 2.0 * self.ridge * w) / data.users, self.radius)

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float) -> torch.Tensor:
        w, self.last_release = noisy_gradient_descent(
            privacy, data.per_user_grads, lambda w, total: self.step(data, w, total),
            torch.zeros(data.dim, dtype=torch.float64), steps=self.steps, clip=self.clip, round=round,
            users=data.users, eps=eps, delta=delta, composition=self.accountant, dim=data.dim)
        return w
