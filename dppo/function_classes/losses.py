"""The two DP-GFA losses, for every member of a finite class at once, from sufficient statistics.

Both are updated incrementally as data arrives: a batch adds its statistics, never re-scans history.

* ``BellmanResidualLoss`` (Algorithm 2, deterministic transitions, outcome reward):
  ``L_BR(f) = sum_{(tau, r) in D} (G_f(tau) - r)^2`` with the trajectory residual
  ``G_f(tau) = sum_h [f_h(s_h, a_h) - V^f_{h+1}(s_{h+1})]``, ``V^f_h(s) = max_a f_h(s, a)``, ``V^f_{H+1} = 0``.
  Per batch, grouped by distinct trajectory u (count n_u, reward sum S_u, square sum Q_u):
  ``L += sum_u n_u G_f(u)^2 - 2 G_f(u) S_u + Q_u``: cost O(|F| x distinct trajectories x H) per batch.
* ``BellmanErrorLoss`` (Algorithm 1, stochastic tabular MDP, per-step rewards):
  ``L_BE(f) = sum_h E_h(f_h, f_{h+1}) - inf_{f'} sum_h E_h(f'_h, f_{h+1})``, with
  ``E_h(g, f_{h+1}) = sum_tau (g(s_h, a_h) - r_h - V^f_{h+1}(s_{h+1}))^2``. Expanding the square,
  ``sum_h E_h(g, f_{h+1}) = q(g) - 2 <g, T^f> + C(f)`` with ``q(g) = sum_sa n(sa) g(sa)^2``,
  ``T^f(sa) = R(sa) + sum_s' N(sa, s') V^f_{h+1}(s')`` (n: visit counts, R: reward sums, N: transition
  counts) and ``C(f)`` the same in both terms, so ``L_BE(f) = [q(f) - 2<f, T^f>] - min_f' [q(f') - 2<f', T^f>]``:
  the statistics (n, R, N) are O(H S^2 A) whatever the history length.
"""
from __future__ import annotations

import math

import torch

from dppo.function_classes.base import FiniteClass

_CHUNK = 16384


def trajectory_residuals(fclass: FiniteClass, sa: torch.Tensor, next_states: torch.Tensor,
                         num_actions: int) -> torch.Tensor:
    """``G_f(tau)`` for every member and trajectory (deterministic transitions).

    Args:
        fclass: the finite class.
        sa: ``[u, H]`` state-action ids along each trajectory.
        next_states: ``[u, H-1]`` state ids s_2..s_H (V^f_{H+1} = 0 needs no id).
        num_actions: |A| (state-action id = state * |A| + a).

    Returns:
        float64 ``[|F|, u]``.
    """
    fast = getattr(fclass, "trajectory_residuals", None)
    if fast is not None:
        return fast(sa, next_states, num_actions)
    u, H = sa.shape
    nxt = next_states.unsqueeze(-1) * num_actions + torch.arange(num_actions)          # [u, H-1, A]
    points = torch.cat([sa, nxt.reshape(u, -1)], 1)                                   # [u, H + (H-1)A]
    out = torch.empty(fclass.size, u, dtype=torch.float64)
    for lo in range(0, fclass.size, _CHUNK):
        members = torch.arange(lo, min(lo + _CHUNK, fclass.size))
        q = fclass.values(points, members)                                           # [c, u, H + (H-1)A]
        taken = q[:, :, :H].sum(-1)
        v_next = q[:, :, H:].reshape(len(members), u, H - 1, num_actions).amax(-1).sum(-1)
        out[lo: lo + len(members)] = (taken - v_next).double()
    return out


class BellmanResidualLoss(torch.nn.Module):
    """Running ``L_BR(f)`` for all f (Algorithm 2), plus per-trajectory counts for inspection.

    A module: ``loss`` is a buffer and the episode count extra state, so ``state_dict`` / ``.to``
    carry them."""

    def __init__(self, size: int):
        super().__init__()
        self.register_buffer("loss", torch.zeros(size, dtype=torch.float64))
        self.episodes = 0

    def update(self, residuals: torch.Tensor, count: torch.Tensor, reward_sum: torch.Tensor,
               reward_sq_sum: torch.Tensor) -> None:
        """Add one batch grouped by distinct trajectory: residuals ``[|F|, u]``, then n_u, S_u, Q_u ``[u]``."""
        n, s, q = count.double(), reward_sum.double(), reward_sq_sum.double()
        self.loss += (residuals.square() * n - 2 * residuals * s).sum(1) + q.sum()
        self.episodes += int(count.sum())

    def get_extra_state(self) -> dict:
        return {"episodes": self.episodes}

    def set_extra_state(self, state: dict) -> None:
        self.episodes = int(state["episodes"])


