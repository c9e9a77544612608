"""Noisy projected gradient descent on the least-squares loss, per-user clipping ([PO] Cor. 3)."""
from __future__ import annotations

import math

import torch

from dppo.errors import ConfigError
from dppo.oracles.base import LeastSquaresOracle, UserRegression, project_ball
from dppo.privacy.accountants.opacus import multi_pass_noise_multiplier
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.mechanisms import noisy_clipped_sum


class DPGDOracle(LeastSquaresOracle):
    """k full-batch steps w <- Proj_R(w - lr (sum_i clip_C(grad L_i(w)) + N(0, s^2 I) + 2 ridge w) / m).

    Sensitivity of one step (replace-one user): the clipped per-user gradients have norm <= C, so
    replacing user i changes sum_i clip_C(g_i) by at most ||g_i - g_i'|| <= 2C: Delta = 2C.
    Each step is the Gaussian mechanism with noise std s = z * Delta (noise multiplier z).
    The k steps are adaptive (step j reads w_{j-1}); their composition is calibrated by
        composition="gdp" (default, exact): a Gaussian mechanism with Delta / s = 1/z is (1/z)-GDP,
            k adaptive ones compose to exactly (sqrt(k)/z)-GDP (Dong, Roth & Su 2019, Cor. 3.3),
            whose (eps, delta) curve is the Gaussian mechanism's (Balle & Wang 2018), so
            s = analytic_gaussian_sigma(eps, delta, sqrt(k) * Delta);
        composition="rdp": Opacus' RDP accountant with sample_rate=1 (no subsampling, so the
            add/remove analysis of a sensitivity-1, noise-z mechanism is the replace-one analysis of
            our sensitivity-Delta, noise-z*Delta one): z = get_noise_multiplier(eps, delta, 1.0, k).
    m (the number of users of the round) is public under replace-one adjacency.
    The ledger gets one entry per round with the composed (eps, delta), k, z and s.

    Args:
        steps: k, gradient steps per round.
        lr: step size on the per-user-averaged loss (smoothness <= 2 in normalized units).
        clip: C, per-user gradient clip (None: 2 (radius + 1), the bound that makes clipping a no-op).
        radius: R, projection radius of w in normalized units (None: no projection).
        composition: "gdp" or "rdp".
        (others: see LeastSquaresOracle)
    """

    name = "dp_gd"

    def __init__(self, *, steps: int = 20, lr: float = 0.5, clip: float | None = None, radius: float | None = 10.0,
                 composition: str = "gdp", **kwargs):
        super().__init__(**kwargs)
        if steps < 1 or lr <= 0:
            raise ConfigError(f"oracle dp_gd: steps must be >= 1 and lr > 0, got steps={steps}, lr={lr}")
        if composition not in ("gdp", "rdp"):
            raise ConfigError(f"oracle dp_gd: composition must be 'gdp' or 'rdp', got {composition!r}")
        if clip is None and radius is None:
            raise ConfigError("oracle dp_gd: set clip or radius (the gradient bound needs one of them)")
        self.steps, self.lr, self.radius, self.composition = int(steps), float(lr), radius, composition
        self.clip = float(clip) if clip is not None else 2.0 * (float(radius) + 1.0)
        if not self.clip > 0:
            raise ConfigError(f"oracle dp_gd: clip must be > 0, got {clip}")

    def noise_std(self, eps: float, delta: float) -> tuple[float, float]:
        """(s, z): per-step noise std and noise multiplier z = s / Delta meeting (eps, delta) over k steps."""
        sens = 2.0 * self.clip
        if self.composition == "gdp":
            s = analytic_gaussian_sigma(eps, delta, math.sqrt(self.steps) * sens)
            return s, s / sens
        z = multi_pass_noise_multiplier(eps, delta, sample_rate=1.0, steps=self.steps, accountant="rdp")
        return z * sens, z

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float) -> torch.Tensor:
        s, z = self.noise_std(eps, delta)
        self.last_release = privacy.release("dp_gd", round=round, users=data.users, eps=eps, delta=delta,
                                            steps=self.steps, noise_multiplier=z, sigma=s, clip=self.clip,
                                            sensitivity=2.0 * self.clip, composition=self.composition, dim=data.dim,
                                            adjacency="replace_one")
        return self._descend(data, privacy.noise, s)

    def _descend(self, data: UserRegression, noise, sigma: float) -> torch.Tensor:
        w = torch.zeros(data.dim, dtype=torch.float64)
        m = data.users
        for _ in range(self.steps):
            total = noisy_clipped_sum(noise, data.per_user_grads(w), self.clip, sigma)  # stacked: (..., d)
            w = project_ball(w - self.lr * (total + 2.0 * self.ridge * w) / m, self.radius)
        return w
