"""The policy protocol shared by every neural learner (so any ``nn.Module`` can be trained).

A policy maps a batch of observations to a distribution over actions and provides
``sample(obs, greedy, generator) -> (actions, log_probs)`` and ``log_prob(obs, actions)`` (differentiable);
``forward(obs, actions)`` is ``log_prob`` so that per-user gradients work through ``torch.func``.
Continuous-action policies (``GaussianMLPPolicy``) also provide ``env_action(actions)``: the learner stores and
scores the distribution's sample, the environment receives ``env_action`` of it (squashed or clipped to the Box).
``predict`` is the everyday entry point (numpy in, numpy out, single or batched observations, as in SB3).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dppo.errors import DataError
# CPU matrix kernels round differently for very small batches (a GEMV path at 1 row, others below ~16
# rows): forward passes run on at least MIN_ROWS rows, so a row's result never depends on how many
# other rows share the batch (what keeps a user's data identical on any rank of a sharded run).
MIN_ROWS = 32


def pad_rows(x: torch.Tensor, rows: int = MIN_ROWS) -> torch.Tensor:
    """``x`` with copies of its first row appended up to ``rows`` rows (no-op when it has that many)."""
    if x.shape[0] >= rows or x.shape[0] == 0:
        return x
    return torch.cat([x, x[:1].expand(rows - x.shape[0], *x.shape[1:])])



class PredictMixin:
    """``predict(obs, deterministic=False)`` for any policy implementing ``sample`` (and ``env_action``)."""

    observation_shape: tuple | None = None  # set by the constructor; tells a single observation from a batch

    @torch.no_grad()
    def predict(self, obs, deterministic: bool = False, generator: torch.Generator | None = None) -> np.ndarray:
        """Actions for one observation (shape ``observation_shape``) or a batch (``(N, *observation_shape)``).

        Returns numpy actions as the environment takes them: an int (array of ints) for Discrete spaces, a float
        vector (matrix) inside the Box for continuous ones. ``deterministic=True`` takes the mode (argmax / the
        Gaussian mean); otherwise actions are sampled (from ``generator`` if given). Unlike SB3 there is no
        recurrent state, so the return value is the actions only.
        """
        x = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        shape = tuple(self.observation_shape) if self.observation_shape is not None else None
        if shape is None:
            single = x.dim() == 1
        elif tuple(x.shape) == shape:
            single = True
        elif tuple(x.shape[1:]) == shape:
            single = False
        else:
            raise DataError(f"predict got an observation of shape {tuple(x.shape)}; expected {shape} or (N, *{shape})")
        batch = x[None] if single else x
        actions, _ = self.sample(batch, greedy=deterministic, generator=generator)
        env_actions = self.env_action(actions) if hasattr(self, "env_action") else actions
        out = env_actions.detach().cpu().numpy()
        return out[0] if single else out


class Policy(PredictMixin, nn.Module):
    """A stochastic policy over discrete actions.

    Subclasses implement ``logits(obs)``; ``sample`` and ``log_prob`` follow. A user's own module
    only has to provide ``logits`` (or override ``sample``/``log_prob``) to be trainable by PG/NPG.
    """

    continuous = False

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
