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

from dppo.algos.base import Learner
from dppo.envs.tabular import TabularMDP, make_tabular
from dppo.errors import ConfigError
from dppo.privacy.tabular_counters import (TabularLayout, build_counter, record_counter_releases,
                                           reference_error_bound, release_schedule, resolve_counter)
from dppo.privacy.tree_counter import TreeCounter, tree_levels

_UNVISITED_BONUS = 1e30   # stands for an infinite bonus (n = 0), finite so that 0 * bonus = 0


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


class TabularUCB(torch.nn.Module, Learner):
    """Shared episode loop, statistics, regret bookkeeping and checkpointing of UBEV and PUCB.

    Args:
        env: a ``TabularMDP``, a gymnasium env with Discrete spaces, or a ``GymEnvFactory``.
        episodes: total episodes T (one user each); ``None`` uses ``episodes_default``.
        episodes_per_round: episodes per trainer round (one log line per round).
        failure_prob: the confidence parameter (delta of UBEV, beta of PUCB).
        reward_bound: native reward range ``[-reward_bound, reward_bound]`` of a model-free env.
        max_memory_gb: refuse (ConfigError) statistics tables larger than this.
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

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, max_memory_gb: float = 4.0, counter: str = "laplace_tree",
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
        self.counter_kind = resolve_counter(counter, capacity)
        levels = {"gaussian_sqrt": 64, "gaussian_opt": capacity}.get(self.counter_kind, tree_levels(capacity))  # noise rows
        arrays = 3 + (0 if not private else 3 + levels)   # buffers + planning temporaries
        need_gb = streams * arrays * 8 / 2 ** 30
        if need_gb > max_memory_gb:
            raise ConfigError(f"{self.name} on {getattr(self.mdp, 'name', 'this env')} (S={S}, A={A}, H={H}) needs "
                              f"~{need_gb:.1f} GB for its S^2 A H statistics; lower env.horizon (or raise "
                              f"algo.max_memory_gb={max_memory_gb})")
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
        policies = np.empty((K, self.H, self.S), dtype=np.int64)     # every episode's policy, for the regret
        returns = []
        with _one_torch_thread():
            for k in range(K):
                if k % chunk == 0:
                    jit = self._jitter(min(chunk, K - k))
                if cpu:
                    pi = self._greedy_into(jit[k % chunk], policies[k])
                else:
                    pi = policies[k] = self.greedy_policy(jit[k % chunk]).cpu().numpy()
                pl = pi.tolist()
                if model:
                    states, actions, rewards = self.mdp.episode_from_uniforms(pl, U[k].tolist())
                else:
                    states, actions, rewards = self.mdp.run_episode(pl)
                self._feed(states, actions, rewards)
                returns.append(sum(rewards))
            if self.optimal is not None:           # exact value of every episode's policy (repeats once)
                values = self.mdp.policy_value_batch(torch.from_numpy(policies))
        t0 = self.episodes_done
        self.episodes_done += K
        native = self.mdp.to_native_return(torch.tensor(returns, dtype=torch.float64))
        self.episode_return[t0:t0 + K] = native
        metrics = {"diag/return": float(native.mean()), "rollout/users": float(K),
                   "rollout/episodes": float(K),
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

    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean native return of the current greedy policy over fresh simulated episodes."""
        pi = torch.as_tensor(self.greedy_policy()).to("cpu", torch.long)
        if isinstance(self.mdp, TabularMDP):
            _, _, r = self.mdp.sample_episodes(pi, int(episodes), self.eval_gen)
            return float(self.mdp.to_native_return(r.sum(1)).mean())
        pl = pi.tolist()
        total = [sum(self.mdp.run_episode(pl)[2]) for _ in range(int(episodes))]
        return float(self.mdp.to_native_return(sum(total) / max(1, len(total))))

    def summary(self) -> dict:
        done = self.episodes_done
        regret = None if self.optimal is None else float(self.episode_regret[:done].sum())
        out = {"cumulative_regret": regret, "regret_available": self.optimal is not None,
               "episodes": done, "env_name": getattr(self.mdp, "name", None),
               "count_error_bound": float(self.count_error_bound())}
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
                 reward_bound: float = 1.0, max_memory_gb: float = 4.0):
        if privacy is not None and privacy.private:
            raise ConfigError("ubev is not private; use algo=pucb for eps-JDP, or set eps=null")
        super().__init__(env, privacy=privacy, sampler=sampler, seed=seed, episodes=episodes,
                         episodes_default=episodes_default, episodes_per_round=episodes_per_round,
                         failure_prob=failure_prob, reward_bound=reward_bound, max_memory_gb=max_memory_gb)
        self._planner = None                  # the CPU planner's work arrays (made at the first plan)

    @classmethod
    def accountant_name(cls, privacy_cfg) -> str:
        return "basic"

    def _log_term(self) -> float:
        return math.log(18 * self.S * self.A * self.H / self.failure_prob)

    def _plan(self):
        l, n, m = self.released_stats()
        planner = self._planner
        if planner is not None and planner.l is l:       # same NumPy views as last time
            return planner.plan()
        xp = self._xp()
        if xp is np:
            planner = self._planner = _UBEVPlanner(l, n, m, self._log_term())
            return planner.plan()
        nn = xp.where(n > 0, n, 1.0)
        phi = _ubev_phi(xp, n, self._log_term())
        r_part = (l / nn + phi).clamp(max=1.0)
        width = self._h_left(xp) * phi                    # (H - h) phi
        return _backward(xp, m, 1.0 / nn, width, r_part, mode="ubev")


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
    """

    name = "pucb"

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, count_error_bound: str = "reference", max_memory_gb: float = 4.0,
                 counter: str = "laplace_tree"):
        if count_error_bound not in ("reference", "tree"):
            raise ConfigError(f"count_error_bound must be 'reference' or 'tree', got '{count_error_bound}'")
        super().__init__(env, privacy=privacy, sampler=sampler, seed=seed, episodes=episodes,
                         episodes_default=episodes_default, episodes_per_round=episodes_per_round,
                         failure_prob=failure_prob, reward_bound=reward_bound, max_memory_gb=max_memory_gb,
                         counter=counter)
        self.eps = privacy.eps if privacy is not None and privacy.private else None
        self.eps_stream = getattr(self.stats, "eps_stream", None)
        self.beta_prime = self.failure_prob / 2
        self.count_error_bound_kind = count_error_bound
        self.E = self._error_bound()

    @classmethod
    def accountant_name(cls, privacy_cfg, algo_cfg=None) -> str:
        counter = (algo_cfg or {}).get("counter", "laplace_tree") or "laplace_tree"
        return "basic" if counter == "laplace_tree" else "zcdp"

    @classmethod
    def releases_pure_dp(cls, cfg) -> bool:
        return (cfg.algo.get("counter") or "laplace_tree") == "laplace_tree"     # Laplace tree counters

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

    def gate_open_fraction(self) -> float:
        """Share of (s, a, h) with ``n~ >= 2E`` (a post-processing of the released counts, so loggable)."""
        _, n, _ = self.released_stats()
        return float((n >= 2 * self.E).sum()) / self.hsa

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
            return xp.full_like(n, float(H))
        safe = xp.where(gate & (n > 0), n, 1.0)
        phi = xp.sqrt(2 * math.log(self.T / self.beta_prime) / (n - E).clip(min=1.0))
        psi = (1 + S * H) * (3 * E / safe + 2 * E * E / (safe * safe))
        conf = xp.where(gate, (H + 1) * phi + psi, float(H))
        return _backward(xp, m, 1.0 / safe, conf, l, mode="pucb", cap=float(H))


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


def _backward(xp, m, inv_n, bonus, r, *, mode: str, cap: float = 0.0):
    """Backward induction over h = H-1..0 with ``V_H = 0``, vectorized over (s, a); the empirical
    next-state value is ``(m(s,a,.,h) . V_{h+1}) / n`` (the normalized transition table is never formed):

    * ``ubev``: ``Q_h = r + min(m V_{h+1} / n + bonus, max_s V_{h+1}(s))`` (``r`` = the clipped reward term);
    * ``pucb``: ``Q_h = min(cap, max((r + m V_{h+1}) / n, 0) + bonus)`` (``r`` = the reward sums).

    Args:
        xp: ``numpy`` (CPU views) or ``torch``.
        m: [H, S, A, S] transition counts; inv_n, bonus, r: [H, S, A].

    Returns:
        Q [H, S, A] (float64); ``V_h(s) = max_a Q_h(s, a)``.
    """
    H, S, A = r.shape
    m_over_n = (m * inv_n[..., None]).reshape(H, S * A, S)       # one pass, then one matvec per step
    b2 = bonus.reshape(H, S * A)
    r2 = r.reshape(H, S * A) if mode == "ubev" else (r * inv_n).reshape(H, S * A)
    Q = xp.zeros_like(r2)
    Q3 = Q.reshape(H, S, A)
    V = xp.zeros_like(r2[0, :S])
    amax = np.maximum.reduce if xp is np else torch.amax
    zero, top = V[0] * 0, V[0] * 0 + cap
    v_max = zero
    for h in range(H - 1, -1, -1):
        y = m_over_n[h] @ V
        if mode == "ubev":
            y += b2[h]
            xp.minimum(y, v_max, out=y)
            xp.add(r2[h], y, out=Q[h])
            V = amax(Q3[h], -1)
            v_max = amax(V, 0)
        else:
            y += r2[h]
            xp.maximum(y, zero, out=y)
            y += b2[h]
            xp.minimum(y, top, out=Q[h])
            V = amax(Q3[h], -1)
    return Q3
