"""The tabular learners' backward inductions (``dppo.algos.ucb``, ``dppo.algos.dp_ubev``), on statistics per
step h or pooled over h:

* ``PlanArrays``: UBEV's induction with or without confidence widths for the noise of privately released
  counts (DP-UBEV; ``dppo.algos.dp_ubev`` derives the widths). With exact counts and no widths (``Widths()``)
  the plan is UBEV's (Dann et al. 2017) on the same counts; UBEV plans pooled statistics with it.
* ``_UBEVPlanner``: UBEV's per-step plan on CPU with preallocated arrays (bit for bit ``_backward``'s).
* ``_backward``: the generic induction of UBEV and PUCB on NumPy or torch."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

_UNVISITED_BONUS = 1e30   # stands for an infinite bonus (n = 0), finite so that 0 * bonus = 0
# added to the reward term of an inadmissible (s, a) (the env's public action mask, ``dppo.envs.masks.mask_table``):
# its Q value lies ~1e60 below every admissible one, so the maxima V_h = max_a Q_h and the greedy policy range over
# the admissible actions only (every state has one); finite, so that the inductions' arithmetic stays finite
MASK_PENALTY = -1e60


def mask_penalty(table) -> np.ndarray | None:
    """[S, A] float64: 0 where the action is admissible, ``MASK_PENALTY`` where not; None without a table."""
    if table is None:
        return None
    return np.where(np.asarray(table, dtype=bool), 0.0, MASK_PENALTY)


class Widths(NamedTuple):
    """Coefficients of the confidence widths of one release (module docstring): gate ``E``; reward
    ``sqrt(r_noise^2 + (r_noise_n rbar)^2) + r_round + r_round_n rbar``; next state
    ``t_noise sqrt(max(||W||^2, ||W||^2 - 2 w mix sum W + w^2 s2)) + t_round w``; all over ``n^``, the visits
    estimate ``(1 - mix) n~ + mix sum_s' m~``."""

    E: float = 0.0
    r_noise: float = 0.0
    r_noise_n: float = 0.0
    r_round: float = 0.0
    r_round_n: float = 0.0
    t_noise: float = 0.0
    t_round: float = 0.0
    mix: float = 0.0
    s2: float = 1.0


