"""Gaussian MLP policy for Box observations and Box (continuous) actions.

The policy draws u ~ N(mu_theta(s), diag sigma^2) and the environment receives a = env_action(u):

- ``squash=tanh`` (default): a = low + (tanh(u) + 1) (high - low) / 2, always strictly inside the Box;
  ``log_prob`` is the density of a, log N(u; mu, sigma) - sum_j log |da_j / du_j| (change of variables).
- ``squash=clip``: a = clip(u, low, high) (the SB3 / CleanRL convention); ``log_prob`` is log N(u; mu, sigma),
  the density of the unclipped sample. Works with unbounded Boxes.

The learners store and score u (the rollout keeps the sample, not the squashed action), so every score
function grad log pi(u|s) is exact under both options; the Jacobian term of ``tanh`` does not depend on theta.

``log_std=param`` (default): a state-independent vector of log-stds (one parameter per action dimension);
``log_std=state``: a second linear head on the body, log sigma(s), squashed smoothly into
[log_std_min, log_std_max] so a private noisy step cannot make sigma collapse or explode.
Deterministic actions (``greedy`` / ``predict(deterministic=True)``) take u = mu.
"""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dppo.errors import ConfigError
from dppo.policies.base import PredictMixin
from dppo.policies.observations import mlp_body

SQUASH = ("tanh", "clip")
LOG_STD = ("param", "state")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class GaussianMLPPolicy(PredictMixin, nn.Module):
    """pi_theta(u|s) = N(mu_theta(s), diag sigma_theta(s)^2), actions squashed (tanh) or clipped to the Box.

    Args:
        observation_space: a ``Box`` space (flattened).
        action_space: a ``Box`` space of shape (d,).
        hidden_sizes: widths of the hidden layers ([] = a linear-Gaussian policy).
        activation: ``tanh`` or ``relu``.
        log_std: ``param`` (state-independent) or ``state`` (a head of the network).
        log_std_init: initial log sigma (in pre-squash units).
        log_std_min, log_std_max: range of a state-dependent log sigma.
        squash: ``tanh`` or ``clip`` (module docstring).
    """

    continuous = True

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes=(64, 64),
                 activation: str = "tanh", log_std: str = "param", log_std_init: float = 0.0,
                 log_std_min: float = -5.0, log_std_max: float = 2.0, squash: str = "tanh"):
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
            raise ConfigError(f"the Gaussian policy needs a 1-d Box action space, got {action_space}; "
                              f"for Discrete actions use policy=mlp")
        if squash not in SQUASH or log_std not in LOG_STD:
            raise ConfigError(f"policy.squash must be one of {SQUASH} and policy.log_std one of {LOG_STD}")
        if not log_std_min < log_std_max:
            raise ConfigError("policy.log_std_min must be < policy.log_std_max")
        low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
        if squash == "tanh" and not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ConfigError("policy.squash=tanh needs a bounded action Box; use policy.squash=clip")
        self.body, width, self.obs_layout = mlp_body(observation_space, hidden_sizes, activation, False)
        self.observation_shape = tuple(observation_space.shape) if self.obs_layout.is_box else None
        self.action_dim = int(action_space.shape[0])
        self.squash, self.log_std_mode = squash, log_std
        self.log_std_min, self.log_std_max = float(log_std_min), float(log_std_max)
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32), persistent=False)
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32), persistent=False)
        self.mu = nn.Linear(width, self.action_dim)
        nn.init.zeros_(self.mu.bias)
        with torch.no_grad():
            self.mu.weight.mul_(0.01)
        if log_std == "param":
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(log_std_init)))
        else:
            self.log_std_head = nn.Linear(width, self.action_dim)
            nn.init.zeros_(self.log_std_head.weight)
            with torch.no_grad():  # the smooth map below sends this bias to log_std_init
                frac = (float(log_std_init) - self.log_std_min) / (self.log_std_max - self.log_std_min)
                frac = min(max(frac, 1e-3), 1 - 1e-3)
                self.log_std_head.bias.fill_(math.atanh(2 * frac - 1))

    # ---- the distribution --------------------------------------------------------------------
    def mean_and_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(obs.flatten(start_dim=1).float() if obs.dim() > 2 else obs.float())
        mu = self.mu(h)
        if self.log_std_mode == "param":
            log_std = self.log_std.expand_as(mu)
        else:
            t = torch.tanh(self.log_std_head(h))
            log_std = self.log_std_min + 0.5 * (t + 1) * (self.log_std_max - self.log_std_min)
        return mu, log_std

    def gaussian_log_prob(self, obs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """log N(u; mu(s), sigma(s)^2), summed over action dimensions."""
        mu, log_std = self.mean_and_log_std(obs)
        z = (u.float() - mu) * torch.exp(-log_std)
        return (-0.5 * z**2 - log_std - _LOG_SQRT_2PI).sum(-1)

    def log_det_jacobian(self, u: torch.Tensor) -> torch.Tensor:
        """sum_j log |da_j/du_j| of env_action (0 for clip); independent of the parameters."""
        if self.squash == "clip":
            return torch.zeros(u.shape[:-1], dtype=torch.float32)
        u = u.float()
        log_dtanh = 2 * (math.log(2.0) - u - nn.functional.softplus(-2 * u))  # log(1 - tanh(u)^2), stable
        return (log_dtanh + torch.log((self.high - self.low) / 2)).sum(-1)

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) of the stored samples u (differentiable in the parameters; module docstring)."""
        return self.gaussian_log_prob(obs, actions) - self.log_det_jacobian(actions)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, greedy: bool = False, generator: torch.Generator | None = None):
        """Pre-squash samples u (N, d) and their log-probabilities; ``greedy`` returns u = mu."""
        mu, log_std = self.mean_and_log_std(obs)
        u = mu if greedy else mu + torch.exp(log_std) * torch.randn(mu.shape, generator=generator)
        return u, self.log_prob(obs, u)

    @torch.no_grad()
    def sample_from_uniforms(self, obs: torch.Tensor, uniforms: torch.Tensor | None) -> torch.Tensor:
        """u = mu + sigma Phi^{-1}(uniforms) (exact Gaussian sampling from the caller's stream); mu if None.
        ``uniforms`` is (N, d), or (N,) for d = 1."""
        mu, log_std = self.mean_and_log_std(obs)
        if uniforms is None:
            return mu
        q = uniforms.double().reshape(mu.shape[0], -1).clamp(1e-12, 1 - 1e-12)
        return (mu.double() + torch.exp(log_std).double() * torch.special.ndtri(q)).float()

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        """The action the environment receives: tanh-squashed into, or clipped to, the Box."""
        u = u.float()
        if self.squash == "tanh":
            return self.low + (torch.tanh(u) + 1) * (self.high - self.low) / 2
        return torch.maximum(torch.minimum(u, self.high), self.low)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``forward`` is ``log_prob`` so that ``torch.func.functional_call`` can differentiate it per user."""
        return self.log_prob(obs, actions)
