"""The policy protocol shared by every neural learner (so any ``nn.Module`` can be trained)."""
from __future__ import annotations

import torch
from torch import nn

# CPU matrix kernels round differently for very small batches (a GEMV path at 1 row, others below ~16
# rows): forward passes run on at least MIN_ROWS rows, so a row's result never depends on how many
# other rows share the batch (what keeps a user's data identical on any rank of a sharded run).
MIN_ROWS = 32


def pad_rows(x: torch.Tensor, rows: int = MIN_ROWS) -> torch.Tensor:
    """``x`` with copies of its first row appended up to ``rows`` rows (no-op when it has that many)."""
    if x.shape[0] >= rows or x.shape[0] == 0:
        return x
    return torch.cat([x, x[:1].expand(rows - x.shape[0], *x.shape[1:])])


class Policy(nn.Module):
    """A stochastic policy over discrete actions.

    Subclasses implement ``logits(obs)``; ``sample`` and ``log_prob`` follow. A user's own module
    only has to provide ``logits`` (or override ``sample``/``log_prob``) to be trainable by PG/NPG.
    """

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.logits(obs))

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, greedy: bool = False, generator: torch.Generator | None = None):
        """Actions and their log-probabilities for a batch of observations."""
        logits = self.logits(pad_rows(obs))[: obs.shape[0]]
        logp_all = torch.log_softmax(logits, dim=-1)
        if greedy:
            actions = logits.argmax(-1)
        else:
            u = torch.rand(logits.shape[0], 1, generator=generator, dtype=logp_all.dtype)
            cdf = logp_all.exp().cumsum(-1)
            actions = (cdf < u).sum(-1).clamp_max(logits.shape[-1] - 1)  # inverse-CDF sampling
        return actions, logp_all.gather(-1, actions[:, None]).squeeze(-1)

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(actions | obs), differentiable in the parameters."""
        return torch.log_softmax(self.logits(obs), dim=-1).gather(-1, actions.long()[..., None]).squeeze(-1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``forward`` is ``log_prob`` so that ``torch.func.functional_call`` can differentiate it per user."""
        return self.log_prob(obs, actions)
