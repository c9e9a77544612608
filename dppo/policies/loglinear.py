"""Log-linear (softmax-linear) policy pi_theta(a|x) ~ exp(theta . phi(x, a)) ([PO] Cor. 2)."""
from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from dppo.errors import ConfigError
from dppo.policies.base import Policy


class LogLinearPolicy(Policy):
    """pi_theta(a|x) = softmax_a(theta . phi(x, a)).

    Features: if the observation is a (K, p) matrix (e.g. ``env=bandit``), row a is the given
    phi(x, a) and theta is in R^p; if it is a flat vector s in R^d, phi(s, a) = e_a (x) [s, 1]
    (one weight row per action, theta in R^{K (d+1)}).

    Args:
        observation_space: ``Box`` of shape (K, p) (given features) or (d,) (raw state).
        action_space: ``Discrete(K)``.
        init_scale: std of the Gaussian initialization of theta (0: uniform policy).
        seed: seed of that initialization.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, init_scale: float = 0.0, seed: int = 0):
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box) or not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError("the log-linear policy needs a Box observation space and a Discrete action space")
        self.n_actions = int(action_space.n)
        shape = self.observation_shape = tuple(observation_space.shape)
        self.given_features = len(shape) == 2 and shape[0] == self.n_actions
        if self.given_features:
            self.feature_dim = shape[1]
            dim = shape[1]
        elif len(shape) == 1:
            self.feature_dim = shape[0] + 1
            dim = self.n_actions * self.feature_dim
        else:
            raise ConfigError(f"the log-linear policy needs observations of shape (K, p) or (d,), got {shape}")
        gen = torch.Generator().manual_seed(int(seed))
        self.theta = nn.Parameter(float(init_scale) * torch.randn(dim, generator=gen))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """phi(x, a) for every action: (N, K, dim)."""
        obs = obs.reshape(obs.shape[0], -1).to(self.theta.dtype)
        if self.given_features:
            return obs.reshape(obs.shape[0], self.n_actions, self.feature_dim)
        s1 = torch.cat([obs, torch.ones(obs.shape[0], 1, dtype=obs.dtype)], dim=1)
        eye = torch.eye(self.n_actions, dtype=obs.dtype)
        return (eye[None, :, :, None] * s1[:, None, None, :]).reshape(obs.shape[0], self.n_actions, -1)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.features(obs) @ self.theta
