"""DP-UBEV: UBEV's optimism on privately released counts, with a bonus for the noise the counter adds.

Statistics. The reward sums ``l``, visits ``n`` and transitions ``m`` are released by a continual
counter (``algo.counter``: ``gaussian`` = the square-root factorization by default, ``gaussian_tree``,
or PUCB's ``laplace_tree``), per step h (``pool_steps=false``, the papers' layout) or pooled over h
(``pool_steps=true``, default: the MDPs of this project are time-homogeneous, so the statistics of
different steps estimate the same reward and transition; ``dppo.privacy.tabular_counters`` derives the
larger per-user sensitivity of pooled counts). Every quantity below is computed from the released
counts and public constants only, so the policy served to every user is a post-processing of the
counter's output (billboard lemma): the learner is (eps, delta)-joint-DP with the counter's guarantee.

Planning (per episode; 1-based step h, ``V_{H+1} = 0``; for the noise, E = z sigma_t with sigma_t the
exact std of the current release and z the two-sided union quantile over the ``4 S A H_c T`` released
quantities the plans read; beta = delta_ubev = failure_prob / 2 when private):

* ``n_lo = n~ - E`` (a lower confidence bound on the true count); a pair is *open* when ``n_lo > 0``,
  else it is treated as unvisited (``Q = 1 + max V_{h+1}``, UBEV's rule);
* ``phi = sqrt((2 ln ln max(e, n_lo) + ln(18 S A H / delta)) / n_lo)`` (UBEV's bonus at the lower count);
* reward term ``min(1, l~/n~ + phi + E (1 + rbar)/n~)``: ``|l~/n~ - l/n| <= (|xi_l| + (l/n) |xi_n|) / n~``
  and ``l/n <= rbar = min(1, (l~ + E) / n_lo)``;
* next-state term, with ``M~ = sum_s' m~(s, a, s')`` (a second estimate of the visits: every visit
  records one transition), ``c = min V_{h+1}`` and ``W = V_{h+1} - c >= 0`` (span ``w = max W``):
  ``min(max V_{h+1}, c + m~.W/M~ + (H - h) phi + z sigma_t (||W||_2 + sqrt(S) w) / M~)``.
  Since ``m~.V/M~ = c + m~.W/M~`` exactly, ``m~.W/M~ - m.W/M = (xi_m.W - (m.W/M) sum xi_m) / M~`` with
  ``xi_m.W ~ N(0, sigma_t^2 ||W||_2^2)`` and ``sum xi_m ~ N(0, S sigma_t^2)`` (the S entries' noises are
  independent): the slack uses the noise's actual distribution (an L2 projection instead of S
  worst-case entry errors ``E ||W||_1``) and scales with the *span* of V, not its level - while every
  value is still at its optimistic cap the span is small and the slack vanishes, which is what
  keeps the prototype's ``(H - h) E / n`` offset from pinning Q at the cap. A pair is open when
  ``n~ > E`` and ``M~ > z sigma_t sqrt(S)``. With the Laplace tree the entrywise worst case is used.

With exact counts (``eps=null``: E = 0, sigma = 0) and ``pool_steps=false`` this is UBEV (Dann et al.
2017) on the same counts. Guarantee relied upon: the privacy guarantee is proved (counter + billboard);
the regret is NOT covered by a theorem here - the noise terms are a valid confidence bound only if V
were independent of the noise of the pair it multiplies (it is computed from all released counts),
and pooling assumes a time-homogeneous MDP: treat the regret behaviour as a heuristic, measured in
``runs/reference/tabular.md``.
"""
from __future__ import annotations

import math

import numpy as np

from dppo.algos.ucb import _UNVISITED_BONUS, TabularUCB
from dppo.privacy.gaussian_counter import GRID, gaussian_union_quantile
from dppo.privacy.tabular_counters import record_counter_releases
from dppo.privacy.tree_counter import TreeCounter