def masked_max(q: torch.Tensor, action_ok: torch.Tensor | None) -> torch.Tensor:
    """``max_a q[..., s, a]`` over the admissible actions ``action_ok[s, a]`` (every action where None)."""
    if action_ok is None:
        return q.amax(-1)
    return q.masked_fill(~action_ok.to(q.device), -math.inf).amax(-1)


class BellmanErrorLoss(torch.nn.Module):
    """Sufficient statistics of a tabular dataset and ``L_BE(f)`` for all f (Algorithm 1).

    The domain is ``sa = (h S + s) A + a`` (0-indexed steps), ``num_sa = H S A``. A module: the
    statistics are buffers and the episode count extra state.
    """

    def __init__(self, H: int, S: int, A: int, action_ok: torch.Tensor | None = None):
        super().__init__()
        self.H, self.S, self.A = H, S, A
        # the env's public admissible actions [S, A] (``dppo.envs.masks.mask_table``): V^f(s) = max over them only
        self.action_ok = None if action_ok is None else torch.as_tensor(action_ok, dtype=torch.bool)
        self.register_buffer("count", torch.zeros(H * S * A, dtype=torch.float64))
        self.register_buffer("reward_sum", torch.zeros(H * S * A, dtype=torch.float64))
        self.register_buffer("transitions", torch.zeros(H * S * A, S, dtype=torch.float64))
        self.episodes = 0

    def update(self, states: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor) -> None:
        """Add episodes: states ``[n, H+1]`` (incl. the final one), actions ``[n, H]``, rewards ``[n, H]``."""
        H, S, A = self.H, self.S, self.A
        dev = self.count.device
        states, actions, rewards = states.to(dev), actions.to(dev), rewards.to(dev)
        h = torch.arange(H, device=dev).expand_as(actions)
        sa = ((h * S + states[:, :H]) * A + actions).reshape(-1)
        self.count.index_add_(0, sa, torch.ones(len(sa), dtype=torch.float64, device=dev))
        self.reward_sum.index_add_(0, sa, rewards.reshape(-1).double())
        flat = sa * S + states[:, 1:].reshape(-1)
        self.transitions.view(-1).index_add_(0, flat, torch.ones(len(sa), dtype=torch.float64, device=dev))
        self.episodes += int(actions.shape[0])

    def targets(self, table: torch.Tensor) -> torch.Tensor:
        """``T^f(sa) = R(sa) + sum_s' N(sa, s') V^f_{h+1}(s')`` for every member: ``[|F|, num_sa]``."""
        H, S, A = self.H, self.S, self.A
        V = masked_max(table.view(-1, H, S, A), self.action_ok)                        # [|F|, H, S]
        v_next = torch.cat([V[:, 1:], torch.zeros_like(V[:, :1])], 1)                  # V_{h+1}, 0 after H
        N = self.transitions.view(H, S, A, S)
        return self.reward_sum + torch.einsum("hsat,fht->fhsa", N, v_next).reshape(table.shape[0], -1)

    def loss(self, table: torch.Tensor) -> torch.Tensor:
        """``L_BE(f)`` for every member, from a class table ``[|F|, num_sa]`` (float64)."""
        table = table.double()
        T = self.targets(table)                                                        # [|F|, D]
        quad = table.square() @ self.count                                             # q(f)   [|F|]
        own = quad - 2 * (table * T).sum(1)                                            # q(f) - 2<f, T^f>
        cross = quad.unsqueeze(1) - 2 * table @ T.T                                    # [f', f]
        return own - cross.amin(0)

    def get_extra_state(self) -> dict:
        return {"episodes": self.episodes}

    def set_extra_state(self, state: dict) -> None:
        self.episodes = int(state["episodes"])
