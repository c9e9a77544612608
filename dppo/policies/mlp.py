"""MLP softmax policy for Box observations and Discrete actions."""
from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from dppo.errors import ConfigError
from dppo.policies.base import Policy

_ACT = {"tanh": nn.Tanh, "relu": nn.ReLU}


class MLPPolicy(Policy):
    """pi_theta(a|s) = softmax(MLP(s)); default 2 hidden layers of 64 units (the paper's CartPole net).

    Args:
        observation_space: a ``Box`` space (flattened).
        action_space: a ``Discrete`` space.
        hidden_sizes: widths of the hidden layers.
        activation: ``tanh`` or ``relu``.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes=(64, 64),
                 activation: str = "tanh"):
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box):
            raise ConfigError(f"the MLP policy needs a Box observation space, got {type(observation_space).__name__}; "
                              f"use a tabular learner (algo=ubev|pucb) for discrete observations")
        if not isinstance(action_space, gym.spaces.Discrete):
            hint = "; for Box (continuous) actions use policy=gaussian" if isinstance(action_space, gym.spaces.Box) else ""
            raise ConfigError(f"the MLP policy needs a Discrete action space, got {type(action_space).__name__}{hint}")
        if activation not in _ACT:
            raise ConfigError(f"policy.activation must be one of {sorted(_ACT)}, got '{activation}'")
        self.observation_shape = tuple(observation_space.shape)
        sizes = [int(torch.tensor(observation_space.shape).prod())] + [int(h) for h in hidden_sizes]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), _ACT[activation]()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(sizes[-1], int(action_space.n))
        nn.init.zeros_(self.head.bias)
        with torch.no_grad():
            self.head.weight.mul_(0.01)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(obs.flatten(start_dim=1) if obs.dim() > 2 else obs))
