"""MLP policy for MultiDiscrete (and MultiBinary) actions: one softmax per component, as SB3's
``MultiCategoricalDistribution``: pi(a | s) = prod_j softmax(logits_j(s))[a_j].

An action is stored as its k component indices (minus the space's ``start``). ``log_prob`` also takes
*partial* actions, components < 0 contributing nothing: log pi_j(a_j | s) for one component alone, which is
what the entropy's score rows need (``entropy_rows``: grad H = sum_j sum_a -pi_j(a) log pi_j(a) grad log pi_j(a)).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dppo.errors import ConfigError
from dppo.policies.base import PredictMixin, pad_rows
from dppo.policies.observations import mlp_body



def action_components(action_space: gym.Space) -> tuple[np.ndarray, np.ndarray] | None:
    """(nvec, start) of a MultiDiscrete or MultiBinary action space (flattened), else None."""
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return (np.asarray(action_space.nvec, dtype=np.int64).reshape(-1),
                np.asarray(action_space.start, dtype=np.int64).reshape(-1))
    if isinstance(action_space, gym.spaces.MultiBinary):
        n = int(np.prod(action_space.shape))
        return np.full(n, 2, dtype=np.int64), np.zeros(n, dtype=np.int64)
    return None


class MultiDiscreteMLPPolicy(PredictMixin, nn.Module):
    """k softmax heads on one MLP body (module docstring).

    Args:
        observation_space: any space ``dppo.policies.observations`` reads.
        action_space: ``MultiDiscrete`` or ``MultiBinary``.
        hidden_sizes, activation, normalize_obs: as ``MLPPolicy``.
    """

    continuous = False
    multi_discrete = True

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes=(64, 64),
                 activation: str = "tanh", normalize_obs: bool = False):
        super().__init__()
        comps = action_components(action_space)
        if comps is None:
            raise ConfigError(f"the MultiDiscrete policy needs a MultiDiscrete or MultiBinary action space, got "
                              f"{action_space}")
        nvec, start = comps
        self.nvec, self.action_start = [int(n) for n in nvec], start
        self.action_shape = tuple(getattr(action_space, "shape", (len(nvec),)))
        self.action_dim = len(self.nvec)
        self.binary = isinstance(action_space, gym.spaces.MultiBinary)
        self.body, width, self.obs_layout = mlp_body(observation_space, hidden_sizes, activation, normalize_obs)
        self.observation_shape = tuple(observation_space.shape) if self.obs_layout.is_box else None
        self.logits_layer = nn.Linear(width, int(sum(self.nvec)))
        nn.init.zeros_(self.logits_layer.bias)
        with torch.no_grad():
            self.logits_layer.weight.mul_(0.01)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """(N, sum nvec): the k components' logits side by side."""
        return self.logits_layer(self.body(obs.flatten(start_dim=1) if obs.dim() > 2 else obs))

    def component_log_probs(self, obs: torch.Tensor) -> list[torch.Tensor]:
        return [torch.log_softmax(z, dim=-1) for z in self.logits(obs).split(self.nvec, dim=-1)]

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a | s) = sum_j log pi_j(a_j | s) over the components with a_j >= 0 (module docstring)."""
        actions = actions.long().reshape(actions.shape[0], -1)
        total = 0.0
        for j, lp in enumerate(self.component_log_probs(obs)):
            a = actions[:, j]
            total = total + torch.where(a >= 0, lp.gather(-1, a.clamp_min(0)[:, None]).squeeze(-1),
                                        torch.zeros((), dtype=lp.dtype))
        return total

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.log_prob(obs, actions)

    @torch.no_grad()
    def sample_from_uniforms(self, obs: torch.Tensor, uniforms: torch.Tensor | None) -> torch.Tensor:
        """(N, k) actions by the inverse CDF of each component at ``uniforms[:, j]`` (None: each argmax)."""
        out = []
        u = None if uniforms is None else uniforms.reshape(obs.shape[0], -1)
        for j, lp in enumerate(self.component_log_probs(obs)):
            if u is None:
                out.append(lp.argmax(-1))
            else:
                cdf = lp.double().exp().cumsum(-1)
                out.append((cdf < u[:, j:j + 1]).sum(-1).clamp_max(lp.shape[-1] - 1))
        return torch.stack(out, dim=1)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, greedy: bool = False, generator: torch.Generator | None = None):
        n = obs.shape[0]
        padded = pad_rows(obs)
        u = None if greedy else torch.rand(padded.shape[0], self.action_dim, generator=generator,
                                           dtype=torch.float64)
        actions = self.sample_from_uniforms(padded, u)[:n]
        return actions, self.log_prob(padded, pad_rows(actions))[:n]

    def env_action(self, actions: torch.Tensor) -> torch.Tensor:
        """Stored indices -> the env's action (plus ``start``, in the space's shape)."""
        a = actions.long() + torch.as_tensor(self.action_start)
        return a.reshape(a.shape[0], *self.action_shape) if a.dim() == 2 else a.reshape(self.action_shape)

    @torch.no_grad()
    def entropy_rows(self, obs: torch.Tensor, user: torch.Tensor, coef: torch.Tensor):
        """Rows (obs, partial action, weight, user) with sum_rows w grad log pi(a | s) = grad sum coef_r H(s_r):
        per row r, component j and level a, the partial action (-1, .., a, .., -1) with weight
        -coef_r pi_j(a|s_r) log pi_j(a|s_r)."""
        rows_o, rows_a, rows_w, rows_u = [], [], [], []
        n = obs.shape[0]
        for j, lp in enumerate(self.component_log_probs(obs)):
            lp = lp.double()
            k = lp.shape[-1]
            acts = torch.full((n * k, self.action_dim), -1, dtype=torch.long)
            acts[:, j] = torch.arange(k).repeat(n)
            rows_o.append(obs.repeat_interleave(k, 0))
            rows_a.append(acts)
            rows_w.append((-(lp.exp() * lp) * coef[:, None]).reshape(-1))
            rows_u.append(user.repeat_interleave(k))
        return torch.cat(rows_o), torch.cat(rows_a), torch.cat(rows_w), torch.cat(rows_u)
