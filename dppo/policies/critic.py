"""A state-value network for actor-critic learners (DP-PPO's critic).

``ValueMLP(s)`` predicts V(s) / value_scale, where ``value_scale`` is a public constant chosen by the learner
(e.g. reward_bound / (1 - gamma), the largest possible |return|), so the regression targets stay O(1)
without any statistic of users' data. ``forward(obs, actions)`` ignores the actions and returns the
per-row output, so the per-user-gradient engine (which differentiates sum_r w_r forward(obs_r, a_r))
computes the critic's per-user gradients with the same call as the policy's.
"""
from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from dppo.policies.observations import ObservationLayout, mlp_body



class ValueMLP(nn.Module):
    """V(s) / value_scale = MLP(s), a scalar per observation.

    Args:
        observation_space: any space ``dppo.policies.observations`` reads (a Box is flattened).
        hidden_sizes: widths of the hidden layers ([] = linear in the observation).
        activation: ``tanh`` or ``relu``.
        normalize_obs: scale the bounded observation coordinates onto [-1, 1] by the space's public bounds
            first (``dppo.policies.mlp.BoundsScaling``).
    """

    def __init__(self, observation_space: gym.Space, hidden_sizes=(64, 64), activation: str = "tanh",
                 normalize_obs: bool = False):
        super().__init__()
        self.body, width, _ = mlp_body(observation_space, hidden_sizes, activation, normalize_obs,
                                       key="algo.critic_activation")
        self.obs_width = ObservationLayout(observation_space).raw_dim   # stored rows may carry an action mask after
        self.head = nn.Linear(width, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """(N,) scaled values of a batch of observations (N, *obs_shape)."""
        x = obs.flatten(start_dim=1) if obs.dim() > 2 else obs
        if x.shape[-1] > self.obs_width:       # the action mask's columns (``dppo.policies.masked``): not read
            x = x[..., :self.obs_width]
        return self.head(self.body(x.float())).squeeze(-1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        """The per-row output the per-user-gradient engine differentiates (actions are ignored)."""
        return self.value(obs)
