"""Exponential mechanism over a finite cover W of the ball of radius w_max ([PO] Cor. 1, Lemma 2)."""
from __future__ import annotations

import itertools

import numpy as np
import torch

from dppo.errors import ConfigError
from dppo.oracles.base import LeastSquaresOracle, UserRegression
from dppo.privacy.mechanisms import exponential_mechanism


class ExpMechOracle(LeastSquaresOracle):
    """Sample w in W with P(w) ~ exp(beta * score(w)), score(w) = -(sum_i L_i(w) + ridge ||w||^2).

    Sensitivity (replace-one user, normalized units ||x|| <= 1, |y| <= 1, candidates ||w|| <= R
    with R = w_max * x_bound / y_bound): each residual obeys |x . w - y| <= R + 1, so
    L_i(w) = (1/n_i) sum_t (x_t . w - y_t)^2 lies in [0, (R + 1)^2] (n_i >= rows_i). Replacing one
    user changes the score of every w by at most Delta = (R + 1)^2; the ridge term is
    data-independent. beta = eps / (2 Delta) (``dppo.privacy.mechanisms.exponential_mechanism``) makes the
    sampler pure eps-DP (McSherry & Talwar 2007).
    Exact sampling by Gumbel-max: argmax_w beta * score(w) + G_w, G_w iid standard Gumbel.
    W is public: a grid (``cover="grid"``, ``grid_points`` per axis, for d <= 4) or ``candidates``
    points drawn uniformly from the ball with the oracle's seed (``cover="random"``), plus w = 0;
    it never depends on the data.

    Defaults: DP-NPG's bounds and ridge (as ssp), a ball of radius 2 covered by 4096 random points.

    Args:
        x_bound, y_bound, ridge: the regression's bounds and ridge (see LeastSquaresOracle).
        w_max: radius of the candidate ball, in the original units of w.
        candidates: size of the random cover.
        cover: "random" or "grid".
        grid_points: points per axis of the grid cover.
        (others: see LeastSquaresOracle)
    """

    name = "exp_mech"
    pure_dp = True            # the exponential mechanism: every release pure eps-DP
    max_dim = 2048            # a cover of a ball in R^d: useless (and large) beyond this

    def __init__(self, *, x_bound: float = 0.5, y_bound: float = 3.0, ridge: float = 0.4, w_max: float = 2.0,
                 candidates: int = 4096, cover: str = "random", grid_points: int = 21, **kwargs):
        super().__init__(x_bound=x_bound, y_bound=y_bound, ridge=ridge, **kwargs)
        if not w_max > 0 or candidates < 1 or grid_points < 2:
            raise ConfigError("oracle exp_mech: need w_max > 0, candidates >= 1, grid_points >= 2")
        if cover not in ("random", "grid"):
            raise ConfigError(f"oracle exp_mech: cover must be 'random' or 'grid', got {cover!r}")
        self.w_max, self.n_candidates, self.cover, self.grid_points = float(w_max), int(candidates), cover, int(grid_points)
        self._cache: dict[int, torch.Tensor] = {}

    @property
    def radius(self) -> float:
        """Candidate radius R in normalized units."""
        return self.w_max * self.x_bound / self.y_bound

    def sensitivity(self) -> float:
        """Delta = (R + 1)^2: the range of one user's loss over the candidate ball."""
        return (self.radius + 1.0) ** 2

    def candidate_set(self, dim: int) -> torch.Tensor:
        """The public cover W (K, d) in normalized units, seeded by the oracle's seed only."""
        if dim not in self._cache:
            if self.cover == "grid":
                if dim > 4:
                    raise ConfigError(f"oracle exp_mech: a grid cover in {dim} dimensions is too large; use cover=random")
                axis = np.linspace(-self.radius, self.radius, self.grid_points)
                pts = np.array(list(itertools.product(axis, repeat=dim)))
                pts = pts[np.linalg.norm(pts, axis=1) <= self.radius + 1e-12]
                W = torch.tensor(pts, dtype=torch.float64)
            else:
                gen = torch.Generator().manual_seed(self.seed + 104729)
                direc = torch.randn(self.n_candidates, dim, generator=gen, dtype=torch.float64)
                direc = direc / direc.norm(dim=1, keepdim=True).clamp_min(1e-300)
                r = torch.rand(self.n_candidates, 1, generator=gen, dtype=torch.float64) ** (1.0 / dim)
                W = torch.cat([torch.zeros(1, dim, dtype=torch.float64), direc * r * self.radius])
            self._cache[dim] = W
        return self._cache[dim]

    def score(self, data: UserRegression, W: torch.Tensor) -> torch.Tensor:
        """score(w) = -(sum_i L_i(w) + ridge ||w||^2) for every candidate (K,)."""
        return -(data.loss(W) + self.ridge * (W ** 2).sum(1))

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float,
                       ids=None) -> torch.Tensor:
        W = self.candidate_set(data.dim)
        idx, self.last_release = exponential_mechanism(privacy, self.score(data, W), eps=eps,
                                                       sensitivity=self.sensitivity(), round=round, users=data.users,
                                                       candidates=W.shape[0], dim=data.dim, oracle="exp_mech")
        return W[idx].clone()

