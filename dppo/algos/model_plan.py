"""Certainty-equivalence planning on released transition counts (``algo=model`` / ``algo=dp_model``).

Input: the released (noisy, or exact for the twin) sums ``M~[i, c]`` (transitions of row i = (s_i, a_i) into column
c) and ``Y~[i, c]`` (their rewards, mapped into [0, 1]) on the public index set (``dppo.privacy.count_release``),
each entry's noise std ``sigma_M`` and ``sigma_Y`` (0 for the twin). Everything below is post-processing:

* denoising: ``m = M~`` where ``M~ >= tau sigma_M`` (and ``> 0``), else 0 (``threshold`` = tau);
* visits ``n_i = sum_c m[i, c]``; a row is known when ``n_i >= max(gate sigma_M, min_visits)``; an unknown
  admissible pair gets the pessimistic value ``lo (H - h)`` (the least return of its remaining steps);
* transitions ``P^[i, c] = m[i, c] / n_i``;
* rewards: the pooled mean of each column ``rbar_c = clip(sum_i Y~[i, c] / sum_i M~[i, c], 0, 1)`` over every row
  (zero-mean noise summed over many rows: little of it) is the prior of an empirical-Bayes mean
  ``r^[i, c] = clip((Y~[i, c] + kappa rbar_c) / (m[i, c] + kappa), 0, 1)`` on kept entries,
  ``kappa = reward_prior sigma_Y`` (0 for the twin: the plain mean); where a transition's reward is a function of its next state (ICU-Sepsis: 1 on entering the
  survival state) the pooled mean is exact and the noise of ``Y~`` barely matters. Native rewards
  ``lo + (hi - lo) r^``, ``R^_i = sum_c P^[i, c] r^_native[i, c]``;
* or, with the per-column reward release (``reward_model=next_state``: the reward of a transition is a function
  of its next state), ``r^[i, c] = clip(V~_c / (Z~_c + kappa), 0, 1)`` for every row, shrunk towards 0 (pessimistic);
* value iteration over the horizon H (or until ``max |V_h - V_{h+1}| <= tol``): ``V_H = 0``,
  ``Q_h(i) = R^_i + sum_c P^[i, c] V_{h+1}(c)``, ``V_h(s) = max over admissible a of Q_h(s, a)`` (masked maxima:
  an inadmissible action is never taken), ``V(c) = 0`` for terminal columns (terminal states, the sink);
* the released policy: ``pi(s) = argmax over admissible a of Q_0(s, a)`` (stationary).

The transitions are a sparse matrix over the known rows (``scipy.sparse``): planning ICU-Sepsis (2,313 admissible
rows, 716 columns) takes a few hundredths of a second.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse


@dataclass
class IndexSet:
    """The public index set: rows ``(rows_s[i], rows_a[i])``, ``cols`` columns (next states, maybe a sink), the
    row of each pair ``row_of[s, a]`` (-1: not in the set), the admissible table ``mask`` [S, A] and the columns
    whose value is 0 (``terminal_cols``: terminal states, the sink)."""

    rows_s: np.ndarray
    rows_a: np.ndarray
    row_of: np.ndarray
    cols: int
    mask: np.ndarray
    terminal_cols: np.ndarray

    @classmethod
    def build(cls, S: int, A: int, mask: np.ndarray | None, terminal: list | None, sink: bool) -> "IndexSet":
        """Rows: the admissible pairs of non-terminal states (every pair where ``mask`` is None); columns: the S
        states plus a sink column if ``sink``."""
        ok = np.ones((S, A), bool) if mask is None else np.asarray(mask, bool).copy()
        ok[~ok.any(1)] = True                     # a state without admissible actions: every action
        cols = S + int(bool(sink))
        terminal_cols = np.zeros(cols, bool)
        if terminal:
            terminal_cols[np.asarray(terminal, np.int64)] = True
        if sink:
            terminal_cols[S] = True
        rows = ok & ~terminal_cols[:S, None]
        rows_s, rows_a = np.nonzero(rows)
        row_of = np.full((S, A), -1, np.int64)
        row_of[rows_s, rows_a] = np.arange(len(rows_s))
        return cls(rows_s, rows_a, row_of, cols, ok, terminal_cols)

    @property
    def entries(self) -> int:
        return len(self.rows_s) * self.cols


@dataclass
class Plan:
    """A plan's outputs: the greedy policy [S], Q_0 [S, A] (-inf where inadmissible), V_0 [S], the known rows."""

    policy: np.ndarray
    q: np.ndarray
    v: np.ndarray
    known: np.ndarray
    iterations: int


