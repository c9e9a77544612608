"""Noisy projected gradient descent on the least-squares loss, per-user clipping ([PO] Cor. 3)."""
from __future__ import annotations

import torch

from dppo.errors import ConfigError
from dppo.oracles.base import LeastSquaresOracle, UserRegression, project_ball
from dppo.privacy.calibration import gaussian_sums_calibration
from dppo.privacy.composed import composed_sums


class DPGDOracle(LeastSquaresOracle):
    """k full-batch steps w <- Proj_R(w - lr (sum_i clip_C(grad L_i(w)) + N(0, s^2 I) + 2 ridge w) / m).

    Sensitivity of one step (replace-one user): the clipped per-user gradients have norm <= C, so
    replacing user i changes sum_i clip_C(g_i) by at most ||g_i - g_i'|| <= 2C: Delta = 2C. The k steps are
    adaptive Gaussian releases (step j reads w_{j-1}): a round of the one release of clipped per-user sums
    (``dppo.privacy.composed``: one part, k sums per user, ``accountant`` ``gdp``, exact, or ``rdp``), which clips
    the rows, checks the users and draws the noise, independent or correlated across rounds
    (``privacy.noise_correlation``); the projection and the step are post-processing.
    m (the number of users of the round) is public under replace-one adjacency.
    The ledger gets one entry per round (``dp_gd``) with the composed (eps, delta), k, z and s.

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
    gaussian_sums = True

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
        self._release = None

    def noise_std(self, eps: float, delta: float) -> tuple[float, float]:
        """(s, z): per-step noise std and noise multiplier z = s / Delta meeting (eps, delta) over k steps
        (independent noise; replace-one Delta = 2 C)."""
        z = gaussian_sums_calibration(eps, delta, {None: (self.steps, 1.0)}, composition=self.accountant).multipliers[None]
        return z * 2.0 * self.clip, z

    def release(self, privacy):
        """The run's release of this oracle's sums (one per privacy context: a correlated stream spans rounds)."""
        if self._release is None or self._release.privacy is not privacy:
            self._release = composed_sums(privacy, releases_per_user=self.steps, composition=self.accountant,
                                          mechanism="dp_gd", ledger={"steps": self.steps})
        return self._release

    def descend(self, data: UserRegression, privacy, round: int, ids, update, w: torch.Tensor):
        """The round's k steps w <- update(w, released noisy sum of the users' clipped gradients at w), the round
        opened (accounted) first for users ``ids``. Returns (the last w, the ledger entry)."""
        rel = self.release(privacy)
        entry = rel.open_round(round, ids, (self.clip,), dim=data.dim)
        for _ in range(self.steps):
            total, _ = rel.release_sum(data.per_user_grads(w), ids)
            w = update(w, total)
        return w, entry

    def step(self, data: UserRegression, w: torch.Tensor, noisy_sum: torch.Tensor) -> torch.Tensor:
        """One descent step from a released noisy sum of clipped per-user gradients (post-processing)."""
        return project_ball(w - self.lr * (noisy_sum + 2.0 * self.ridge * w) / data.users, self.radius)

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float,
                       ids=None) -> torch.Tensor:
        if (eps, delta) != (privacy.eps, privacy.delta):
            raise ConfigError(f"oracle dp_gd releases at the privacy context's (eps, delta) = ({privacy.eps}, "
                              f"{privacy.delta}), got ({eps}, {delta})")
        ids = list(range(data.users)) if ids is None else ids
        w, self.last_release = self.descend(data, privacy, round, ids, lambda w, total: self.step(data, w, total),
                                            torch.zeros(data.dim, dtype=torch.float64))
        return w