class PlanArrays:
    """Work arrays of DP-UBEV's backward induction (allocated once; NumPy on CPU).

    Per plan: ``aug[hc] = [m~/n^ | phi | t_noise/n^ | t_round/n^]`` ([S*A, S + 3]) so that one mat-vec with
    ``[W_{h+1}, H - h, sqrt(max(||W||^2, ||W||^2 - 2 w mix sum W + w^2 s2)), w]`` gives the whole next-state
    term but ``c`` of every (s, a); closed pairs get ``m~/n^ = 0`` and ``phi = _UNVISITED_BONUS``.
    """

    def __init__(self, l, n, m, H: int):
        self.l, self.n, self.m = l, n, m
        Hc, S, A = n.shape
        self.H, self.S, self.A, self.Hc = H, S, A, Hc
        self.aug = np.zeros((Hc, S * A, S + 3))
        self.r = np.empty((Hc, S * A))
        self.Q = np.empty((H, S, A))
        self.va = np.zeros(S + 3)
        self.y = np.empty(S * A)
        self.h_left = [float(H - 1 - h) for h in range(H)]
        self.cols = [[self.Q[h][:, a] for a in range(A)] for h in range(H)]
        self.Q2 = self.Q.reshape(H, S * A)
        self.small = S * A <= 64                        # scalar elementwise steps (``_induct_scalar``)
        self.va_mv, self.y_mv = memoryview(self.va), memoryview(self.y)
        self.rows = [None] * H
        self.mix, self.s2 = 0.0, 1.0
        self.penalty = None             # ``mask_penalty`` flattened [S*A], set by the learner

    def plan(self, log_term: float, wd: Widths, private: bool, floor: np.ndarray | None = None) -> np.ndarray:
        Hc, S, A = self.Hc, self.S, self.A
        n = self.n.reshape(Hc, S * A)
        l = self.l.reshape(Hc, S * A)
        m = self.m.reshape(Hc, S * A, S)
        if wd.mix:                                      # n^ = (1 - b) n~ + b M~
            n = (1 - wd.mix) * n + wd.mix * m.sum(-1)
        self.mix, self.s2 = wd.mix, wd.s2
        n_lo = n - wd.E
        if floor is not None:                           # the running lower count (``running_lower_count``)
            fl = floor.reshape(Hc, S * A)
            np.maximum(n_lo, fl, out=n_lo)
            fl[...] = n_lo
            open_ = (n_lo > 0) & (n > 0)
        else:
            open_ = n_lo > 0
        lo = np.where(open_, n_lo, 1.0)
        phi = np.sqrt((2 * np.log(np.log(np.maximum(lo, math.e))) + log_term) / lo)
        phi = np.where(open_, phi, _UNVISITED_BONUS)
        inv = np.where(open_, 1.0 / np.where(open_, n, 1.0), 0.0)
        aug = self.aug
        np.multiply(m, inv[..., None], out=aug[..., :S])
        aug[..., S] = phi
        r = self.r
        np.multiply(l, inv, out=r)
        if private:                                     # the reward width (module docstring) / n^
            aug[..., S + 1] = wd.t_noise * inv
            aug[..., S + 2] = wd.t_round * inv
            rbar = np.minimum((np.maximum(l, 0.0) + wd.r_noise + wd.r_round) / lo, 1.0)
            r += (np.sqrt(wd.r_noise ** 2 + (wd.r_noise_n * rbar) ** 2) + wd.r_round + wd.r_round_n * rbar) * inv
        r += phi
        np.minimum(r, 1.0, out=r)
        if self.penalty is not None:                    # inadmissible actions out of every max (``MASK_PENALTY``)
            r += self.penalty
        if self.small:
            return self._induct_scalar()
        return self._induct_arrays()

    def _induct_arrays(self) -> np.ndarray:
        """The backward induction with one NumPy call per operation (any S, A)."""
        Hc, S, H = self.Hc, self.S, self.H
        aug, r = self.aug, self.r
        va, y, Q = self.va, self.y, self.Q
        va[:] = 0.0
        Q2 = Q.reshape(H, S * self.A)
        W = va[:S]
        cols = self.cols
        dot, minimum, maximum, add = np.dot, np.minimum, np.maximum, np.add
        vmax_r, vmin_r, sqrt = np.maximum.reduce, np.minimum.reduce, math.sqrt
        mix, s2 = self.mix, self.s2
        c = vmax = 0.0
        for h in range(H - 1, -1, -1):
            hc = 0 if Hc == 1 else h
            va[S] = self.h_left[h]
            dot(aug[hc], va, out=y)                     # m~.W / n~ + (H - h) phi + noise widths
            y += c
            minimum(y, vmax, out=y)
            add(r[hc], y, out=Q2[h])
            qa = cols[h]                                # V_h = max_a Q_h (columns), then W = V_h - min V_h
            maximum(qa[0], qa[-1], out=W)
            for col in qa[1:-1]:
                maximum(W, col, out=W)
            vmax = float(vmax_r(W))
            c = float(vmin_r(W))
            W -= c
            w = vmax - c
            ww = float(dot(W, W))
            va[S + 1] = sqrt(max(ww, ww - 2 * w * mix * float(W.sum()) + w * w * s2))
            va[S + 2] = w
        return Q

    def _induct_scalar(self) -> np.ndarray:
        """The same induction for small ``S A``: the two products stay the same BLAS calls on the same
        arrays (``aug[hc] @ va`` and ``W . W``), every elementwise step (``+ c``, ``min``, ``+ r``,
        ``max_a``, ``- c``) runs on Python floats (IEEE double, the same correctly rounded operations
        as NumPy's), which avoids ~10 NumPy calls per step h."""
        Hc, S, A, H = self.Hc, self.S, self.A, self.H
        SA = S * A
        aug, va, vmv, y, ymv = self.aug, self.va, self.va_mv, self.y, self.y_mv
        r_rows = self.r.tolist()
        W = va[:S]
        va[:] = 0.0
        dot, sqrt = np.dot, math.sqrt
        rows = self.rows
        pairs = A == 2
        starts = range(0, SA, A)
        mix, s2 = self.mix, self.s2
        c = vmax = 0.0
        for h in range(H - 1, -1, -1):
            hc = 0 if Hc == 1 else h
            vmv[S] = self.h_left[h]
            dot(aug[hc], va, out=y)                     # m~.W / n~ + (H - h) phi + noise widths
            q = [ri + (t if (t := yi + c) < vmax else vmax) for ri, yi in zip(r_rows[hc], ymv.tolist())]
            rows[h] = q                                 # Q_h = r + min(y + c, max V_{h+1})
            if pairs:                                   # V_h = max_a Q_h
                v = [a if a > b else b for a, b in zip(q[0::2], q[1::2])]
            else:
                v = [max(q[i:i + A]) for i in starts]
            vmax = max(v)
            c = min(v)
            for i, x in enumerate(v):                   # W = V_h - min V_h, into va[:S]
                vmv[i] = x - c
            w = vmax - c
            ww = float(dot(W, W))
            vmv[S + 1] = sqrt(max(ww, ww - 2 * w * mix * float(W.sum()) + w * w * s2))
            vmv[S + 2] = w
        self.Q2[:] = rows
        return self.Q


