"""MLP softmax policy for Box observations and Discrete actions."""
from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from dppo.errors import ConfigError
from dppo.policies.base import Policy
from dppo.policies.observations import BoundsScaling, mlp_body  # noqa: F401 - BoundsScaling: its old home



class MLPPolicy(Policy):
    """pi_theta(a|s) = softmax(MLP(s)); default 2 hidden layers of 64 units (the paper's CartPole net).

    Args:
        observation_space: a ``Box`` space (flattened).
        action_space: a ``Discrete`` space.
        hidden_sizes: widths of the hidden layers.
        activation: ``tanh`` or ``relu``.
        normalize_obs: map every observation coordinate with finite bounds in the observation space (public)
            affinely onto [-1, 1] before the first layer (``BoundsScaling``; e.g. MountainCar's velocity,
            within +-0.07, otherwise barely moves the tanh units); unbounded coordinates pass unchanged.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes=(64, 64),
                 activation: str = "tanh", normalize_obs: bool = False):
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            hint = "; for Box (continuous) actions use policy=gaussian" if isinstance(action_space, gym.spaces.Box) else ""
            raise ConfigError(f"the MLP policy needs a Discrete action space, got {type(action_space).__name__}{hint}")
        self.body, width, self.obs_layout = mlp_body(observation_space, hidden_sizes, activation, normalize_obs)
        self.observation_shape = tuple(observation_space.shape) if self.obs_layout.is_box else None
        self.head = nn.Linear(width, int(action_space.n))
        nn.init.zeros_(self.head.bias)
        with torch.no_grad():
            self.head.weight.mul_(0.01)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(obs.flatten(start_dim=1) if obs.dim() > 2 else obs))
