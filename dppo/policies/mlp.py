"""MLP softmax policy for Box observations and Discrete actions."""
from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from dppo.errors import ConfigError
from dppo.policies.base import Policy

_ACT = {"tanh": nn.Tanh, "relu": nn.ReLU}


class BoundsScaling(nn.Module):
    """s -> (2 s - (high + low)) / (high - low) on the coordinates with finite bounds (fixed buffers, no parameters)."""

    def __init__(self, observation_space: gym.spaces.Box):
        super().__init__()
        low = torch.as_tensor(observation_space.low, dtype=torch.float32).reshape(-1)
        high = torch.as_tensor(observation_space.high, dtype=torch.float32).reshape(-1)
        bounded = torch.isfinite(low) & torch.isfinite(high) & (high > low)
        width = torch.where(bounded, high - low, torch.full_like(low, 2.0))
        centre = torch.where(bounded, (high + low) / 2, torch.zeros_like(low))
        self.register_buffer("centre", centre)
        self.register_buffer("half_width", width / 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.centre) / self.half_width


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
        layers: list[nn.Module] = [BoundsScaling(observation_space)] if normalize_obs else []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), _ACT[activation]()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(sizes[-1], int(action_space.n))
        nn.init.zeros_(self.head.bias)
        with torch.no_grad():
            self.head.weight.mul_(0.01)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(obs.flatten(start_dim=1) if obs.dim() > 2 else obs))
