"""Tabular optimistic learners: UBEV (Dann et al. 2017) and PUCB (Vietri et al. 2020, eps-JDP).

Both keep the statistics of REFERENCE.md section 2 per step ``h``: reward sums ``l(s,a,h)``, visit
counts ``n(s,a,h)`` and transition counts ``m(s,a,s',h)``, in one flat vector of streams

    [ l: H*S*A | n: H*S*A | m: H*S*A*S ]      (index of (h, s, a) = (h*S + s)*A + a)

held by a ``TreeCounter``: exact for UBEV, the private binary-tree mechanism for PUCB. Each episode
is one user (ids from the one-pass sampler); the learner re-plans once per episode by vectorized
backward induction (O(H S^2 A), no loop over states) on the released statistics only (billboard
model: the policy is a post-processing of the private counts), runs the greedy policy, and feeds the
episode to the counters (one release per episode).

On CPU the per-episode planning runs on NumPy views of the torch buffers (no copy): a plan is ~150
tiny array operations and NumPy's per-operation overhead is several times lower than torch's; on
other devices the same code runs on torch tensors (``_xp``). UBEV's CPU plan (``_UBEVPlanner``)
writes into preallocated arrays and reads ``phi`` from a table indexed by the (integer) count: about
6 NumPy calls per step h, the same floats as the generic ``_backward`` (tested bit for bit).
"""
from __future__ import annotations

import bisect
import contextlib
import math

import numpy as np
import torch

from dppo.algos.base import EpisodeLearner
from dppo.envs.tabular import GymTabularEnv, TabularMDP, make_tabular
from dppo.errors import ConfigError
from dppo.algos.tabular_plan import (PlanArrays, Widths, _backward, _ubev_phi, _UBEVPlanner, certainty_equivalent,
                                     mask_penalty)
from dppo.envs.masks import mask_table
from dppo.privacy.tabular_counters import (TabularLayout, build_counter, counter_arrays, record_counter_releases,
                                           reference_error_bound, release_schedule, resolve_counter)
from dppo.privacy.tree_counter import TreeCounter


@contextlib.contextmanager
def _one_torch_thread():
    """Run a block with one torch intra-op thread, then restore the setting. A round's torch work is
    small operations (node noise, the batched policy evaluation); on a busy machine every parallel
    one waits for its second OpenMP thread to get a core: the exact evaluation of a 1000-episode
    RiverSwim round took 0.7 s with the default 2 threads at load 3 on 2 cores, 0.01 s with one.
    Random draws, elementwise kernels and per-matrix products give the same values with any thread
    count (the regret of the CLI runs is bit-identical)."""
    n = torch.get_num_threads()
    if n > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if n > 1:
            torch.set_num_threads(n)


def admissible_table(env, mdp) -> np.ndarray | None:
    """The env's public action mask table (``dppo.envs.masks.mask_table``) on the tabular env's S states: states
    the tabular env adds (absorbing copies, the state after an episode ends) admit every action; None without one."""
    if isinstance(env, TabularMDP) and getattr(env, "admissible", None) is None:
        return None
    source = getattr(mdp, "env", None) if isinstance(mdp, GymTabularEnv) else None   # the instance already made
    if source is None or getattr(env, "action_mask", "auto") == "none":
        source = env
    table = mask_table(source)
    if table is None:
        return None
    S, A = mdp.S, mdp.A
    if table.shape[1] != A or table.shape[0] > S:
        raise ConfigError(f"the env's action mask table has shape {table.shape}; expected at most {S} states x {A} "
                          f"actions")
    out = np.ones((S, A), dtype=bool)
    out[:table.shape[0]] = table
    out[~out.any(1)] = True
    return out