class DPUBEV(TabularUCB):
    """UBEV on counts released by a Gaussian (default) or Laplace continual counter (module docstring).

    Args (beyond ``TabularUCB``'s):
        counter: ``gaussian`` | ``gaussian_sqrt`` | ``gaussian_tree`` | ``laplace_tree``.
        pool_steps: pool the statistics over h (time-homogeneous MDPs).
        pool_cap: pooled, keep the first ``pool_cap`` visits of each (s, a) per episode (null: all H);
            the per-user sensitivity is ``sqrt(6 cap H)`` (``dppo.privacy.tabular_counters``).
    """

    name = "dp_ubev"

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, counter: str = "gaussian", pool_steps: bool = True,
                 pool_cap: int | None = 1, max_memory_gb: float = 4.0):
        eps = privacy.eps if privacy is not None and privacy.private else None
        super().__init__(env, privacy=privacy, sampler=sampler, seed=seed, episodes=episodes,
                         episodes_default=episodes_default, episodes_per_round=episodes_per_round,
                         failure_prob=failure_prob, reward_bound=reward_bound,
                         max_memory_gb=max_memory_gb, counter=counter, pool_steps=pool_steps,
                         pool_cap=pool_cap)
        self.eps = eps
        self.private = eps is not None
        self.delta_ubev = self.failure_prob / 2 if self.private else self.failure_prob
        self.beta = self.failure_prob / 2
        Hc = 1 if self.layout.pooled else self.H
        self.releases_used = 4 * Hc * self.S * self.A * self.T      # quantities the T plans read
        self.z = gaussian_union_quantile(self.beta, self.releases_used) if self.private else 0.0
        self.laplace = isinstance(self.stats, TreeCounter)
        self._laplace_E = self.stats.error_bound(self.beta, uniform=True) if self.laplace and self.private else 0.0
        self._plan_state = None
        self._last_E = 0.0

    @classmethod
    def accountant_name(cls, privacy_cfg, algo_cfg=None) -> str:
        return "zcdp"

    @classmethod
    def releases_pure_dp(cls, cfg) -> bool:
        return (cfg.algo.get("counter") or "gaussian") == "laplace_tree"

    @classmethod
    def releases_carry_rho(cls, cfg) -> bool:
        return not cls.releases_pure_dp(cfg)

    def lost_attempt_charges(self, lost_rounds: list[int]) -> list[dict]:
        """Charges for a crashed attempt (secure noise, on resume): the noise drawn after the checkpoint
        is drawn again and the redrawn releases also cover earlier users, so those users enter a second
        copy of the continual release: charged as a second copy of the counters' entries (an upper
        bound), as for PUCB."""
        if not self.private:
            return []
        return [dict(e) for e in self.privacy.ledger.entries
                if e["mechanism"].endswith("counter") and not e.get("replay") and not e.get("lost")]

    def _log_term(self) -> float:
        return math.log(18 * self.S * self.A * self.H / self.delta_ubev)

    def on_first_round(self) -> None:
        if self.private:
            record_counter_releases(self.privacy, self.stats, self.layout, self.T)

    # ---- the noise's error bound at the current release ---------------------------------------
    def noise_std(self) -> float:
        """Exact std of every stream's current release error (Laplace: its worst-case bound / z)."""
        if not self.private:
            return 0.0
        if self.laplace:
            return float("nan")
        return self.stats.release_std()

    def count_error_bound(self) -> float:
        """E for the current release: ``z sigma_t + Lambda/2`` (Gaussian), the tree's uniform bound (Laplace)."""
        if not self.private:
            return 0.0
        if self.laplace:
            return self._laplace_E
        return self.z * self.stats.release_std() + GRID / 2

    def final_count_error_bound(self) -> float:
        """E at the last episode T (the largest Gaussian release std over the run for the factorization)."""
        if not self.private or self.laplace:
            return self.count_error_bound()
        return self.z * self.stats.release_std(self.T) + GRID / 2

    def gate_open_fraction(self) -> float:
        """Share of released (s, a[, h]) with ``n~ > E`` (computed from released counts only)."""
        _, n, _ = self.released_stats()
        return float((n > self.count_error_bound()).sum()) / n.size

    def train_round(self, round_idx: int) -> dict:
        metrics = super().train_round(round_idx)
        metrics["counters/gate_open_fraction"] = self.gate_open_fraction()
        return metrics

    def summary(self) -> dict:
        return {**super().summary(), "gate_open_fraction": self.gate_open_fraction(),
                "noise_std": self.noise_std(), "pooled": self.layout.pooled, "counter": self.counter_kind}

    # ---- planning -------------------------------------------------------------------------------
    def _plan(self):
        l, n, m = self.released_stats()
        st = self._plan_state
        if st is None or st.n is not n:
            st = self._plan_state = _PlanArrays(l, n, m, self.H)
        S = self.S
        if self.laplace or not self.private:
            E = self.count_error_bound()
        else:                                           # = count_error_bound(), the std read once per plan
            std = self.stats.release_std()
            E = self.z * std + GRID / 2
        if self.laplace:                                # worst case per entry: |xi.W| <= E ||W||_1 <= E S span
            a_norm, a_span, E_m = 0.0, 2 * E * S, E * S
        else:                                           # xi.W ~ N(0, sigma_t^2 ||W||^2), sum xi ~ N(0, S sigma_t^2)
            zs = self.z * (std if self.private else self.noise_std())
            a_norm = zs + GRID / 2 * math.sqrt(S)       # (+ rounding of the S entries: <= GRID/2 ||W||_1)
            E_m = zs * math.sqrt(S) + GRID / 2 * S
            a_span = E_m
        return st.plan(self._log_term(), E, a_norm, a_span, E_m, self.private)