def _ubev_phi(xp, n, log_term: float):
    """UBEV's bonus ``phi = sqrt((2 ln ln max(e, n) + ln(18 S A H / delta)) / n)`` elementwise, with
    ``_UNVISITED_BONUS`` where ``n = 0`` (``log_term`` = ``ln(18 S A H / delta)``)."""
    nn = xp.where(n > 0, n, 1.0)
    lnln = xp.log(xp.log(xp.where(n > math.e, n, math.e)))
    phi = xp.sqrt((2 * lnln + log_term) / nn)
    return xp.where(n > 0, phi, _UNVISITED_BONUS)


class _UBEVPlanner:
    """UBEV's per-episode plan on CPU: the same arithmetic as ``_backward(mode="ubev")`` (bit for bit),
    with every work array allocated once and about 6 NumPy calls per step h.

    UBEV's counts are exact integers, so ``phi`` is read from a table indexed by the count (built with
    ``_ubev_phi`` itself, grown on demand) instead of evaluating two logs and a square root on every
    entry of every plan. ``l, n, m`` are the learner's views of its statistics buffers (read each plan).
    """

    def __init__(self, l: np.ndarray, n: np.ndarray, m: np.ndarray, log_term: float):
        H, S, A = n.shape
        self.l, self.n, self.m, self.log_term = l, n, m, log_term
        self.table = np.empty(0)
        self.idx = np.empty((H, S, A), dtype=np.intp)
        self.phi, self.nn, self.inv = (np.empty((H, S, A)) for _ in range(3))
        self.r, self.width, self.Q = (np.empty((H, S, A)) for _ in range(3))
        self.h_left = np.arange(H - 1, -1, -1, dtype=np.float64).reshape(H, 1, 1)     # H - h (1-based h)
        self.mn = np.empty((H, S, A, S))                                                # m / n
        self.V = np.zeros((H + 1, S))                                                   # V[H] = 0
        self.y = np.empty(S * A)
        self.v_max = np.zeros(())
        mn, w, r, Q = self.mn.reshape(H, S * A, S), self.width.reshape(H, S * A), self.r.reshape(H, S * A), \
            self.Q.reshape(H, S * A)
        # per step h (backwards): the views its operations read and write, made once. max_a Q_h is
        # chained np.maximum over the columns Q_h(., a) for A <= 4 (cheaper than a reduction).
        self.by_columns = A <= 4
        q_a = lambda h: [self.Q[h][:, a] for a in range(A)] if self.by_columns else self.Q[h]
        self.steps = [(mn[h], self.V[h + 1], w[h], r[h], Q[h], self.V[h], q_a(h)) for h in range(H - 1, -1, -1)]
        self.small_s = S <= 64        # max_s V_h via a Python list (cheaper than a reduction)
        self.penalty = None           # ``mask_penalty`` [S, A], set by the learner

    def _grow(self) -> None:
        size = max(2 * self.table.size, int(self.n.max()) + 1, 1024)
        self.table = _ubev_phi(np, np.arange(size, dtype=np.float64), self.log_term)

    def plan(self) -> np.ndarray:
        n = self.n
        np.copyto(self.idx, n, casting="unsafe")         # exact counts: integers
        try:
            np.take(self.table, self.idx, out=self.phi)
        except IndexError:                               # a count beyond the table
            self._grow()
            np.take(self.table, self.idx, out=self.phi)
        nn, phi, r = self.nn, self.phi, self.r
        np.maximum(n, 1.0, out=nn)                       # = where(n > 0, n, 1) for counts
        np.divide(self.l, nn, out=r)
        np.add(r, phi, out=r)
        np.minimum(r, 1.0, out=r)                        # min(1, l/n + phi)
        if self.penalty is not None:                     # inadmissible actions out of every max
            r += self.penalty
        np.multiply(self.h_left, phi, out=self.width)    # (H - h) phi
        np.divide(1.0, nn, out=self.inv)
        np.multiply(self.m, self.inv[..., None], out=self.mn)
        y, v_max, small_s, by_columns = self.y, self.v_max, self.small_s, self.by_columns
        v_max[()] = 0.0
        matmul, add, minimum, maximum, amax = np.matmul, np.add, np.minimum, np.maximum, np.maximum.reduce
        for mn_h, v_next, w_h, r_h, q_h, v_h, q_a in self.steps:
            matmul(mn_h, v_next, out=y)                  # m V_{h+1} / n
            add(y, w_h, out=y)
            minimum(y, v_max, out=y)                     # min(max V_{h+1}, m V / n + (H - h) phi)
            add(r_h, y, out=q_h)                         # Q_h
            if by_columns:                               # V_h = max_a Q_h (exact either way)
                maximum(q_a[0], q_a[-1], out=v_h)
                for c in q_a[1:-1]:
                    maximum(v_h, c, out=v_h)
            else:
                amax(q_a, -1, out=v_h)
            if small_s:                                  # max_s V_h
                v_max[()] = max(v_h.tolist())
            else:
                amax(v_h, out=v_max)
        return self.Q