class TabularUCB(torch.nn.Module, EpisodeLearner):
    """Shared episode loop, statistics, regret bookkeeping and checkpointing of UBEV and PUCB.

    Args:
        env: a ``TabularMDP``, a gymnasium env with Discrete spaces, or a ``GymEnvFactory``.
        episodes: total episodes T (one user each); ``None`` uses ``episodes_default``.
        episodes_default: T when the top-level ``episodes`` is null; it fixes the counters' capacity, the release
            schedule and the calibration.
        episodes_per_round: episodes per trainer round (one log line per round).
        failure_prob: the confidence parameter (delta of UBEV, beta of PUCB).
        reward_bound: native reward range ``[-reward_bound, reward_bound]`` of a model-free env.
        max_memory_gb: refuse (ConfigError) statistics tables larger than this (1.25: a pooled DP-UBEV run on
            ICU-Sepsis at H = 20, the env's tables and the imports included, peaks below 2 GB).
        counter, pool_steps, pool_cap: the counter and stream layout (``dppo.privacy.tabular_counters``).
        block_growth: ``None`` releases the counters (and re-plans) after every episode; a growth factor
            g > 1 releases after geometrically growing blocks of episodes
            (``dppo.privacy.tabular_counters.release_schedule``): the counters then have one time step per
            block and the policy is re-planned once per block.
        max_block: with ``block_growth``, the longest block (episodes); null: no limit.
        set_noise: Gaussian counters, noise multipliers of the (rewards, visits, transitions) sets
            (``dppo.privacy.tabular_counters``); null: equal.
    """

    name = "tabular_ucb"
    needs = ("env", "privacy", "sampler", "seed", "episodes", "reward_bound")
    # one user per episode (``EpisodeLearner``); rounds are blocks of episodes_per_round

    @classmethod
    def extension_refusal(cls, algo: str) -> str:
        return (f"algo={algo} sizes its counters and confidence bounds for the planned episodes (a private "
                f"counter's capacity is fixed when it is built)")

    @classmethod
    def counter_of(cls, algo_cfg) -> str:
        """The counter a config picks: ``algo.counter``, else this learner's default (``Learner.defaults``: its
        signature's, the one home of the default)."""
        counter = (algo_cfg or {}).get("counter")
        return counter or cls.defaults()["counter"]

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, max_memory_gb: float = 1.25, counter: str = "laplace_tree",
                 pool_steps: bool = False, pool_cap: int | None = None, block_growth: float | None = None,
                 max_block: int | None = None, set_noise: tuple | None = None):
        torch.nn.Module.__init__(self)
        if episodes_per_round < 1:
            raise ConfigError(f"episodes_per_round must be >= 1, got {episodes_per_round}")
        if not 0 < failure_prob < 1:
            raise ConfigError(f"failure_prob must lie in (0, 1), got {failure_prob}")
        self.mdp = make_tabular(env, reward_low=-float(reward_bound), reward_high=float(reward_bound), seed=seed)
        self.privacy, self.sampler = privacy, sampler
        self.S, self.A, self.H = self.mdp.S, self.mdp.A, self.mdp.H
        self.action_ok = admissible_table(env, self.mdp)
        self.penalty = mask_penalty(self.action_ok)
        self.T = int(episodes if episodes is not None else episodes_default)
        if self.T < 1:
            raise ConfigError(f"episodes must be >= 1, got {self.T}")
        self.K = int(episodes_per_round)
        self.num_rounds = math.ceil(self.T / self.K)
        self.failure_prob = float(failure_prob)
        S, A, H = self.S, self.A, self.H
        self.hsa = H * S * A
        self.layout = TabularLayout(S, A, H, pooled=pool_steps, pool_cap=pool_cap, set_noise=set_noise)
        streams = self.layout.num_streams
        private = privacy is not None and privacy.private
        # release times (1-based episode counts); None: after every episode
        self.release_ends = None if block_growth is None else release_schedule(self.T, block_growth, max_block)
        capacity = self.T if self.release_ends is None else len(self.release_ends)
        self.memory_gb = self._check_memory(streams, capacity, private, counter, max_memory_gb,
                                            block_growth is not None)
        self.stats = build_counter(self.counter_kind, self.layout, capacity, privacy if private else None,
                                   users=self.T, row_weights=self._counter_row_weights(capacity, privacy)
                                   if private and self.counter_kind == "gaussian_opt" else None)
        self._next_release = 0              # index into release_ends of the open block
        self._fed = 0                       # episodes fed to the counters
        self._releases = 0                  # releases so far in this process (plan cache key)
        self._plan_cache = None
        self.register_buffer("episode_regret", torch.full((self.T,), float("nan"), dtype=torch.float64))
        self.register_buffer("episode_return", torch.full((self.T,), float("nan"), dtype=torch.float64))
        self.episodes_done = 0
        self._stats_cache = {}                  # NumPy views of the released statistics (planning)
        self._feed_offsets = [h * S * A for h in range(H)]    # index of (h, 0, 0) in a stream set
        self._feed_ones = [1.0] * (2 * H)
        self._jit_buf = None
        self.sim_gen = torch.Generator().manual_seed(int(seed) * 3 + 11)
        self.tie_gen = torch.Generator().manual_seed(int(seed) * 3 + 12)
        self.eval_gen = torch.Generator().manual_seed(int(seed) * 3 + 13)
        self.optimal = None
        if self.mdp.has_model:
            self.optimal = self.mdp.optimal_value()

    # ---- statistics ----------------------------------------------------------------------
    PLANNER_ARRAYS = 1      # the plan's work array the size of the transition statistics (m / n, or m~ / n^)

    @property
    def planner_arrays(self) -> int:
        """``PLANNER_ARRAYS``; PUCB's pooled plan multiplies by 1 / n after each mat-vec instead (none)."""
        return self.PLANNER_ARRAYS
    def _check_memory(self, streams: int, capacity: int, private: bool, counter: str, max_memory_gb: float,
                      blocks: bool) -> float:
        """Choose the counter (``counter=gaussian``: the most accurate one that fits) and refuse, before anything
        is allocated, statistics larger than ``max_memory_gb``: the counter's arrays
        (``dppo.privacy.tabular_counters.counter_arrays``) and the planner's, one float64 per stream each, plus
        the round's stored policies where the regret is computed. Returns the estimate in GB."""
        stream_gb = streams * 8 / 2 ** 30
        other_gb = stream_gb * self.planner_arrays + self._policies_gb(self.K)
        self.counter_kind = resolve_counter(counter, capacity, streams, max_memory_gb - other_gb)
        need_gb = stream_gb * counter_arrays(self.counter_kind, capacity, private) + other_gb
        if need_gb > max_memory_gb:
            fixes = (["pool the steps (algo.pool_steps=true: a time-homogeneous MDP)"] if not self.layout.pooled else []) \
                + (["release in blocks (algo.block_growth=1.05)"] if private and not blocks else []) \
                + ["lower env.horizon", f"raise algo.max_memory_gb={max_memory_gb}"]
            raise ConfigError(f"{self.name} on {getattr(self.mdp, 'name', 'this env')} (S={self.S}, A={self.A}, "
                              f"H={self.H}) needs ~{need_gb:.3g} GB for its statistics ({streams:,} streams); "
                              + ", or ".join(fixes))
        return need_gb

    def _policies_gb(self, episodes: int) -> float:
        """The round's stored policies (int64 [K, H, S]), kept only to compute the exact regret."""
        return episodes * self.H * self.S * 8 / 2 ** 30 if self.mdp.has_model else 0.0

    def _counter_row_weights(self, capacity: int, privacy) -> tuple | None:
        """Which counter releases an optimized factorization (``counter=gaussian_opt``) is tuned for; None:
        all equally (a learner that reads some releases more overrides this; public quantities only)."""
        return None

    def _xp(self):
        return np if self.stats.counts.device.type == "cpu" else torch

    def _view(self, t: torch.Tensor):
        return t.numpy() if t.device.type == "cpu" else t

    def released_stats(self):
        """(l~ [H,S,A], n~ [H,S,A], m~ [H,S,A,S]) as NumPy views (CPU) or tensors: what planning may use."""
        rel = self.stats.released
        key = (rel.data_ptr(), rel.device)
        cache = self._stats_cache          # a plain dict: torch.nn.Module.__setattr__ is slow per episode
        if cache.get("key") != key:
            v = self._view(rel)
            S, A, k = self.S, self.A, self.layout.sa
            H = 1 if self.layout.pooled else self.H
            cache["views"] = (v[:k].reshape(H, S, A), v[k:2 * k].reshape(H, S, A), v[2 * k:].reshape(H, S, A, S))
            cache["key"] = key
        return cache["views"]

    def _feed(self, states: list, actions: list, rewards: list) -> None:
        """One user's episode into the counters: r to l(s,a,h), 1 to n(s,a,h) and m(s,a,s',h), 0 elsewhere;
        released at once, or at the end of its block (``block_growth``)."""
        if self.layout.pooled:
            idx, vals = self.layout.increments(states, actions, rewards)
        else:
            S, A, k = self.S, self.A, self.hsa
            sa = [b + s * A + a for b, s, a in zip(self._feed_offsets, states, actions)]    # (h*S + s)*A + a
            idx = sa + [k + i for i in sa] + [2 * k + i * S + s2 for i, s2 in zip(sa, states[1:])]
            ones = self._feed_ones if len(sa) == self.H else [1.0] * (2 * len(sa))
            vals = list(rewards) + ones
        d = self.__dict__                   # plain attributes: torch.nn.Module.__setattr__ is slow per episode
        d["_fed"] = self._fed + 1
        ends = self.release_ends
        if ends is None:
            self.stats.step(idx, vals)
        else:
            self.stats.add(idx, vals)
            if self._fed < ends[self._next_release]:
                return
            self.stats.close_step()
            d["_next_release"] = self._next_release + 1
        d["_releases"] = self._releases + 1

    def _steps_in(self, t0: int, t1: int) -> int:
        """Counter time steps released by episodes t0 + 1 .. t1."""
        if self.release_ends is None:
            return t1 - t0
        return bisect.bisect_right(self.release_ends, t1) - bisect.bisect_right(self.release_ends, t0)

    def _current_plan(self):
        """``_plan()`` of the current release, computed once per release (a block re-uses its plan)."""
        cache = self._plan_cache
        if cache is not None and cache[0] == self._releases:
            return cache[1]
        q = self._plan()
        self.__dict__["_plan_cache"] = (self._releases, q)
        return q

    # ---- planning ------------------------------------------------------------------------
    def _plan(self):
        """Optimistic Q [H, S, A] from the released statistics (subclasses); may be a work buffer
        that the next plan overwrites."""
        raise NotImplementedError

    def q_values(self):
        """Optimistic Q [H, S, A] from the released statistics (a fresh array / tensor)."""
        q = self._plan()
        return q.copy() if isinstance(q, np.ndarray) else q.clone()

    def greedy_policy(self, jitter=None):
        """``pi[h, s] = argmax_a Q(s, a, h)``, ties broken by ``jitter`` (tiny uniform noise) if given."""
        q = self._current_plan()
        if jitter is not None:
            q = q + jitter
        return q.argmax(-1)

    def _greedy_into(self, jitter: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``greedy_policy(jitter)`` on CPU written into ``out`` [H, S] (int64), no new arrays."""
        buf = self._jit_buf
        if buf is None or buf.shape != jitter.shape:
            buf = self._jit_buf = np.empty_like(jitter)
        np.add(self._current_plan(), jitter, out=buf)
        return buf.argmax(axis=-1, out=out)

    def _jitter(self, n: int):
        """Tie-breaking noise for ``n`` plans: ties (e.g. unvisited actions) are broken uniformly."""
        xp = self._xp()
        j = 1e-9 * torch.rand(n, self.H, self.S, self.A, generator=self.tie_gen, dtype=torch.float64)
        return j.numpy() if xp is np else j.to(self.stats.counts.device)

    # ---- training ------------------------------------------------------------------------
    def on_first_round(self) -> None:
        """Hook for the private learner's ledger entries (before the first release)."""

    def train_round(self, round_idx: int) -> dict:
        if round_idx == 0 and self.episodes_done == 0:
            self.on_first_round()
        K = min(self.K, self.T - self.episodes_done)
        if self.sampler is not None:
            self.sampler.take(K)            # one fresh user per episode (one-pass enforced)
        self.stats.reserve(self._steps_in(self.episodes_done, self.episodes_done + K))
        model = isinstance(self.mdp, TabularMDP)
        # the round's uniforms, made lists episode by episode: no long-lived nested lists for the GC to scan
        U = self.mdp.uniforms(K, self.sim_gen).numpy() if model else None
        chunk = max(1, min(K, (1 << 20) // (self.H * self.S * self.A)))
        cpu = self._xp() is np
        exact = self.optimal is not None       # every episode's policy is kept for the regret
        policies = np.empty((K if exact else 1, self.H, self.S), dtype=np.int64)
        returns, steps = [], 0
        with _one_torch_thread():
            for k in range(K):
                if k % chunk == 0:
                    jit = self._jitter(min(chunk, K - k))
                row = k if exact else 0
                if cpu:
                    pi = self._greedy_into(jit[k % chunk], policies[row])
                else:
                    pi = policies[row] = self.greedy_policy(jit[k % chunk]).cpu().numpy()
                pl = pi.tolist()
                if model:
                    states, actions, rewards = self.mdp.episode_from_uniforms(pl, U[k].tolist())
                else:
                    states, actions, rewards = self.mdp.run_episode(pl)
                self._feed(states, actions, rewards)
                returns.append(sum(rewards))
                steps += len(actions)
            if self.optimal is not None:           # exact value of every episode's policy (repeats once)
                values = self.mdp.policy_value_batch(torch.from_numpy(policies))
        t0 = self.episodes_done
        self.episodes_done += K
        native = self.mdp.to_native_return(torch.tensor(returns, dtype=torch.float64))
        self.episode_return[t0:t0 + K] = native
        metrics = {"diag/return": float(native.mean()), "rollout/users": float(K),
                   "rollout/episodes": float(K), "diag/env_steps": float(steps),    # episodes may end before H
                   "counters/error_bound": float(self.count_error_bound())}
        if self.optimal is not None:
            regret = self.mdp.to_native_regret(self.optimal - values)
            self.episode_regret[t0:t0 + K] = regret
            metrics["regret/per_episode"] = float(regret.mean())
            metrics["regret/cumulative"] = float(self.episode_regret[:self.episodes_done].sum())
        return metrics

    def count_error_bound(self) -> float:
        """The bound on |released - true| count the planner assumes (0 for exact counts)."""
        return 0.0

    # ---- the released policy --------------------------------------------------------------
    def _denoising(self) -> tuple[float, float]:
        """(floor, gate) of the certainty-equivalent model (``certainty_equivalent``): transition entries below
        ``floor`` are dropped and pairs with visits <= ``gate`` are unknown; exact counts: (0, 0); noisy ones: the
        learner's count error bound as the gate."""
        return 0.0, float(self.count_error_bound())

    def released_policy(self) -> np.ndarray:
        """The policy the learner releases (evaluation, ``summary.json``'s ``final_return``): greedy on the
        certainty-equivalent model of the released statistics, without the exploration bonus (optimism serves
        the users' episodes; a released policy should be the best one the statistics support), with masked maxima;
        pooled statistics are planned over the env's own horizon (``eval_horizon``) into one action per state,
        per-step ones over their H steps. A post-processing of the released statistics: no privacy cost."""
        l, n, m = (np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x) for x in self.released_stats())
        floor, gate = self._denoising()
        pi, _ = certainty_equivalent(l, n, m, horizon=self.eval_horizon, penalty=self.penalty, floor=floor,
                                     gate=gate)
        return pi

    @property
    def eval_horizon(self) -> int:
        """The env's own episode limit (a cut ``env.horizon`` plans and learns over fewer steps): where the released
        policy is planned and evaluated."""
        return int(getattr(self.mdp, "own_horizon", None) or self.H)

    def exact_return(self) -> float | None:
        """The released policy's exact expected native return where the env's model is public: a tabular MDP
        (over H) or ICU-Sepsis's tables (survival, at the env's horizon of 500); None otherwise."""
        pi = self.released_policy()
        if isinstance(self.mdp, TabularMDP):
            table = torch.as_tensor(pi if pi.ndim == 2 else np.tile(pi, (self.H, 1)))
            return float(self.mdp.to_native_return(torch.tensor(self.mdp.policy_value(table))))
        from dppo.envs.icu_sepsis_vector import IDS
        if getattr(self.mdp, "name", None) in IDS and pi.ndim == 1:
            from dppo.envs.icu_sepsis_exact import survival

            return survival(pi[:716])
        return None

    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean native return of the released policy (``released_policy``) over ``episodes`` held-out episodes at
        the env's own horizon: the same ones at every call (a copy of ``eval_gen``, which never advances; a
        model-free env: public reset seeds, never a user's), so an evaluation changes neither the users' episodes
        nor a later evaluation's."""
        pi = self.released_policy()
        if isinstance(self.mdp, TabularMDP):
            table = torch.as_tensor(pi if pi.ndim == 2 else np.tile(pi, (self.H, 1))).to(torch.long)
            gen = torch.Generator()
            gen.set_state(self.eval_gen.get_state())
            _, _, r = self.mdp.sample_episodes(table, int(episodes), gen)
            return float(self.mdp.to_native_return(r.sum(1)).mean())
        H = pi.shape[0] if pi.ndim == 2 else self.eval_horizon     # a per-step policy: its own H steps
        pl = (pi if pi.ndim == 2 else np.tile(pi, (H, 1))).tolist()
        total = [self.mdp.native_return(self.mdp.run_episode(pl, seed=s, horizon=H)[2])
                 for s in self.mdp.eval_seeds(int(episodes))]
        return float(sum(total) / max(1, len(total)))

    def summary(self) -> dict:
        done = self.episodes_done
        regret = None if self.optimal is None else float(self.episode_regret[:done].sum())
        out = {"cumulative_regret": regret, "regret_available": self.optimal is not None,
               "episodes": done, "env_name": getattr(self.mdp, "name", None),
               "counter": self.counter_kind if self.stats.private else "exact",
               "count_error_bound": float(self.count_error_bound()), "exact_return": self.exact_return()}
        if self.optimal is not None:
            out["optimal_value"] = float(self.mdp.to_native_return(self.optimal))
            out["regret_at"] = {str(t): float(self.episode_regret[:t].sum())
                                for t in (10 ** i for i in range(1, 10)) if t <= done}
        return out

    # ---- checkpoint state (buffers + extra state) ----------------------------------------
    def get_extra_state(self) -> dict:
        return {"episodes_done": self.episodes_done, "sim_gen": self.sim_gen.get_state(),
                "tie_gen": self.tie_gen.get_state(), "eval_gen": self.eval_gen.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.episodes_done = int(state["episodes_done"])
        self._fed = self.episodes_done                  # checkpoints are taken between rounds
        self._next_release = 0 if self.release_ends is None else bisect.bisect_right(self.release_ends,
                                                                                      self.episodes_done)
        self._plan_cache = None
        self.sim_gen.set_state(state["sim_gen"])
        self.tie_gen.set_state(state["tie_gen"])
        self.eval_gen.set_state(state["eval_gen"])

    def _h_left(self, xp):
        """``H - h`` for 1-based h = 1..H, i.e. ``H - 1 - h`` for our 0-based steps, shaped [H, 1, 1]."""
        h = np.arange(self.H - 1, -1, -1, dtype=np.float64).reshape(self.H, 1, 1)
        return h if xp is np else torch.as_tensor(h, device=self.stats.counts.device)


class UBEV(TabularUCB):
    """UBEV (Dann, Lattimore & Brunskill 2017, Alg. 1), non-private.

    Per episode, backward induction with ``V~_{H+1} = 0`` and, for 1-based step h,
    ``phi = sqrt((2 ln ln max(e, n) + ln(18 S A H / delta)) / n)``,
    ``Q(s,a,h) = min(1, l/n + phi) + min(max_s' V~_{h+1}(s'), m(.,s,a,h)^T V~_{h+1} / n + (H - h) phi)``,
    ``V~_h(s) = max_a Q(s,a,h)``; unvisited pairs (n = 0) get ``1 + max V~_{h+1}``.
    """

    name = "ubev"

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, max_memory_gb: float = 1.25, pool_steps: bool = False,
                 pool_cap: int | None = None, block_growth: float | None = None, max_block: int | None = None):
        if privacy is not None and privacy.private:
            raise ConfigError("ubev is not private; use algo=pucb for eps-JDP, or set eps=null")
        super().__init__(env, privacy=privacy, sampler=sampler, seed=seed, episodes=episodes,
                         episodes_default=episodes_default, episodes_per_round=episodes_per_round,
                         failure_prob=failure_prob, reward_bound=reward_bound, max_memory_gb=max_memory_gb,
                         pool_steps=pool_steps, pool_cap=pool_cap, block_growth=block_growth, max_block=max_block)
        self._planner = None                  # the CPU planner's work arrays (made at the first plan)

    @classmethod
    def accountant_name(cls, privacy_cfg, algo_cfg: dict | None = None) -> str:
        return "basic"

    def _log_term(self) -> float:
        return math.log(18 * self.S * self.A * self.H / self.failure_prob)

    def _plan(self):
        l, n, m = self.released_stats()
        planner = self._planner
        if planner is not None and planner.l is l:       # same NumPy views as last time
            return planner.plan(self._log_term(), Widths(), False) if self.layout.pooled else planner.plan()
        xp = self._xp()
        if xp is np and self.layout.pooled:              # pooled over h: every step reads the same counts
            planner = self._planner = PlanArrays(l, n, m, self.H)
            planner.penalty = None if self.penalty is None else self.penalty.reshape(-1)
            return planner.plan(self._log_term(), Widths(), False)
        if xp is np:
            planner = self._planner = _UBEVPlanner(l, n, m, self._log_term())
            planner.penalty = self.penalty
            return planner.plan()
        nn = xp.where(n > 0, n, 1.0)
        phi = _ubev_phi(xp, n, self._log_term())
        r_part = (l / nn + phi).clamp(max=1.0)
        width = self._h_left(xp) * phi                    # (H - h) phi
        return _backward(xp, m, 1.0 / nn, width, r_part, mode="ubev", H=self.H, penalty=self.penalty)


class PUCB(TabularUCB):
    """PUCB (Vietri et al. 2020, Alg. 2 with PrivQ, Alg. 3): eps-joint-DP.

    Privacy: the statistics are released by per-step continual counters built in
    ``dppo.privacy.tabular_counters`` (``build_counter``; the per-stream budget ``eps' = eps / (6H)`` of
    the Laplace trees, their sensitivity under replace-one adjacency and the ledger record are derived
    there: replacing one user changes at most ``2H`` streams of each of the three sets by at most 1, so
    each set is ``eps/3``-DP and the three ``eps``-DP by basic composition; the reference's ``eps/(3H)``
    counts H touched streams, i.e. add/remove adjacency). The policy of every other user is a
    post-processing of the released counts (billboard lemma), so the learner is eps-JDP.

    Planning (PrivQ) with ``E`` the count error bound and ``beta' = beta / 2``:
    ``conf = (H+1) phi~ + psi~`` if ``n~ >= 2E`` else ``H``,
    ``phi~ = sqrt(2 ln(T/beta') / max(n~ - E, 1))``, ``psi~ = (1 + S H)(3E/n~ + 2E^2/n~^2)``,
    ``Q~ = (l~ + m~^T V~_{h+1}) / n~``, ``Q~+ = min(H, Q~ + conf)``, ``V~_h = max_a Q~+``.
    ``E`` is the reference's ``E_eps`` (``count_error_bound=reference``,
    ``dppo.privacy.tabular_counters.reference_error_bound``), or the tree mechanism's own Chernoff bound,
    uniform over all streams and episodes (``count_error_bound=tree``; also valid w.p. 1 - beta',
    usually smaller). ``Q~`` is projected onto ``[0, inf)`` (it estimates a value >= 0), so
    ``n~ < 2E`` gives ``Q~+ = H`` for any noise. With ``eps=null`` the counts are exact and ``E = 0``.

    Args (beyond ``TabularUCB``'s):
        failure_prob: beta (``beta' = beta / 2`` in ``E`` and ``phi~``).
        count_error_bound: ``reference`` (the paper's ``E_eps``) | ``tree`` (the tree mechanism's own bound).
        counter: ``laplace_tree`` (the paper's) | ``gaussian`` (square-root factorization) | ``gaussian_tree`` |
            ``gaussian_sqrt``.
    """

    name = "pucb"

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, count_error_bound: str = "reference", max_memory_gb: float = 1.25,
                 counter: str = "laplace_tree", pool_steps: bool = False, pool_cap: int | None = None,
                 block_growth: float | None = None, max_block: int | None = None):
        if count_error_bound not in ("reference", "tree"):
            raise ConfigError(f"count_error_bound must be 'reference' or 'tree', got '{count_error_bound}'")
        super().__init__(env, privacy=privacy, sampler=sampler, seed=seed, episodes=episodes,
                         episodes_default=episodes_default, episodes_per_round=episodes_per_round,
                         failure_prob=failure_prob, reward_bound=reward_bound, max_memory_gb=max_memory_gb,
                         counter=counter, pool_steps=pool_steps, pool_cap=pool_cap, block_growth=block_growth,
                         max_block=max_block)
        self.eps = privacy.eps if privacy is not None and privacy.private else None
        self.eps_stream = getattr(self.stats, "eps_stream", None)
        self.beta_prime = self.failure_prob / 2
        self.count_error_bound_kind = count_error_bound
        self.E = self._error_bound()

    @classmethod
    def accountant_name(cls, privacy_cfg, algo_cfg=None) -> str:
        return "basic" if cls.counter_of(algo_cfg) == "laplace_tree" else "zcdp"

    @classmethod
    def releases_pure_dp(cls, cfg) -> bool:
        return cls.counter_of(cfg.algo) == "laplace_tree"     # Laplace tree counters

    @classmethod
    def releases_carry_rho(cls, cfg) -> bool:
        return not cls.releases_pure_dp(cfg)          # Gaussian counters: ledger entries carry their zCDP rho

    def lost_attempt_charges(self, lost_rounds: list[int]) -> list[dict]:
        """Charges for a crashed attempt (secure noise, on resume): the tree counters' nodes that close
        after the checkpoint are drawn again with fresh noise and some of them cover earlier users, so
        those users enter a second release of at most one full set of nodes per stream: charged as a
        second copy of the counters' releases (an upper bound; ``dppo.training.trainer.recover_journal``)."""
        if self.eps is None:
            return []
        return [dict(e) for e in self.privacy.ledger.entries
                if e["mechanism"].endswith("counter") and not e.get("replay") and not e.get("lost")]

    def _error_bound(self) -> float:
        if self.eps is None:
            return 0.0
        if not isinstance(self.stats, TreeCounter):      # Gaussian: its exact worst std, union over streams x T
            return self.stats.uniform_error_bound(self.beta_prime, self.stats.num_streams * self.T)
        if self.count_error_bound_kind == "tree":
            return self.stats.error_bound(self.beta_prime, uniform=True)
        return reference_error_bound(self.stats, self.layout, self.eps, self.beta_prime)

    def count_error_bound(self) -> float:
        return self.E

    @property
    def planner_arrays(self) -> int:
        return 0 if self.layout.pooled and self.H > 1 else self.PLANNER_ARRAYS

    def gate_open_fraction(self) -> float:
        """Share of (s, a, h) with ``n~ >= 2E`` (a post-processing of the released counts, so loggable)."""
        _, n, _ = self.released_stats()
        return float((n >= 2 * self.E).sum()) / math.prod(n.shape)

    def train_round(self, round_idx: int) -> dict:
        metrics = super().train_round(round_idx)
        metrics["counters/gate_open_fraction"] = self.gate_open_fraction()
        return metrics

    def summary(self) -> dict:
        return {**super().summary(), "gate_open_fraction": self.gate_open_fraction()}

    def on_first_round(self) -> None:
        record_counter_releases(self.privacy, self.stats, self.layout, self.T)

    def _plan(self):
        xp = self._xp()
        l, n, m = self.released_stats()
        S, H, E = self.S, self.H, self.E
        gate = n >= 2 * E
        if not gate.any():
            # every conf is H and Q~ >= 0, so Q~+ = min(H, Q~ + H) = H everywhere: skip the induction
            full = xp.full_like(n, float(H))
            if self.penalty is not None:
                full = full + (self.penalty if xp is np else torch.as_tensor(self.penalty, device=full.device))
            return full if full.shape[0] == H else (full.repeat(H, 0) if xp is np else full.repeat(H, 1, 1))
        safe = xp.where(gate & (n > 0), n, 1.0)
        phi = xp.sqrt(2 * math.log(self.T / self.beta_prime) / (n - E).clip(min=1.0))
        psi = (1 + S * H) * (3 * E / safe + 2 * E * E / (safe * safe))
        conf = xp.where(gate, (H + 1) * phi + psi, float(H))
        return _backward(xp, m, 1.0 / safe, conf, l, mode="pucb", cap=float(H), H=H, penalty=self.penalty)