class _PlanArrays:
    """Work arrays of DP-UBEV's backward induction (allocated once; NumPy on CPU).

    Per plan: ``aug[hc] = [m~/n~ | phi | a_norm/n~ | a_max/n~]`` ([S*A, S + 3]) so that one mat-vec with
    ``[V_{h+1}, H - h, ||V_{h+1}||_2, max V_{h+1}]`` gives the whole next-state term of every (s, a).
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

    def plan(self, log_term: float, E: float, a_norm: float, a_span: float, E_m: float, private: bool) -> np.ndarray:
        Hc, S, A, H = self.Hc, self.S, self.A, self.H
        n = self.n.reshape(Hc, S * A)
        l = self.l.reshape(Hc, S * A)
        m = self.m.reshape(Hc, S * A, S)
        mt = m.sum(-1)                                  # M~ = sum_s' m~: a second estimate of the visits
        n_lo = n - E
        open_ = (n_lo > 0) & (mt > E_m)
        nn = np.where(open_, n, 1.0)
        lo = np.where(open_, n_lo, 1.0)
        phi = np.sqrt((2 * np.log(np.log(np.maximum(lo, math.e))) + log_term) / lo)
        phi = np.where(open_, phi, _UNVISITED_BONUS)
        inv = 1.0 / nn
        inv_m = np.where(open_, 1.0 / np.where(open_, mt, 1.0), 1.0)
        aug = self.aug
        np.multiply(m, inv_m[..., None], out=aug[..., :S])
        aug[..., S] = phi
        r = self.r
        np.multiply(l, inv, out=r)
        if private:                                     # |xi_l| + (l/n)|xi_n| with l/n <= min(1, (l~ + E)/n_lo)
            aug[..., S + 1] = a_norm * inv_m
            aug[..., S + 2] = a_span * inv_m
            rbar = np.minimum((np.maximum(l, 0.0) + E) / lo, 1.0)
            r += E * (1.0 + rbar) * inv
        r += phi
        np.minimum(r, 1.0, out=r)
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
        c = vmax = 0.0
        for h in range(H - 1, -1, -1):
            hc = 0 if Hc == 1 else h
            va[S] = self.h_left[h]
            dot(aug[hc], va, out=y)                     # m~.W / M~ + (H - h) phi + noise slack
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
            va[S + 1] = sqrt(float(dot(W, W)))
            va[S + 2] = vmax - c
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
        c = vmax = 0.0
        for h in range(H - 1, -1, -1):
            hc = 0 if Hc == 1 else h
            vmv[S] = self.h_left[h]
            dot(aug[hc], va, out=y)                     # m~.W / M~ + (H - h) phi + noise slack
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
            vmv[S + 1] = sqrt(dot(W, W))
            vmv[S + 2] = vmax - c
        self.Q2[:] = rows
        return self.Q
