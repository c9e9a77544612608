"""A structured finite class for ContextBits that contains Q* (realizable), |F| from 243 to >= 10^5.

Member ``theta = (m_1..m_H, c)``: a guess of the four target masks (any of the 64 parities of the
context bits, per step) and a value scale ``c``. Its Q-function is the optimal Q of the ContextBits
MDP whose targets are ``t_h(x) = <m_h, x> mod 2`` and whose reward is c times the variant's reward:

* easy: ``Q_h(s_h, a) = c (#{j <= h : a_j = t_j(x)} + H - h) / H``;
* hard: ``Q_h(s_h, a) = c 1[a_j = t_j(x) for all j <= h]``.

The class is |F| distinct members drawn uniformly (seeded, data-independent) from the 64^H x |scales|
combinations, with the true ``(masks, 1.0)`` = Q* inserted at a random position. With the default
three scales, |F| = 243 = 3^5 matches the paper's class size. Values lie in [0, max(scales)].
Values are computed on demand (nothing of size |F| x num_sa is stored), in member chunks.

Why the default scales are (0.5, 0.75, 1.0), all <= 1: the outcome reward is known to lie in [0, 1],
so no Q-value of the true MDP exceeds 1 and a member with c > 1 is ruled out a priori. With every
c <= 1 a member's trajectory residual (its own predicted reward, see ``trajectory_residuals``) lies
in [0, 1], so the exact class sensitivity of Algorithm 2's score is ``max (G_f - r)^2 = 1``. No
realizable class can do better: Q*'s residual equals the true reward, which is 1 on the all-correct
trajectory, and replacing that user's reward 1 by a reward 0 (allowed under replace-one adjacency)
moves Q*'s loss by exactly 1. (The former default (0.75, 1.0, 1.25) gave Delta_S = 1.5625.)
Scales below 1 are pessimistic copies of a hypothesis (same greedy policy, lower values): the
optimism term ``eta E_rho max_a f_1`` of the score prefers c = 1 among members that fit the data
equally well, as optimism is meant to.

Separation (why the private learner needs many episodes): two distinct masks give targets that
differ on exactly half of the contexts (their XOR is a non-zero parity), so a wrong member's
expected loss per episode, ``E (G_f - r)^2``, is about ``2 Var(r)`` under an uninformed policy:
about 0.13 (easy) and 0.1 (hard) on average, against Delta_S = 1; under Q*'s own policy it rises to
about 0.44 (easy) and 0.93 (hard). ``docs/gfa.md`` has the measured table.
"""
from __future__ import annotations

import torch

from dppo.envs.context_bits import N_CONTEXTS, ContextBitsMDP, parity_targets
from dppo.errors import ConfigError
from dppo.function_classes.base import FiniteClass

_CHUNK = 8192


