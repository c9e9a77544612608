"""Tabular optimistic learners: UBEV (Dann et al. 2017) and PUCB (Vietri et al. 2020, eps-JDP).

Both keep the statistics of REFERENCE.md section 2 per step ``h``: reward sums ``l(s,a,h)``, visit
counts ``n(s,a,h)`` and transition counts ``m(s,a,s',h)``, in one flat vector of streams

    [ l: H*S*A | n: H*S*A | m: H*S*A*S ]      (index of (h, s, a) = (h*S + s)*A + a)

held by a ``TreeCounter``: exact for UBEV, the private binary-tree mechanism for PUCB. Each episode
is one user (ids from the one-pass sampler); the learner re-plans once per episode by vectorized
backward induction (O(H S^2 A), no loop over states) on the released statistics only (billboard
model: the policy is a post-processing of the private counts), runs the greedy policy, and feeds the
episode to the counters (one release per episode).

On CPU the per-episode planning runs on NumPy views of the torch buffers (no copy): a plan is ~100
tiny array operations and NumPy's per-operation overhead is several times lower than torch's; on
other devices the same code runs on torch tensors (``_xp``).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from dppo.algos.base import Learner
from dppo.envs.tabular import TabularMDP, make_tabular
from dppo.errors import ConfigError
from dppo.privacy.tree_counter import TreeCounter, tree_levels

_UNVISITED_BONUS = 1e30   # stands for an infinite bonus (n = 0), finite so that 0 * bonus = 0


class TabularUCB(torch.nn.Module, Learner):
    """Shared episode loop, statistics, regret bookkeeping and checkpointing of UBEV and PUCB.

    Args:
        env: a ``TabularMDP``, a gymnasium env with Discrete spaces, or a ``GymEnvFactory``.
        episodes: total episodes T (one user each); ``None`` uses ``episodes_default``.
        episodes_per_round: episodes per trainer round (one log line per round).
        failure_prob: the confidence parameter (delta of UBEV, beta of PUCB).
        reward_bound: native reward range ``[-reward_bound, reward_bound]`` of a model-free env.
        max_memory_gb: refuse (ConfigError) statistics tables larger than this.
    """

    name = "tabular_ucb"

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, counter_eps: float | None = None, max_memory_gb: float = 4.0):
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
        streams = 2 * self.hsa + self.hsa * S
        arrays = 2 + (0 if counter_eps is None else 3 + tree_levels(self.T))   # buffers + planning temporaries
        need_gb = streams * arrays * 8 / 2 ** 30
        if need_gb > max_memory_gb:
            raise ConfigError(f"{self.name} on {getattr(self.mdp, 'name', 'this env')} (S={S}, A={A}, H={H}) needs "
                              f"~{need_gb:.1f} GB for its S^2 A H statistics; lower env.horizon (or raise "
                              f"algo.max_memory_gb={max_memory_gb})")
        self.stats = TreeCounter(streams, self.T, counter_eps, sensitivity=1.0,
                                 noise=privacy.noise if counter_eps is not None else None)
        self.register_buffer("episode_regret", torch.full((self.T,), float("nan"), dtype=torch.float64))
        self.register_buffer("episode_return", torch.full((self.T,), float("nan"), dtype=torch.float64))
        self.episodes_done = 0
        self.sim_gen = torch.Generator().manual_seed(int(seed) * 3 + 11)
        self.tie_gen = torch.Generator().manual_seed(int(seed) * 3 + 12)
        self.eval_gen = torch.Generator().manual_seed(int(seed) * 3 + 13)
        self.optimal = None
        if self.mdp.has_model:
            self.optimal = self.mdp.optimal_value()

    # ---- statistics ----------------------------------------------------------------------
    def _xp(self):
        return np if self.stats.counts.device.type == "cpu" else torch

    def _view(self, t: torch.Tensor):
        return t.numpy() if t.device.type == "cpu" else t

    def released_stats(self):
        """(l~ [H,S,A], n~ [H,S,A], m~ [H,S,A,S]) as NumPy views (CPU) or tensors: what planning may use."""
        rel = self.stats.released
        key = (rel.data_ptr(), rel.device)
        if getattr(self, "_stats_key", None) != key:
            v = self._view(rel)
            S, A, H, k = self.S, self.A, self.H, self.hsa
            self._stats_views = (v[:k].reshape(H, S, A), v[k:2 * k].reshape(H, S, A), v[2 * k:].reshape(H, S, A, S))
            self._stats_key = key
        return self._stats_views

    def _feed(self, states: list, actions: list, rewards: list) -> None:
        """One user's episode into the counters: r to l(s,a,h), 1 to n(s,a,h) and m(s,a,s',h), 0 elsewhere."""
        S, A, k = self.S, self.A, self.hsa
        sa = [(h * S + s) * A + a for h, (s, a) in enumerate(zip(states[:-1], actions))]
        idx = sa + [k + i for i in sa] + [2 * k + i * S + s2 for i, s2 in zip(sa, states[1:])]
        self.stats.step(idx, list(rewards) + [1.0] * (2 * len(sa)))

    # ---- planning ------------------------------------------------------------------------
    def q_values(self):
        """Optimistic Q [H, S, A] from the released statistics (subclasses)."""
        raise NotImplementedError

    def greedy_policy(self, jitter=None):
        """``pi[h, s] = argmax_a Q(s, a, h)``, ties broken by ``jitter`` (tiny uniform noise) if given."""
        q = self.q_values()
        if jitter is not None:
            q = q + jitter
        return q.argmax(-1)

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
        self.stats.reserve(K)
        model = isinstance(self.mdp, TabularMDP)
        U = self.mdp.uniforms(K, self.sim_gen).tolist() if model else None
        chunk = max(1, min(K, (1 << 20) // (self.H * self.S * self.A)))
        policies, returns = [], []
        for k in range(K):
            if k % chunk == 0:
                jit = self._jitter(min(chunk, K - k))
            pi = self.greedy_policy(jit[k % chunk])
            pl = pi.tolist()
            if model:
                states, actions, rewards = self.mdp.episode_from_uniforms(pl, U[k])
            else:
                states, actions, rewards = self.mdp.run_episode(pl)
            self._feed(states, actions, rewards)
            policies.append(pl)
            returns.append(sum(rewards))
        t0 = self.episodes_done
        self.episodes_done += K
        native = self.mdp.to_native_return(torch.tensor(returns, dtype=torch.float64))
        self.episode_return[t0:t0 + K] = native
        metrics = {"rollout/return": float(native.mean()), "rollout/users": float(K),
                   "rollout/episodes": float(self.episodes_done),
                   "counters/error_bound": float(self.count_error_bound())}
        if self.optimal is not None:
            values = self.mdp.policy_value_batch(torch.tensor(policies))
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
                         failure_prob=failure_prob, reward_bound=reward_bound, counter_eps=None,
                         max_memory_gb=max_memory_gb)

    @classmethod
    def accountant_name(cls, privacy_cfg) -> str:
        return "basic"

    def q_values(self):
        xp = self._xp()
        l, n, m = self.released_stats()
        S, A, H = self.S, self.A, self.H
        nn = xp.where(n > 0, n, 1.0)
        lnln = xp.log(xp.log(xp.where(n > math.e, n, math.e)))
        phi = xp.sqrt((2 * lnln + math.log(18 * S * A * H / self.failure_prob)) / nn)
        phi = xp.where(n > 0, phi, _UNVISITED_BONUS)
        r_part = xp.minimum(l / nn + phi, 1.0) if xp is np else (l / nn + phi).clamp(max=1.0)
        width = self._h_left(xp) * phi                    # (H - h) phi
        return _backward(xp, m, 1.0 / nn, width, r_part, mode="ubev")


class PUCB(TabularUCB):
    """PUCB (Vietri et al. 2020, Alg. 2 with PrivQ, Alg. 3): eps-joint-DP.

    Privacy (replace-one-user adjacency; a user is one episode = one time step of every stream): in
    each of the three stream sets (l, n, m) a user's episode touches one stream per step h, so
    replacing the user changes at most ``2H`` streams of a set, each by at most 1 (rewards are clipped
    to [0, 1]). With every stream an ``eps'``-DP tree counter, a set is ``2H eps'``-DP; we take
    ``eps' = eps / (6H)`` so each set is ``eps/3``-DP and the three sets ``eps``-DP (basic
    composition). (The reference counts H touched streams per user, i.e. add/remove adjacency, hence
    its ``eps/(3H)``.) The policy of every other user is a post-processing of the released counts
    (billboard lemma), so the learner is eps-JDP.

    Planning (PrivQ) with ``E`` the count error bound and ``beta' = beta / 2``:
    ``conf = (H+1) phi~ + psi~`` if ``n~ >= 2E`` else ``H``,
    ``phi~ = sqrt(2 ln(T/beta') / max(n~ - E, 1))``, ``psi~ = (1 + S H)(3E/n~ + 2E^2/n~^2)``,
    ``Q~ = (l~ + m~^T V~_{h+1}) / n~``, ``Q~+ = min(H, Q~ + conf)``, ``V~_h = max_a Q~+``.
    ``E`` is the reference's ``E_eps = (3/eps) U ln((2SAH + S^2AH)/beta') ln(T)^{5/2}`` with ``U = 2H``
    streams changed per user (``count_error_bound=reference``), or the tree mechanism's own Chernoff
    bound, uniform over all streams and episodes (``count_error_bound=tree``; also valid w.p.
    1 - beta', usually smaller). ``Q~`` is projected onto ``[0, inf)`` (it estimates a value >= 0), so
    ``n~ < 2E`` gives ``Q~+ = H`` for any noise. With ``eps=null`` the counts are exact and ``E = 0``.
    """

    name = "pucb"

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 episodes_default: int = 10000, episodes_per_round: int = 1000, failure_prob: float = 0.05,
                 reward_bound: float = 1.0, count_error_bound: str = "reference", max_memory_gb: float = 4.0):
        if count_error_bound not in ("reference", "tree"):
            raise ConfigError(f"count_error_bound must be 'reference' or 'tree', got '{count_error_bound}'")
        eps = privacy.eps if privacy is not None and privacy.private else None
        probe = make_tabular(env, reward_low=-float(reward_bound), reward_high=float(reward_bound), seed=seed)
        eps_stream = None if eps is None else eps / (6 * probe.H)     # eps/3 per set over 2H streams
        super().__init__(probe, privacy=privacy, sampler=sampler, seed=seed, episodes=episodes,
                         episodes_default=episodes_default, episodes_per_round=episodes_per_round,
                         failure_prob=failure_prob, reward_bound=reward_bound, counter_eps=eps_stream,
                         max_memory_gb=max_memory_gb)
        self.eps, self.eps_stream = eps, eps_stream
        self.beta_prime = self.failure_prob / 2
        self.count_error_bound_kind = count_error_bound
        self.E = self._error_bound()

    @classmethod
    def accountant_name(cls, privacy_cfg) -> str:
        return "basic"

    def _error_bound(self) -> float:
        if self.eps is None:
            return 0.0
        S, A, H, T = self.S, self.A, self.H, self.T
        if self.count_error_bound_kind == "tree":
            return self.stats.error_bound(self.beta_prime, uniform=True)
        touched = 2 * H       # streams of one set changed by replacing one user
        return self.stats.snap_error + (3 / self.eps) * touched * math.log((2 * S * A * H + S * S * A * H) / self.beta_prime) \
            * math.log(T) ** 2.5

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
        if self.eps is None:
            return
        streams = {"rewards": self.hsa, "visits": self.hsa, "transitions": self.hsa * self.S}
        for name, n in streams.items():
            self.privacy.release("tree_counter", round=0, users=self.T, eps=self.eps / 3, delta=0.0,
                                 counter_set=name, streams=n, eps_per_stream=self.eps_stream,
                                 streams_changed_per_user=2 * self.H, noise_scale=self.stats.scale,
                                 levels=self.stats.levels, capacity=self.T)

    def q_values(self):
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
