"""Action masks in a discrete policy: pi(a | s, m) = softmax over the admissible actions (m_a = 1) of the policy's
logits, 0 on the others (sb3-contrib's ``MaskableCategorical``).

The rollout engine stores an env's mask after each observation row (``dppo.envs.rollout``: A more columns, 1 where
the action is admissible, ``dppo.envs.masks`` for where masks come from), so every consumer of the stored rows
(the sampling at act time, the log-probabilities of the update, per-user gradients, the Fisher matrix, PPO's
ratios and entropy) reads the masked distribution through the one ``logits`` call. ``MaskedPolicy`` wraps any
discrete policy: its ``logits(rows)`` is the policy's ``logits`` of the observation columns, with the masked-out
actions set to ``MASKED_LOGIT`` (a finite value: exp underflows to exactly 0 and 0 * logit stays 0, so entropies and
gradients stay finite; the gradient of a masked-out logit is exactly 0). Rows without mask columns (a user's
``predict`` without ``action_masks``) pass unmasked. Its state dict is the wrapped policy's (``policy.pt`` is the
same file with or without masks).

Privacy: a mask is a function of the user's own current observation; it changes which of that user's actions are
possible and the log-probabilities of that user's own steps only (docs/privacy.md).
"""
from __future__ import annotations

import numpy as np
import torch

from dppo.errors import DataError
from dppo.policies.base import Policy, observation_rows

MASKED_LOGIT = -1e8


def split_rows(obs: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(observation columns, bool mask or None) of stored rows ``(..., width + A)`` (or ``(..., width)``)."""
    if obs.shape[-1] == width:
        return obs, None
    return obs[..., :width], obs[..., width:] > 0.5


class MaskedPolicy(Policy):
    """A discrete ``policy`` sampled and scored among the admissible actions (module docstring).

    Args:
        policy: any discrete policy (``logits(obs)``), dppo's or the user's own.
        obs_width: the stored width of one observation (``ObservationLayout.raw_dim``).
        n_actions: the number of actions (the mask's columns).
    """

    masked = True

    def __init__(self, policy: torch.nn.Module, obs_width: int, n_actions: int):
        super().__init__()
        self.policy = policy
        self.obs_width, self.n_actions = int(obs_width), int(n_actions)
        self.observation_shape = getattr(policy, "observation_shape", None)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        o, m = split_rows(obs, self.obs_width)
        z = self.policy.logits(o)
        return z if m is None else z.masked_fill(~m, MASKED_LOGIT)

    def mask_logits(self, obs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` computed from ``obs``'s observation columns, masked by its mask columns."""
        _, m = split_rows(obs, self.obs_width)
        return logits if m is None else logits.masked_fill(~m, MASKED_LOGIT)

    # the softmax head of the wrapped policy, for policy.subspace=head (``dppo.policies.spaces.HeadSubspace``)
    @property
    def head(self):
        return self.policy.head

    def body(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.body(split_rows(obs, self.obs_width)[0])

    def state_dict(self, *args, **kwargs):
        return self.policy.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.policy.load_state_dict(state_dict, strict=strict, assign=assign)

    def observation_rows(self, obs) -> tuple[torch.Tensor, bool]:
        """The wrapped policy's reading of ``obs`` (``dppo.policies.base.observation_rows``)."""
        inner = getattr(self.policy, "observation_rows", None)
        if callable(inner):
            return inner(obs)
        return observation_rows(obs, getattr(self.policy, "obs_layout", None), self.observation_shape)

    @torch.no_grad()
    def predict(self, obs, deterministic: bool = False, generator: torch.Generator | None = None,
                action_masks=None) -> np.ndarray:
        """``predict`` of one observation or a batch (``PredictMixin.predict``); with ``action_masks`` (A,) for one
        observation, (N, A) for a batch (1 / True: admissible), actions among the admissible ones only
        (sb3-contrib's ``MaskablePPO.predict(obs, action_masks=...)``); without, unmasked."""
        if action_masks is None:
            return super().predict(obs, deterministic=deterministic, generator=generator)
        x, single = self.observation_rows(obs)
        if x.shape[1] != self.obs_width:
            raise DataError(f"predict got observations of {x.shape[1]} values each; expected {self.obs_width}")
        m = np.asarray(action_masks)
        if m.size != x.shape[0] * self.n_actions:
            want = f"({self.n_actions},)" if single else f"({x.shape[0]}, {self.n_actions})"
            what = "one observation" if single else f"{x.shape[0]} observations"
            raise DataError(f"predict got action_masks of shape {m.shape} for {what}; expected {want}")
        m = torch.as_tensor(m.reshape(x.shape[0], self.n_actions).astype(np.float32) > 0.5)
        if not bool(m.any(1).all()):
            row = int((~m.any(1)).nonzero()[0])
            raise DataError(f"predict got an action mask with no admissible action (row {row})")
        actions, _ = self.sample(torch.cat([x, m.to(x.dtype)], dim=1), greedy=deterministic, generator=generator)
        out = actions.cpu().numpy()
        return out[0] if single else out


def wrap_for_env(policy, env):
    """``policy`` wrapped in ``MaskedPolicy`` when the env gives action masks (``env.mask_source``) and the policy
    picks discrete actions; else ``policy`` itself."""
    if policy is None or getattr(env, "mask_source", None) is None or isinstance(policy, MaskedPolicy):
        return policy
    if getattr(policy, "continuous", False) or getattr(policy, "multi_discrete", False) or \
            not callable(getattr(policy, "logits", None)):
        return policy
    from dppo.policies.observations import ObservationLayout

    return MaskedPolicy(policy, ObservationLayout(env.observation_space).raw_dim, int(env.action_space.n))
