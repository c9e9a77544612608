"""Noise sources: the OS CSPRNG (unpredictable, the default of every run) or a seeded generator.

Secure mode (``secure=True``) reads uniform bits from the operating system's CSPRNG (``os.urandom``,
the source ``secrets`` uses) and maps them through float64 inverse CDFs: each uniform is
``(k + 1/2) / 2^53`` for a 53-bit integer ``k``, so it lies strictly inside (0, 1) and every
transform below is finite; Gaussians use both Box-Muller outputs of each pair of uniforms. There is
no seed and no state: nothing in a config, a summary or a checkpoint lets anyone regenerate the noise.

Seeded mode (``secure=False``, ``privacy.secure_rng=false``) uses a torch generator seeded with
``seed + 7919``: reproducible (the reference tables and tests rely on it), but anyone who knows the
seed (it is in the public config) can regenerate and subtract the noise, so the guarantee does not
hold against them. Its state is saved in checkpoints, which are secret files of the run directory.
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch

SEED_OFFSET = 7919
PIECE = 1 << 20      # a release larger than a counter's chunk draws its noise this many values at a time (transients)
_TWO_53 = float(1 << 53)


class NoiseSource:
    """Draws Gaussian, Laplace, Gumbel and uniform noise for every private release (float64)."""

    def __init__(self, seed: int = 0, secure: bool = False):
        self.secure = bool(secure)
        self.generator = None if self.secure else torch.Generator().manual_seed(int(seed) + SEED_OFFSET)

    @classmethod
    def os_csprng(cls) -> "NoiseSource":
        """The unpredictable source (no seed, no state)."""
        return cls(secure=True)

    @property
    def label(self) -> str:
        """``os_csprng`` or ``seeded`` (written to ``summary.json`` as ``noise_source``)."""
        return "os_csprng" if self.secure else "seeded"

    def _secure_uniform(self, n: int) -> torch.Tensor:
        """n iid U(0, 1) float64 from the OS CSPRNG: (53 random bits + 1/2) / 2^53, never 0 or 1."""
        raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
        u = raw.astype(np.float64)
        u += 0.5
        u /= _TWO_53
        return torch.from_numpy(u)

    def uniform(self, shape) -> torch.Tensor:
        """U(0, 1) of the given shape (float64, strictly inside (0, 1))."""
        shape = tuple(shape)
        n = math.prod(shape) if len(shape) else 1
        if self.secure:
            u = self._secure_uniform(n)
        else:
            u = torch.rand(n, generator=self.generator, dtype=torch.float64)
            u = u.clamp_min(1e-300)
        return u.reshape(shape)

    def gaussian(self, shape, sigma: float) -> torch.Tensor:
        """N(0, sigma^2) of the given shape (float64)."""
        shape = tuple(shape)
        if not self.secure:
            return torch.randn(shape, generator=self.generator, dtype=torch.float64) * sigma
        n = math.prod(shape) if len(shape) else 1
        pairs = (n + 1) // 2
        u = self._secure_uniform(2 * pairs)
        r = torch.sqrt(-2.0 * torch.log(u[:pairs]))          # Box-Muller, both outputs of each pair
        theta = (2.0 * math.pi) * u[pairs:]
        z = torch.cat([r * torch.cos(theta), r * torch.sin(theta)])[:n]
        return z.reshape(shape) * sigma

    def laplace(self, shape, scale: float) -> torch.Tensor:
        """Laplace(0, scale) of the given shape (float64)."""
        u = self.uniform(tuple(shape)) - 0.5
        return -scale * torch.sign(u) * torch.log1p(-2 * u.abs().clamp_max(0.5 - 1e-17))

    def gumbel(self, shape) -> torch.Tensor:
        """Standard Gumbel noise, for exact exponential-mechanism sampling by Gumbel-max."""
        return -torch.log(-torch.log(self.uniform(tuple(shape))))

    def state_dict(self) -> dict:
        """Seeded mode: the generator state (checkpoints only, which are secret). Secure mode: nothing."""
        if self.secure:
            return {"secure": True}
        return {"secure": False, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if not self.secure and state.get("generator") is not None:
            self.generator.set_state(state["generator"])