def denoise_counts(counts: np.ndarray, floor: float) -> np.ndarray:
    """``M~`` with entries below ``floor`` (and every entry <= 0) set to 0."""
    return np.where((counts >= floor) & (counts > 0), counts, 0.0)


def reward_means(m: np.ndarray, counts: np.ndarray, rewards: np.ndarray, kappa: float) -> np.ndarray:
    """The empirical-Bayes reward means ``r^`` in [0, 1] of the kept entries (``m > 0``; module docstring), 0
    elsewhere. The pooled column means use the raw released sums of every row (their noise is zero-mean and averages
    out over the rows: clipping entries first would turn it into a bias)."""
    col_m, col_y = counts.sum(0), rewards.sum(0)
    rbar = np.clip(col_y / np.where(col_m > 0, col_m, 1.0), 0.0, 1.0) * (col_m > 0)
    kept = m > 0
    den = np.where(kept, m + kappa, 1.0)
    return np.where(kept, np.clip((rewards + kappa * rbar[None, :]) / den, 0.0, 1.0), 0.0)


def next_state_rewards(index: IndexSet, rewards: np.ndarray, kappa: float) -> np.ndarray:
    """``r^[i, c] = clip(V~_c / (max(Z~_c, 0) + kappa), 0, 1)`` for every row, from the per-column release
    ``(Z~, V~)`` [2 cols]: the reward of entering c shrunk towards the low end of the range (pessimistic: a column
    few users entered gets about 0 instead of its noise; kappa = 0: the plain mean, 0 where Z~_c <= 0)."""
    C = index.cols
    z, v = rewards[:C], rewards[C:]
    den = np.maximum(z, 0.0) + kappa
    rbar = np.where(den > 0, np.clip(v / np.where(den > 0, den, 1.0), 0.0, 1.0), 0.0)
    return np.broadcast_to(rbar, (len(index.rows_s), C))


def plan(index: IndexSet, counts: np.ndarray, rewards: np.ndarray, *, horizon: int, reward_range: tuple,
         threshold: float = 0.0, gate: float = 0.0, min_visits: float = 1.0, reward_prior: float = 0.0,
         sigma_counts: float = 0.0, sigma_rewards: float = 0.0, tol: float = 1e-10) -> Plan:
    """Greedy policy on the certainty-equivalent model of released sums ``counts`` and ``rewards`` ([rows, cols]
    each; module docstring). ``threshold``, ``gate`` and ``reward_prior`` are in units of the entries' noise stds
    ``sigma_counts`` / ``sigma_rewards`` (public: from the calibration); ``reward_range`` = (lo, hi) native."""
    R, C = len(index.rows_s), index.cols
    S, A = index.mask.shape
    lo, hi = float(reward_range[0]), float(reward_range[1])
    m = denoise_counts(counts.reshape(R, C), threshold * sigma_counts)
    n = m.sum(1)
    known = n >= max(gate * sigma_counts, min_visits, 1e-12)
    kappa = reward_prior * sigma_rewards if np.isfinite(sigma_rewards) else 0.0
    if rewards.shape == (R, C) and not np.isfinite(sigma_rewards):   # public rewards (reward model public): as given
        r01 = rewards
    elif rewards.size == 2 * C and rewards.size != R * C:      # the per-column release (reward model next_state)
        r01 = next_state_rewards(index, rewards, kappa)
    else:
        r01 = reward_means(m, counts.reshape(R, C), rewards.reshape(R, C), kappa)
    kr = np.flatnonzero(known)
    P = m[kr] / n[kr, None]
    reward = lo + (hi - lo) * (P * r01[kr]).sum(1)       # R^_i = sum_c P^ (lo + (hi - lo) r^), P^ rows sum to 1
    Psp = sparse.csr_matrix(P)
    ks, ka = index.rows_s[kr], index.rows_a[kr]
    unknown = index.mask.copy()
    unknown[ks, ka] = False                              # admissible pairs without a known row
    live = ~index.terminal_cols
    V = np.zeros(C)
    Q = np.full((S, A), -np.inf)
    it = 0
    for it in range(1, int(horizon) + 1):
        Q.fill(-np.inf)
        Q[unknown] = lo * it                             # pessimistic: the least return of the remaining steps
        Q[ks, ka] = reward + Psp @ V
        Vs = Q.max(1)
        Vn = np.zeros(C)
        Vn[:S] = Vs
        Vn[~live] = 0.0
        delta = float(np.abs(Vn - V).max())
        V = Vn
        if delta <= tol and lo == 0.0:                   # values stopped changing (with lo = 0 a fixed point)
            break
    policy = Q.argmax(1)
    return Plan(policy.astype(np.int64), Q, V[:S].copy(), known, it)