def _backward(xp, m, inv_n, bonus, r, *, mode: str, cap: float = 0.0, H: int | None = None, penalty=None):
    """Backward induction over h = H-1..0 with ``V_H = 0``, vectorized over (s, a); the empirical
    next-state value is ``(m(s,a,.,h) . V_{h+1}) / n`` (the normalized transition table is never formed):

    * ``ubev``: ``Q_h = r + min(m V_{h+1} / n + bonus, max_s V_{h+1}(s))`` (``r`` = the clipped reward term);
    * ``pucb``: ``Q_h = min(cap, max((r + m V_{h+1}) / n, 0) + bonus)`` (``r`` = the reward sums).

    Args:
        xp: ``numpy`` (CPU views) or ``torch``.
        m: [Hc, S, A, S] transition counts; inv_n, bonus, r: [Hc, S, A], with ``Hc = H`` (per step) or 1
            (pooled over h: every step reads the same statistics; ``bonus`` may still have H rows).
        H: the horizon (default: the statistics' Hc).
        penalty: ``mask_penalty`` [S, A] (NumPy) added to every Q_h before its maximum: the maxima and the greedy
            policy range over the admissible actions only; None: every action.

    Returns:
        Q [H, S, A] (float64); ``V_h(s) = max_a Q_h(s, a)``.
    """
    Hc, S, A = r.shape
    H = Hc if H is None else int(H)
    pooled = Hc == 1 < H
    if pooled:      # no second table the size of m: (m V) / n per step (a pooled plan has H mat-vecs on one table)
        m2, inv2 = m.reshape(1, S * A, S), inv_n.reshape(1, S * A)
    else:
        m_over_n = (m * inv_n[..., None]).reshape(Hc, S * A, S)  # one pass, then one matvec per step
    b2 = bonus.reshape(-1, S * A)
    r2 = r.reshape(Hc, S * A) if mode == "ubev" else (r * inv_n).reshape(Hc, S * A)
    Q = xp.zeros_like(r2) if Hc == H else (np.zeros((H, S * A)) if xp is np else
                                           torch.zeros((H, S * A), dtype=r2.dtype, device=r2.device))
    Q3 = Q.reshape(H, S, A)
    V = xp.zeros_like(r2[0, :S])
    amax = np.maximum.reduce if xp is np else torch.amax
    zero, top = V[0] * 0, V[0] * 0 + cap
    v_max = zero
    pen = None
    if penalty is not None:
        pen = np.asarray(penalty).reshape(S * A)
        pen = pen if xp is np else torch.as_tensor(pen, dtype=r2.dtype, device=r2.device)
    for h in range(H - 1, -1, -1):
        hc, hb = (h if Hc > 1 else 0), (h if b2.shape[0] > 1 else 0)
        y = (m2[0] @ V) * inv2[0] if pooled else m_over_n[hc] @ V
        if mode == "ubev":
            y += b2[hb]
            xp.minimum(y, v_max, out=y)
            xp.add(r2[hc], y, out=Q[h])
            if pen is not None:
                Q[h] += pen
            V = amax(Q3[h], -1)
            v_max = amax(V, 0)
        else:
            y += r2[hc]
            xp.maximum(y, zero, out=y)
            y += b2[hb]
            xp.minimum(y, top, out=Q[h])
            if pen is not None:
                Q[h] += pen
            V = amax(Q3[h], -1)
    return Q3


