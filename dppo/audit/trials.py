"""Running a mechanism many times cheaply: stacked noise draws, per-trial contexts, white-box taps."""
from __future__ import annotations

import contextlib
import importlib
from typing import Callable

import torch

from dppo.privacy.context import PrivacyContext
from dppo.privacy.noise import NoiseSource


class StackedNoise(NoiseSource):
    """A ``NoiseSource`` whose every draw of shape ``s`` returns ``trials`` independent draws, shape ``(trials, *s)``.

    The draws come from ``NoiseSource`` itself (same generator, same distributions), only stacked.
    For a mechanism whose output is ``f(data) + noise`` with ``f`` not touching the noise (DP-PG's
    ``(sum_i clip(g_i) + N(0, sigma^2 I)) / m``), broadcasting then yields ``trials`` independent
    outputs of the project's own code in one call.
    """

    def __init__(self, trials: int, seed: int = 0):
        super().__init__(seed)
        self.trials = int(trials)

    def gaussian(self, shape, sigma: float) -> torch.Tensor:
        return super().gaussian((self.trials, *tuple(shape)), sigma)

    def laplace(self, shape, scale: float) -> torch.Tensor:
        return super().laplace((self.trials, *tuple(shape)), scale)

    def gumbel(self, shape) -> torch.Tensor:
        return super().gumbel((self.trials, *tuple(shape)))


def trial_context(eps: float, delta: float, noise: NoiseSource) -> PrivacyContext:
    """A fresh one-pass PrivacyContext (parallel accountant) for a batch of audit trials.

    Giving each trial its own ``round`` makes ``spent()`` the eps of one release: the claim audited.
    """
    return PrivacyContext(eps, delta, noise=noise)


@contextlib.contextmanager
def tap(module: str, name: str, record: Callable[..., None]):
    """Temporarily wrap ``module.name`` so every call is passed to ``record(args, result)`` first.

    The wrapped function still runs and its result is returned unchanged: the mechanism's behaviour
    is untouched, the audit only reads intermediate releases (white-box).
    """
    mod = importlib.import_module(module)
    original = getattr(mod, name)

    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        record(args, out)
        return out

    setattr(mod, name, wrapper)
    try:
        yield
    finally:
        setattr(mod, name, original)
