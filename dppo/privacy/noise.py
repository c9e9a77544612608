"""Noise sources: a seeded torch generator (reproducible) or a cryptographically secure one."""
from __future__ import annotations

import math
import secrets

import torch


class NoiseSource:
    """Draws Gaussian, Laplace and Gumbel noise for every private release.

    ``secure=True`` draws uniform bits from the OS CSPRNG (``secrets``) and maps them through
    inverse CDFs in float64: roughly 10-50x slower than torch's generator, but unpredictable.
    Seeded mode is reproducible and its state is checkpointed.
    """

    def __init__(self, seed: int = 0, secure: bool = False):
        self.secure = bool(secure)
        self.generator = torch.Generator().manual_seed(int(seed) + 7919)

    def _uniform(self, shape) -> torch.Tensor:
        n = math.prod(shape) if len(shape) else 1
        if self.secure:
            raw = torch.frombuffer(bytearray(secrets.token_bytes(8 * n)), dtype=torch.int64)
            u = (((raw >> 11) & ((1 << 53) - 1)).to(torch.float64) + 0.5) / float(1 << 53)
        else:
            u = torch.rand(n, generator=self.generator, dtype=torch.float64)
            u = u.clamp_min(1e-300)
        return u.reshape(shape)

    def gaussian(self, shape, sigma: float) -> torch.Tensor:
        """N(0, sigma^2) of the given shape (float64)."""
        shape = tuple(shape)
        if self.secure:
            u1, u2 = self._uniform(shape), self._uniform(shape)
            z = torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * math.pi * u2)
        else:
            z = torch.randn(shape, generator=self.generator, dtype=torch.float64)
        return z * sigma

    def laplace(self, shape, scale: float) -> torch.Tensor:
        """Laplace(0, scale) of the given shape (float64)."""
        u = self._uniform(tuple(shape)) - 0.5
        return -scale * torch.sign(u) * torch.log1p(-2 * u.abs().clamp_max(0.5 - 1e-17))

    def gumbel(self, shape) -> torch.Tensor:
        """Standard Gumbel noise, for exact exponential-mechanism sampling by Gumbel-max."""
        return -torch.log(-torch.log(self._uniform(tuple(shape))))

    def state_dict(self) -> dict:
        return {"secure": self.secure, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