def certainty_equivalent(l, n, m, *, horizon: int, penalty=None, floor: float = 0.0, gate: float = 0.0,
                         tol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """The greedy policy of the certainty-equivalent model of (released) statistics, without optimism: what the
    optimistic learners release as their final policy (``TabularUCB.released_policy``). A post-processing of the
    statistics it is given.

    Model, per (s, a) (and per step h for per-step statistics), in the [0, 1] reward scale of the statistics:
    transitions ``m'(s, a, s') = m~`` where ``m~ >= max(floor, tiny)``, else 0 (denoising: ``floor`` a public multiple
    of the entries' noise std, 0 for exact counts); the pair is known when ``sum_s' m' > 0`` and its visits
    ``n~ > gate``; then ``P^ = m' / sum_s' m'`` and ``r^ = clip(l~ / n~, 0, 1)``. An unknown pair is worth 0 (the
    least reward of every remaining step: pessimism), an inadmissible one ``penalty`` (``mask_penalty``).

    Planning: statistics pooled over h ([1, S, A]): value iteration ``V_{k+1}(s) = max_a r^ + P^ V_k`` for
    ``horizon`` steps (the env's own episode limit) or until ``max |V_{k+1} - V_k| <= tol``, the policy the greedy
    one of the last step, one action per state (stationary, [S]); per-step statistics ([H, S, A]): backward
    induction over their H steps, a policy [H, S].

    Returns:
        (policy, values of the initial step [S]).
    """
    from scipy import sparse

    l, n, m = np.asarray(l, np.float64), np.asarray(n, np.float64), np.asarray(m, np.float64)
    Hc, S, A = n.shape
    pen = np.zeros(S * A) if penalty is None else np.asarray(penalty, np.float64).reshape(S * A)
    models = []
    for hc in range(Hc):
        mk = m[hc].reshape(S * A, S)
        i, j = np.nonzero(mk >= max(floor, 1e-12))         # the kept entries only: no dense copy of the counts
        v = mk[i, j]
        tot = np.bincount(i, weights=v, minlength=S * A)
        known = (tot > 0) & (n[hc].reshape(-1) > gate)
        scale = np.where(known, 1.0 / np.where(tot > 0, tot, 1.0), 0.0)
        P = sparse.csr_matrix((v * scale[i], (i, j)), shape=(S * A, S))
        r = np.where(known, np.clip(l[hc].reshape(-1) / np.where(n[hc].reshape(-1) > 0, n[hc].reshape(-1), 1.0),
                                    0.0, 1.0), 0.0)
        models.append((P, r + pen))
    V = np.zeros(S)
    if Hc == 1:
        P, r = models[0]
        q = r + P @ V
        for _ in range(int(horizon)):
            q = r + P @ V
            V_new = q.reshape(S, A).max(1)
            done = float(np.abs(V_new - V).max()) <= tol
            V = V_new
            if done:
                break
        return q.reshape(S, A).argmax(1).astype(np.int64), V
    policy = np.zeros((Hc, S), dtype=np.int64)
    for h in range(Hc - 1, -1, -1):
        P, r = models[h]
        q = (r + P @ V).reshape(S, A)
        policy[h] = q.argmax(1)
        V = q.max(1)
    return policy, V
