"""ContextBits: the deterministic outcome-reward MDP of DP-GFA's appendix D, as dppo defines it.

The MDP (H = 4 steps, |A| = 2 actions, one reward at the end):

* A user brings a context ``x`` in {0, 1}^6, drawn from a known product distribution
  ``rho(x) = prod_i p_i^{x_i} (1 - p_i)^{1 - x_i}`` (``bit_probs``, default all 1/2).
* The state at step h (1-indexed) is the context plus the actions so far, ``s_h = (x, a_1..a_{h-1})``;
  transitions are deterministic (append the action), like a language model appending a token.
* Each step has a hidden target bit ``t_h(x) = <m_h, x> mod 2`` (the parity of the context bits
  selected by the 6-bit mask ``m_h``). After step H the user returns one outcome reward r in [0, 1]:

  - ``easy`` (dense, smooth): ``r = (1/H) #{h : a_h = t_h(x)}`` with single-bit masks
    ``m_h = bit h`` (so ``t_h(x) = x_h``): every correct action earns 1/H;
  - ``hard`` (parity, sparse): ``r = 1[a_h = t_h(x) for all h]`` with multi-bit parity masks
    (``0b000111, 0b011100, 0b110001, 0b101010``): a random policy earns 1/16 on average.

* Optimal value: the policy ``a_h = t_h(x)`` earns r = 1 on every context, so ``V*(x) = 1`` and
  ``E_rho V* = 1`` in both variants; ``Q*_h(s_h, a)`` is given in closed form by ``q_star``.
  The value of any deterministic policy is computed exactly by enumerating the 64 contexts.

Indexing (used by the finite function classes): state ``(h, x, prefix)`` with ``prefix`` the
integer whose bit ``j`` is ``a_{j+1}`` has flat id ``offset[h] + x * 2^(h-1) + prefix``, with
``offset[h] = 64 (2^(h-1) - 1)``; state-action pairs are ``sa = state * A + a``. A trajectory
``(x, a_1..a_H)`` has id ``x * 2^H + sum_j a_j 2^(j-1)``.
"""
from __future__ import annotations

import torch

from dppo.errors import ConfigError

N_BITS = 6
N_CONTEXTS = 1 << N_BITS
EASY_MASKS = (0b000001, 0b000010, 0b000100, 0b001000)
HARD_MASKS = (0b000111, 0b011100, 0b110001, 0b101010)


def parity_targets(masks: torch.Tensor) -> torch.Tensor:
    """Target bits ``t[..., h, x] = popcount(masks[..., h] & x) mod 2`` for all 64 contexts.

    Args:
        masks: integer tensor ``[..., H]`` of 6-bit masks.

    Returns:
        bool tensor ``[..., H, 64]``.
    """
    v = torch.arange(N_CONTEXTS)
    parity = (((v.unsqueeze(-1) >> torch.arange(N_BITS)) & 1).sum(-1) % 2).bool()   # parity of each 6-bit int
    table = parity[v.unsqueeze(1) & v.unsqueeze(0)]                                 # [mask, x]
    return table[masks.long()]


