"""An explicit epsilon-net of a linear class: ``f_w(sa) = clip(phi(sa)^T w, 0, V_max)``, w on a grid.

The infinite class ``F_lin = {clip(phi^T w, 0, V_max) : w in [lo, hi]^d}`` is covered by the grid
``W_g = {lo, lo + gamma, ..., hi}^d`` (g points per coordinate, step ``gamma = (hi - lo)/(g - 1)``):
every w of the box has a grid point w' with ``|w - w'|_inf <= gamma / 2``, hence for every pair sa

    |phi(sa)^T w - phi(sa)^T w'| <= (gamma / 2) ||phi(sa)||_1,

and clipping is 1-Lipschitz, so ``W_g`` is an L_inf cover of F_lin with radius
``covering_radius = (gamma / 2) max_sa ||phi(sa)||_1`` and |F| = g^d. The exponential mechanism over
the net pays this radius as an approximation error (GFA paper: the ``beta K`` term of a cover).
How far Q* is from the net itself (misspecification) is measured by ``distance_to``.
"""
from __future__ import annotations

import itertools

import torch

from dppo.errors import ConfigError
from dppo.function_classes.base import TensorClass


class LinearGridClass(TensorClass):
    """Grid (epsilon-net) of a clipped linear class over a finite domain.

    Args:
        features: ``phi`` as a ``[num_sa, d]`` tensor.
        grid: the g weight values per coordinate (uniformly spaced), e.g. ``torch.linspace(-1, 1, 5)``.
        value_max: values are clipped into [0, value_max].
    """

    def __init__(self, features: torch.Tensor, grid, value_max: float = 1.0):
        features = torch.as_tensor(features, dtype=torch.float32)
        grid = torch.as_tensor(list(grid), dtype=torch.float32)
        d, g = int(features.shape[1]), int(len(grid))
        if g < 1 or g ** d > 2_000_000:
            raise ConfigError(f"grid of {g} points in d={d} dimensions gives {g}^{d} members; keep it <= 2e6")
        steps = grid[1:] - grid[:-1] if g > 1 else torch.zeros(0)
        if g > 1 and not torch.allclose(steps, steps[0].expand_as(steps), atol=1e-6):
            raise ConfigError("the weight grid must be uniformly spaced (its covering radius assumes it)")
        self.features, self.grid = features, grid
        self.gamma = float(steps[0]) if g > 1 else 0.0
        self.weights = torch.tensor(list(itertools.product(grid.tolist(), repeat=d)), dtype=torch.float32)
        super().__init__(self.weights @ features.T, value_max)

    def covering_radius(self) -> float:
        """L_inf radius of the net over the box [grid.min, grid.max]^d: (gamma/2) max_sa ||phi(sa)||_1."""
        return 0.5 * self.gamma * float(self.features.abs().sum(1).max())

    def distance_to(self, q: torch.Tensor) -> tuple[float, int]:
        """(min over members of ||f - q||_inf, the argmin member): the class's misspecification for q."""
        dist = (self.table - torch.as_tensor(q, dtype=torch.float32)).abs().amax(1)
        i = int(dist.argmin())
        return float(dist[i]), i
