"""DP-UBEV: UBEV's optimism on privately released counts, with confidence widths for the noise the counter adds.

Statistics. The reward sums ``l``, visits ``n`` and transitions ``m`` are released by a continual
counter (``algo.counter``: ``gaussian`` = the square-root factorization by default, ``gaussian_tree``,
or PUCB's ``laplace_tree``), per step h (``pool_steps=false``, the papers' layout) or pooled over h
(``pool_steps=true``, default: for time-homogeneous MDPs the statistics of different steps estimate the
same reward and transition; ``dppo.privacy.tabular_counters`` derives the larger per-user sensitivity of
pooled counts). The counters release after geometrically growing blocks of episodes (``block_growth``,
``dppo.privacy.tabular_counters.release_schedule``; each block is one counter time step, every user in one
block) and the policy is re-planned after every release. Every quantity below is computed from the
released counts and public constants only, so the policy served to every user is a post-processing of
the counter's output (billboard lemma): the learner is (eps, delta)-joint-DP with the counter's guarantee.
The Gaussian counters' whole release is one Gaussian mechanism; it is calibrated and accounted exactly
(``accountant_name``: ``gdp``, the analytic Gaussian mechanism, ``dppo.privacy.tabular_counters.counter_sigma``)
rather than through a zCDP conversion (7% less noise at eps 5, 8% at eps 1, delta 1e-5); with
``privacy.accountant=zcdp`` the zCDP calibration is used.

Confidence widths (per plan; 1-based step h, ``V_{H+1} = 0``). Write the released counts of a pair as
``n~ = n + xi_n``, ``l~ = l + xi_l``, ``m~ = m + xi_m`` (S entries) around the exact counts of the twin
(the same learner with ``eps=null``), ``sigma_t`` the exact std of every entry's Gaussian release error
(``release_std``), rounding to the release grid ``Lambda`` (<= Lambda/2 per entry) aside. The noise of one
pair's release is exactly ``N(0, sigma_t^2 I)`` in ``(xi_l, xi_n, xi_m)`` whatever the data did (it is a
fixed linear map of noise drawn independently of the data, Denisov et al. 2022), so with beta =
failure_prob / 2 split in thirds over the ``N = H_c S A B`` pair-releases the plans read (B releases):

* ``|xi_n| <= E = z sigma_t + Lambda/2``, z the two-sided normal union quantile (``gaussian_union_quantile``);
* ``||(xi_l, xi_n)||_2 <= q_2 sigma_t`` and ``||(xi_m, xi_n)||_2 <= q_{S+1} sigma_t``, q_k the union
  quantile of a chi distribution with k degrees of freedom (``chi_union_quantile``). A norm bound holds in
  every direction at once, so the widths below stay valid although V and the empirical means depend on
  the noise (every plan reads all released counts).

The visits are estimated by ``n^ = (1 - b) n~ + b M~`` with ``M~ = sum_s' m~`` (every kept visit records
one transition, so ``sum_s' m = n`` exactly): with ``b = 1/(S+1)`` (inverse-variance weights; ``M~`` has
variance ``S sigma_t^2``) its error ``xi^ = (1 - b) xi_n + b sum xi_m`` has std ``s sigma_t``,
``s^2 = (1 - b)^2 + b^2 S = S/(S+1)`` (``b = 0``: the released visits alone, as with exact counts).

* ``|xi^| <= E = z s sigma_t + rounding``, z the two-sided normal union quantile (``gaussian_union_quantile``);
* ``||(xi_l, xi^/s)||_2 <= q_2 sigma_t`` (two independent fixed functionals of the noise) and
  ``||(xi_m, xi_n)||_2 <= q_{S+1} sigma_t``, q_k the union quantile of a chi distribution with k degrees of
  freedom (``chi_union_quantile``). A norm bound holds in every direction at once, so the widths below stay
  valid although V and the empirical means depend on the noise (every plan reads all released counts).

Unequal noise per set (``set_noise = (c_l, c_n, c_m)``, ``dppo.privacy.tabular_counters``): the entries of
the three sets have stds ``c_l sigma_t``, ``c_n sigma_t``, ``c_m sigma_t``. Everything above holds with the
noise standardized per set: ``b = c_n^2 / (c_n^2 + S c_m^2)`` (inverse-variance weights), ``s^2 = (1 - b)^2
c_n^2 + b^2 S c_m^2``; ``(xi_l / c_l, xi^ / s)`` and ``(xi_m / c_m, xi_n / c_n)`` are standard normal vectors
(in units of ``sigma_t``) with the same chi quantiles, so the reward width is ``q_2 sigma_t sqrt(c_l^2 + s^2
rbar^2)``, the bound on ``l`` in ``rbar`` uses ``q_2 c_l sigma_t``, and the next-state direction has squared norm
``c_m^2 (||W||^2 - 2 p b sum W) + p^2 s^2`` (convex in p: the same two endpoints), i.e. ``t_noise = q_{S+1} c_m
sigma_t`` with ``s2 = s^2 / c_m^2`` in the width below. Equal multipliers give the formulas above.

On that event (probability >= 1 - beta) a pair with ``n^ > E`` has ``n >= n_lo = n^ - E > 0``, and:

* running lower count (``running_lower_count``, default): the event holds at every release at once and the
  exact counts never decrease, so ``n_j >= n_k >= n^_k - E_k`` for every earlier release k: the plan of
  release j uses ``n_lo_j = max_{k <= j} (n^_k - E_k)`` (a running maximum over the releases planned so far,
  a post-processing of released counts; the pair is open when ``n_lo_j > 0`` and ``n^_j > 0``). It lifts
  the lower count wherever the current release's noise happens to be negative, at no cost in probability;

* reward: ``l~/n^ - l/n = (xi_l - r xi^) / n^`` with ``r = l/n in [0, rbar]``,
  ``rbar = min(1, (max(l~, 0) + q_2 sigma_t + Lambda/2) / n_lo)``, so
  ``|l~/n^ - l/n| <= (q_2 sigma_t sqrt(1 + s^2 rbar^2) + rounding) / n^``;
* next state, with ``c = min V_{h+1}``, ``W = V_{h+1} - c >= 0``, ``w = max W`` (the span): the twin's
  ``m.V/n = c + m.W/n``, and the learner uses ``c + m~.W/n^``; the difference is
  ``<(xi_m, xi_n), (W - p b 1, -p (1 - b))> / n^`` with ``p = m.W/n in [0, w]``; the squared norm of that
  direction, ``||W||^2 - 2 p b sum W + p^2 s^2``, is convex in p, so at most its value at p = 0 or p = w, and
  ``|.| <= (q_{S+1} sigma_t sqrt(max(||W||^2, ||W||^2 - 2 w b sum W + w^2 s^2)) + rounding) / n^``
  (Cauchy-Schwarz);
* UBEV's bonus ``phi(n) = sqrt((2 ln ln max(e, n) + ln(18 S A H / delta)) / n)`` is decreasing in n,
  so it is taken at the lower count ``n_lo``.

The rounding of the released entries to the grid adds at most ``Lambda/2`` per entry: ``Lambda/2 ((1 - b) +
b S)`` to E, ``Lambda/2 (1 + rbar (1 + S))`` to the reward width and ``Lambda/2 (2S + 1) w`` to the
next-state width (all divided by ``n^``).

Plan: ``Q_h = min(1, l~/n^ + phi + reward width) + min(max V_{h+1}, c + m~.W/n^ + (H - h) phi + next-state
width)`` for an open pair (``n^ > E``); a closed pair is treated as unvisited (``Q_h = 1 + max V_{h+1}``,
UBEV's rule). The widths only add to the twin's UBEV bounds, so wherever UBEV's own confidence set holds
for the twin's (pooled) statistics, the plan is optimistic. With ``counter=laplace_tree`` E is the tree's
uniform entrywise bound, ``b = 0``, and the widths use it entrywise (``E (1 + rbar)``, ``E (S + 1) w``).

With exact counts (``eps=null``: no widths), ``pool_steps=false`` and ``block_growth=null`` this is UBEV
(Dann et al. 2017) on the same counts. Guarantee relied upon: the privacy guarantee is proved (counter +
billboard) and the noise event is exact; the regret is NOT covered by a theorem here - pooling assumes a
time-homogeneous MDP (``runs/reference/tabular.md`` measures what happens when it is not), and the
widths are UBEV's with the noise added, not a new analysis: treat the regret as measured.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from dppo.algos.tabular_plan import PlanArrays, Widths
from dppo.algos.ucb import TabularUCB
from dppo.errors import ConfigError
from dppo.privacy.gaussian_counter import GRID, chi_union_quantile, gaussian_union_quantile, sqrt_factorization
from dppo.privacy.tabular_counters import counter_kappa, counter_sigma, record_counter_releases, resolve_counter
from dppo.privacy.tree_counter import TreeCounter


class DPUBEV(TabularUCB):
    """UBEV on counts released by a Gaussian (default) or Laplace continual counter (module docstring).

    Args (beyond ``TabularUCB``'s):
        failure_prob: split in halves: UBEV's delta and, when private, the counters' beta.
        counter: ``gaussian`` (= ``gaussian_opt``: the optimized factorization for at most 320 counter steps,
            else ``gaussian_sqrt``) | ``gaussian_sqrt`` | ``gaussian_tree`` | ``laplace_tree``.
        pool_steps: pool the statistics over h (time-homogeneous MDPs).
        pool_cap: pooled, keep the first ``pool_cap`` visits of each (s, a) per episode (null: all H);
            the per-user sensitivity is ``sqrt(6 cap H)`` (``dppo.privacy.tabular_counters``).
        block_growth: release the counters after blocks of episodes growing by this factor (null: after
            every episode); the policy is re-planned once per block.
        set_noise: Gaussian counters: noise multipliers of the (rewards, visits, transitions) sets (null:
            equal); the transitions carry the largest widths, so less noise there lowers the regret. Default
            (2, 2, 1): the transitions get 2/3 of the zCDP budget (picked on RiverSwim H = 10, T = 10^5, seeds
            100-102, among (1,1,1), (2,1,1), (2,2,1), (2,4,1), (4,1.5,1)); ignored by ``laplace_tree``.
        max_block: the longest block in episodes (null: no limit): a plan that explores a poor action
            costs at most that many episodes before the next release.
        running_lower_count: the lower count is the running maximum of ``n^ - E`` over the releases so far
            (module docstring); false: the current release's only.
        release_threshold: the released policy (``TabularUCB.released_policy``) plans on the released transition
            counts above this many noise stds (the rest set to 0); the optimistic plan that serves the users reads
            them all.
        counter_focus: ``gaussian_opt`` (the default ``gaussian`` with block releases): its factorization is
            optimized for the mean release std over the releases after ``counter_focus x E_j`` episodes
            (``E_j`` the gate of release j under the square-root factorization; a pooled count after t
            episodes is at most ``cap t``, so earlier releases open few gates); the earlier ones get weight
            1e-3 (``_counter_row_weights``). null: all releases equally.
    """

    name = "dp_ubev"

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, counter: str = "gaussian", pool_steps: bool = True,
                 pool_cap: int | None = 1, block_growth: float | None = 1.05, max_block: int | None = None,
                 set_noise: tuple | None = (2.0, 2.0, 1.0), counter_focus: float | None = 5.0,
                 running_lower_count: bool = True, max_memory_gb: float = 1.25, release_threshold: float = 3.0):
        eps = privacy.eps if privacy is not None and privacy.private else None
        if counter_focus is not None and not counter_focus >= 0:
            raise ConfigError(f"counter_focus must be >= 0 (or null), got {counter_focus}")
        self.counter_focus = None if counter_focus is None else float(counter_focus)
        if not release_threshold >= 0:
            raise ConfigError(f"release_threshold must be >= 0, got {release_threshold}")
        self.release_threshold = float(release_threshold)
        super().__init__(env, privacy=privacy, sampler=sampler, seed=seed, episodes=episodes,
                         episodes_default=episodes_default, episodes_per_round=episodes_per_round,
                         failure_prob=failure_prob, reward_bound=reward_bound, max_memory_gb=max_memory_gb,
                         counter=counter, pool_steps=pool_steps, pool_cap=pool_cap, block_growth=block_growth,
                         max_block=max_block,
                         set_noise=None if set_noise is None or resolve_counter(counter) == "laplace_tree"
                         else tuple(set_noise))
        self.eps = eps
        self.private = eps is not None
        self.delta_ubev = self.failure_prob / 2 if self.private else self.failure_prob
        self.beta = self.failure_prob / 2
        Hc = 1 if self.layout.pooled else self.H
        self.releases = self.T if self.release_ends is None else len(self.release_ends)
        self.pair_releases = Hc * self.S * self.A * self.releases       # (pair, release) the plans read
        self.laplace = isinstance(self.stats, TreeCounter)
        self.z = self.q_reward = self.q_next = 0.0
        self.mix = 0.0                  # weight of M~ = sum_s' m~ in the visits estimate (module docstring)
        self.c_l, self.c_n, self.c_m = self.layout.set_noise      # noise multipliers of the three sets
        self._laplace_E = 0.0
        if self.private and self.laplace:
            self._laplace_E = self.stats.error_bound(self.beta, uniform=True)
        elif self.private:
            self.z = gaussian_union_quantile(self.beta / 3, self.pair_releases)
            self.q_reward = chi_union_quantile(self.beta / 3, self.pair_releases, 2)
            self.q_next = chi_union_quantile(self.beta / 3, self.pair_releases, self.S + 1)
            cn2, Scm2 = self.c_n ** 2, self.S * self.c_m ** 2
            self.mix = cn2 / (cn2 + Scm2)          # inverse-variance weights of n~ and M~
        self._plan_state = None
        self.running_lower_count = bool(running_lower_count) and self.private
        self.register_buffer("count_floor", torch.full((Hc, self.S, self.A), -math.inf, dtype=torch.float64))

    @classmethod
    def accountant_name(cls, privacy_cfg, algo_cfg=None) -> str:
        """``gdp`` for the Gaussian counters (one Gaussian mechanism, calibrated and accounted exactly:
        ``dppo.privacy.accountants.gdp``), ``zcdp`` for PUCB's Laplace tree (pure DP)."""
        return "zcdp" if cls.counter_of(algo_cfg) == "laplace_tree" else "gdp"

    @classmethod
    def releases_pure_dp(cls, cfg) -> bool:
        return cls.counter_of(cfg.algo) == "laplace_tree"

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

    def _counter_row_weights(self, capacity: int, privacy) -> tuple | None:
        """Weights of the optimized factorization's releases (``counter_focus``): 1 for release j whose block
        ends after ``counter_focus E_j`` episodes, 1e-3 before, with ``E_j = z s sigma_sqrt std_sqrt(j)`` the
        gate of the visits estimate under the square-root factorization (the same z, s as ``widths``). Public:
        a function of T, the schedule, the layout, eps, delta and failure_prob only."""
        if self.counter_focus is None:
            return None
        lay = self.layout
        Hc = 1 if lay.pooled else self.H
        z = gaussian_union_quantile(self.failure_prob / 2 / 3, Hc * self.S * self.A * capacity)
        _, c_n, c_m = lay.set_noise
        b = c_n ** 2 / (c_n ** 2 + self.S * c_m ** 2)
        s = math.sqrt((1 - b) ** 2 * c_n ** 2 + b * b * self.S * c_m ** 2)
        sigma = counter_sigma(privacy, lay.weighted_l2_sensitivity, counter_kappa("gaussian_sqrt", capacity))
        E = z * s * sigma * np.sqrt(sqrt_factorization(capacity)["var_factor"])
        ends = np.arange(1, capacity + 1) if self.release_ends is None else np.asarray(self.release_ends)
        return tuple(np.where(ends > self.counter_focus * E, 1.0, 1e-3).tolist())

    def _log_term(self) -> float:
        return math.log(18 * self.S * self.A * self.H / self.delta_ubev)

    def _denoising(self) -> tuple[float, float]:
        """The released policy's model (``TabularUCB.released_policy``): transition entries below
        ``release_threshold`` times their noise std are dropped (the noise of the many entries a pair never reaches
        would otherwise spread its mass over every state), pairs with ``n^ <= E`` are unknown."""
        if not self.private:
            return 0.0, 0.0
        std = self._laplace_E if self.laplace else self.stats.release_std() * self.c_m
        return self.release_threshold * std, self.count_error_bound()

    def on_first_round(self) -> None:
        if self.private:
            record_counter_releases(self.privacy, self.stats, self.layout, self.T)

    # ---- the noise's error bound at the current release ---------------------------------------
    def noise_std(self) -> float:
        """Exact std of every stream's current release error (Laplace: nan, its bound is E)."""
        if not self.private:
            return 0.0
        if self.laplace:
            return float("nan")
        return self.stats.release_std()

    def _visit_std_factor(self) -> tuple[float, float]:
        """(s, rounding factor) of the visits estimate: ``s = sqrt((1 - b)^2 c_n^2 + b^2 S c_m^2)`` (its std in
        units of ``sigma_t``), ``(1 - b) + b S``."""
        b, S = self.mix, self.S
        if self.c_n == self.c_m == 1.0:
            return math.sqrt((1 - b) ** 2 + b * b * S), (1 - b) + b * S
        return math.sqrt((1 - b) ** 2 * self.c_n ** 2 + b * b * S * self.c_m ** 2), (1 - b) + b * S

    def count_error_bound(self) -> float:
        """E for the current release: ``z s sigma_t + rounding`` (Gaussian), the tree's uniform bound (Laplace)."""
        return self.widths().E

    def final_count_error_bound(self) -> float:
        """E at the last release (the largest Gaussian release std over the run for the factorization)."""
        if not self.private or self.laplace:
            return self.count_error_bound()
        s, rs = self._visit_std_factor()
        return self.z * s * self.stats.release_std(self.releases) + GRID / 2 * rs

    def widths(self) -> Widths:
        """The width coefficients of the current release (module docstring; ``Widths``)."""
        if not self.private:
            return Widths()
        S = self.S
        if self.laplace:
            E = self._laplace_E
            return Widths(E=E, r_round=E, r_round_n=E, t_round=E * (S + 1))
        std = self.stats.release_std()
        s, rs = self._visit_std_factor()
        if self.layout.equal_noise:
            return Widths(E=self.z * s * std + GRID / 2 * rs, r_noise=self.q_reward * std,
                          r_noise_n=self.q_reward * s * std, r_round=GRID / 2, r_round_n=GRID / 2 * (1 + S),
                          t_noise=self.q_next * std, t_round=GRID / 2 * (2 * S + 1), mix=self.mix, s2=s * s)
        return Widths(E=self.z * s * std + GRID / 2 * rs, r_noise=self.q_reward * self.c_l * std,
                      r_noise_n=self.q_reward * s * std, r_round=GRID / 2, r_round_n=GRID / 2 * (1 + S),
                      t_noise=self.q_next * self.c_m * std, t_round=GRID / 2 * (2 * S + 1), mix=self.mix,
                      s2=(s / self.c_m) ** 2)

    def visits_estimate(self) -> np.ndarray:
        """``n^ = (1 - b) n~ + b sum_s' m~`` [Hc, S, A] from the released counts."""
        _, n, m = self.released_stats()
        return n if self.mix == 0 else (1 - self.mix) * n + self.mix * m.sum(-1)

    def gate_open_fraction(self) -> float:
        """Share of released (s, a[, h]) with ``n^ > E`` (computed from released counts only)."""
        n = self.visits_estimate()
        return float((n > self.count_error_bound()).sum()) / n.size

    def train_round(self, round_idx: int) -> dict:
        metrics = super().train_round(round_idx)
        metrics["counters/gate_open_fraction"] = self.gate_open_fraction()
        metrics["counters/releases"] = float(self.stats.steps_done)
        return metrics

    def summary(self) -> dict:
        return {**super().summary(), "gate_open_fraction": self.gate_open_fraction(),
                "noise_std": self.noise_std(), "pooled": self.layout.pooled, "counter": self.counter_kind,
                "releases": self.stats.steps_done}

    # ---- planning -------------------------------------------------------------------------------
    def _plan(self):
        l, n, m = self.released_stats()
        st = self._plan_state
        if st is None or st.n is not n:
            st = self._plan_state = PlanArrays(l, n, m, self.H)
            st.penalty = None if self.penalty is None else self.penalty.reshape(-1)
        floor = self.count_floor.numpy() if self.running_lower_count else None
        return st.plan(self._log_term(), self.widths(), self.private, floor)