class ContextBitsClass(FiniteClass):
    """Structured realizable class over ContextBits (module docstring).

    Args:
        env: the ContextBitsMDP (its variant, horizon and indexing; its true masks give Q*).
        size: |F| (>= 2).
        scales: candidate value scales c; must contain 1.0 (the scale of Q*). Values <= 1 keep every
            member within the known reward range (and the class sensitivity at its minimum, 1).
        seed: seed of the (public, data-independent) draw of the members.
    """

    def __init__(self, env: ContextBitsMDP, size: int = 243, scales=(0.5, 0.75, 1.0), seed: int = 0):
        scales = [float(c) for c in scales]
        if 1.0 not in scales or any(c <= 0 for c in scales):
            raise ConfigError(f"algo.class_scales must be positive and contain 1.0, got {scales}")
        H = env.H
        total = (N_CONTEXTS ** H) * len(scales)
        if not 2 <= int(size) <= total:
            raise ConfigError(f"algo.class_size must be in [2, {total}], got {size}")
        self.env, self.size, self.num_sa = env, int(size), env.num_sa
        self.value_max = max(scales)
        g = torch.Generator().manual_seed(int(seed) + 104729)
        true_code = _encode(env.masks, scales.index(1.0), len(scales))
        codes = torch.tensor([true_code])
        while len(codes) < self.size:
            draw = torch.randint(0, total, (2 * (self.size - len(codes)) + 16,), generator=g)
            codes = torch.cat([codes, draw])
            _, first = _unique_first(codes)
            codes = codes[first]
        codes = codes[: self.size]
        order = torch.randperm(self.size, generator=g)
        self.codes = codes[order]
        self.q_star_index = int((order == 0).nonzero()[0])
        masks, scale_idx = _decode(self.codes, H, len(scales))
        self.masks = masks                                                     # [|F|, H]
        self.scales = torch.tensor(scales, dtype=torch.float32)[scale_idx]     # [|F|]
        self.targets = parity_targets(masks)                                   # [|F|, H, 64]
        # t_1(x)..t_H(x) packed into an H-bit code per (member, context), and a lookup table over
        # (code XOR action bits, step) of the unit-scale value: values are two gathers and a product.
        weights = (1 << torch.arange(H)).view(1, H, 1)
        self.target_code = (self.targets.long() * weights).sum(1).to(torch.uint8)   # [|F|, 64]
        self.lut = _unit_value_table(env.variant, H)                               # [2^H * H]

    def values(self, sa, members=None):
        flat = sa.reshape(-1)
        idx = torch.arange(self.size) if members is None else members.reshape(-1)
        env, H = self.env, self.env.H
        h, x, acts = env.sa_step[flat], env.sa_context[flat], env.sa_actions[flat]
        out = torch.empty(len(idx), len(flat), dtype=torch.float32)
        for lo in range(0, len(idx), _CHUNK):
            m = idx[lo: lo + _CHUNK]
            code = self.target_code[m][:, x].long()                                  # [c, n]
            out[lo: lo + _CHUNK] = self.lut[(code ^ acts) * H + h] * self.scales[m].unsqueeze(1)
        return out.reshape(len(idx), *sa.shape)

    def trajectory_residuals(self, sa: torch.Tensor, next_states: torch.Tensor, num_actions: int) -> torch.Tensor:
        """Fast path of ``losses.trajectory_residuals`` for this class (same numbers, see the tests).

        A member's residual on trajectory ``(x, a_1..a_H)`` depends only on its scale and on the mismatch
        pattern ``p = code_f(x) XOR a``: ``G_f = c_f g(p)`` with ``g(p) = sum_h Q_h(p) - sum_{h>=2} max_a Q_h``
        tabulated once for the 2^H patterns, so a batch costs two gathers over |F| x trajectories.
        """
        H = self.env.H
        x = self.env.sa_context[sa[:, 0]]
        acts = self.env.sa_actions[sa[:, H - 1]]
        g = self._pattern_residuals()
        out = torch.empty(self.size, len(x), dtype=torch.float64)
        for lo in range(0, self.size, _CHUNK):
            m = slice(lo, lo + _CHUNK)
            code = self.target_code[m][:, x].long()
            out[m] = g[code ^ acts] * self.scales[m].double().unsqueeze(1)
        return out

    def _pattern_residuals(self) -> torch.Tensor:
        """``g(p)`` for every mismatch pattern p (unit scale), from the value lookup table."""
        H = self.env.H
        lut = self.lut.view(1 << H, H).double()
        p = torch.arange(1 << H)
        g = torch.zeros(1 << H, dtype=torch.float64)
        for h in range(H):
            g += lut[p & ((1 << (h + 1)) - 1), h]                                   # Q_h(s_h, a_h)
            if h > 0:                                                               # - V_h(s_h): best a_h
                low = p & ((1 << h) - 1)
                g -= torch.maximum(lut[low, h], lut[low | (1 << h), h])
        return g


def _unit_value_table(variant: str, H: int) -> torch.Tensor:
    """``lut[p * H + h]``: unit-scale Q at step h (0-indexed) when the action bits differ from the
    targets by the bit pattern p (bit j set = a_{j+1} != t_{j+1}(x)); only bits j <= h count.

    easy: (#matches among j <= h + H - 1 - h) / H; hard: 1[no mismatch among j <= h].
    """
    p = torch.arange(1 << H).unsqueeze(1)
    h = torch.arange(H).unsqueeze(0)
    mismatch_bits = (p.unsqueeze(-1) >> torch.arange(H)) & 1                         # [2^H, 1, H]
    upto = torch.arange(H).view(1, 1, H) <= h.unsqueeze(-1)                          # [1, H, H]
    matches = (h + 1) - (mismatch_bits * upto).sum(-1)                              # [2^H, H]
    if variant == "easy":
        table = (matches + (H - 1 - h)).float() / H
    else:
        table = (matches == h + 1).float()
    return table.reshape(-1)


def _encode(masks, scale_index: int, n_scales: int) -> int:
    code = 0
    for m in reversed([int(v) for v in masks]):
        code = code * N_CONTEXTS + m
    return code * n_scales + scale_index


def _decode(codes: torch.Tensor, H: int, n_scales: int) -> tuple[torch.Tensor, torch.Tensor]:
    scale_idx = codes % n_scales
    rest = codes // n_scales
    masks = torch.stack([(rest // N_CONTEXTS ** h) % N_CONTEXTS for h in range(H)], 1)
    return masks, scale_idx


def _unique_first(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique values and the index of each one's first occurrence, in order of first occurrence."""
    uniq, inv = torch.unique(codes, return_inverse=True)
    pos = torch.arange(len(codes))
    first = torch.full((len(uniq),), len(codes), dtype=torch.long).scatter_reduce(0, inv, pos, "amin")
    first, _ = first.sort()
    return codes[first], first
