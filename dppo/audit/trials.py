"""Running a mechanism many times cheaply: stacked noise draws and per-trial privacy contexts."""
from __future__ import annotations

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

    Giving each trial its own ``round`` makes ``spent()`` the eps of one release: the claim audited. Every trial
    runs the same neighbouring pair of users, so the one-pass rule is off (``check_users=False``): what is audited
    is one round's mechanism, whose users the rule would otherwise refuse in the next trial's round.
    """
    return PrivacyContext(eps, delta, noise=noise, check_users=False)