class ContextBitsMDP:
    """The ContextBits outcome-reward MDP (module docstring). Deterministic, finite, exact regret.

    Args:
        variant: ``easy`` (dense reward, single-bit targets) or ``hard`` (sparse parity reward).
        bit_probs: the six probabilities ``p_i = P(x_i = 1)`` of the known context distribution rho.
        masks: optional override of the four target masks.
        horizon: H (4 in the paper; 1..6 allowed).
    """

    num_actions = 2
    reward_low, reward_high = 0.0, 1.0

    def __init__(self, variant: str = "easy", bit_probs=(0.5,) * N_BITS, masks=None, horizon: int = 4):
        if variant not in ("easy", "hard"):
            raise ConfigError(f"env.variant must be 'easy' or 'hard', got '{variant}'")
        if not 1 <= int(horizon) <= 6:
            raise ConfigError(f"context_bits horizon must be in 1..6, got {horizon}")
        probs = torch.as_tensor(list(bit_probs), dtype=torch.float64)
        if probs.shape != (N_BITS,) or (probs < 0).any() or (probs > 1).any():
            raise ConfigError(f"env.bit_probs must be {N_BITS} probabilities in [0, 1], got {list(bit_probs)}")
        self.variant = variant
        self.horizon = self.H = int(horizon)
        default = EASY_MASKS if variant == "easy" else HARD_MASKS
        masks = list(default if masks is None else masks)[: self.H]
        if len(masks) != self.H or any(not 0 <= int(m) < N_CONTEXTS for m in masks):
            raise ConfigError(f"env.masks must be {self.H} integers in [0, 63], got {masks}")
        self.masks = torch.tensor([int(m) for m in masks])
        self.name = self.id = f"context_bits-{variant}"
        bits = (torch.arange(N_CONTEXTS).unsqueeze(-1) >> torch.arange(N_BITS)) & 1
        self.rho = torch.where(bits.bool(), probs, 1 - probs).prod(-1)          # [64]
        self.targets = parity_targets(self.masks)                             # [H, 64]
        self._build_index()

    # ---- indexing ------------------------------------------------------------------------------
    def _build_index(self) -> None:
        H, A = self.H, self.num_actions
        self.state_offset = [N_CONTEXTS * ((1 << h) - 1) for h in range(H + 1)]   # 0-indexed steps
        self.num_states = self.state_offset[H]
        self.num_sa = self.num_states * A
        step, ctx, prefix = [], [], []
        for h in range(H):
            n = 1 << h
            step.append(torch.full((N_CONTEXTS * n,), h))
            ctx.append(torch.arange(N_CONTEXTS).repeat_interleave(n))
            prefix.append(torch.arange(n).repeat(N_CONTEXTS))
        st_step, st_ctx, st_prefix = torch.cat(step), torch.cat(ctx), torch.cat(prefix)
        # per state-action pair: 0-indexed step, context, action bits a_1..a_h (incl. this action)
        self.sa_step = st_step.repeat_interleave(A)
        self.sa_context = st_ctx.repeat_interleave(A)
        self.sa_actions = (st_prefix.repeat_interleave(A) | (torch.arange(A).repeat(self.num_states)
                                                              << self.sa_step))

    def state_id(self, h: int, x: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """Flat id of the state at 0-indexed step ``h`` with context ``x`` and action bits ``prefix``."""
        return self.state_offset[h] + x * (1 << h) + prefix

    @property
    def num_trajectories(self) -> int:
        return N_CONTEXTS << self.H

    def trajectory_sa(self, traj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """State-action ids along trajectories, and the next states' ids.

        Args:
            traj: trajectory ids ``[n]``.

        Returns:
            ``sa [n, H]`` (the pair visited at each step) and ``next_states [n, H-1]`` (s_2..s_H).
        """
        x, acts = traj >> self.H, traj & ((1 << self.H) - 1)
        sa, nxt = [], []
        for h in range(self.H):
            prefix = acts & ((1 << h) - 1)
            a = (acts >> h) & 1
            sa.append(self.state_id(h, x, prefix) * self.num_actions + a)
            if h + 1 < self.H:
                nxt.append(self.state_id(h + 1, x, acts & ((1 << (h + 1)) - 1)))
        return torch.stack(sa, 1), (torch.stack(nxt, 1) if nxt else torch.zeros(len(traj), 0, dtype=torch.long))

    def initial_sa(self) -> torch.Tensor:
        """State-action ids of step 1, ``[64, A]`` (context x, action a)."""
        return (self.state_id(0, torch.arange(N_CONTEXTS), torch.zeros(N_CONTEXTS, dtype=torch.long))
                .unsqueeze(-1) * self.num_actions + torch.arange(self.num_actions))

    # ---- the MDP -------------------------------------------------------------------------------
    def sample_contexts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` contexts drawn from rho."""
        return torch.multinomial(self.rho, n, replacement=True, generator=generator)

    def outcome_reward(self, x: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Outcome rewards r(x, a_1..a_H) in [0, 1] for contexts ``[n]`` and action bits ``[n, H]``."""
        match = actions.bool() == self.targets[:, x].T
        if self.variant == "easy":
            return match.double().mean(-1)
        return match.all(-1).double()

    def rollout(self, x: torch.Tensor, policy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Play a deterministic policy (``policy[state_id]`` action) from contexts ``x``.

        Returns:
            trajectory ids ``[n]`` and outcome rewards ``[n]``.
        """
        prefix = torch.zeros_like(x)
        acts = []
        for h in range(self.H):
            a = policy[self.state_id(h, x, prefix)]
            acts.append(a)
            prefix = prefix | (a << h)
        actions = torch.stack(acts, 1)
        return (x << self.H) | prefix, self.outcome_reward(x, actions)

    def q_star(self) -> torch.Tensor:
        """Q*_h(s, a) on every state-action pair ``[num_sa]`` (float64).

        easy: ``(matches among a_1..a_h + (H - h)) / H``; hard: ``1[a_1..a_h all match]``.
        """
        h = self.sa_step
        t = self.targets[:, self.sa_context]                                   # [H, num_sa]
        bits = ((self.sa_actions.unsqueeze(0) >> torch.arange(self.H).unsqueeze(1)) & 1).bool()
        upto = torch.arange(self.H).unsqueeze(1) <= h.unsqueeze(0)
        match = ((bits == t) & upto).sum(0)
        if self.variant == "easy":
            return (match + (self.H - 1 - h)).double() / self.H
        return (match == h + 1).double()

    def optimal_value(self) -> float:
        """E_{x ~ rho} V*(x) = 1 (the policy a_h = t_h(x) is correct everywhere); computed, not assumed."""
        return float(self.rho @ self.q_star()[self.initial_sa()].max(-1).values)

    def policy_value(self, policy: torch.Tensor) -> float:
        """Exact E_{x ~ rho} of the outcome reward of a deterministic policy (all 64 contexts)."""
        _, r = self.rollout(torch.arange(N_CONTEXTS), policy)
        return float(self.rho @ r)
