"""Finite-horizon tabular MDPs (S, A, H, P, R, p0): RiverSwim, random Dirichlet MDPs, gymnasium toy-text.

Conventions (stable API, also used by the GFA learner):

* ``P[s, a, s']`` (float64, rows sum to 1) and ``R[s, a]`` (mean reward in [0, 1]) are stationary, or
  given per step as ``P[h, s, a, s']`` and ``R[h, s, a]`` (a time-inhomogeneous MDP, ``stationary`` False);
  steps are indexed ``h = 0 .. H-1`` and every episode has exactly ``H`` steps.
* Rewards are Bernoulli(``R[s, a]``) unless ``reward_table[s, a, s']`` is given, in which case the
  reward of a transition is that deterministic value (gymnasium toy-text models).
* A deterministic non-stationary policy is a LongTensor ``pi[h, s]``; a stochastic one is
  ``pi[h, s, a]``; stationary versions drop the ``h`` axis.
* Randomness comes from a ``torch.Generator`` through uniforms: ``episode_from_uniforms`` is the
  pure function of (policy, uniforms), so every simulation is seeded and reproducible.
* Rewards live in [0, 1]; an env whose native rewards lie in ``[reward_low, reward_high]`` is mapped
  affinely (``r01 = (r - low) / (high - low)``), which adds the same constant to every H-step
  return, so optimal policies and regret orderings are unchanged; ``to_native_return`` maps back.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
import torch

from dppo.data.streams import public_reset_seeds
from dppo.errors import ConfigError


@dataclass
class TabularMDP:
    """A finite-horizon tabular MDP M = (S, A, R, P, p0, H) [UBEV/PUCB notation, REFERENCE.md section 2].

    Attributes:
        P: transition tensor [S, A, S] (float64), ``P[s, a]`` a distribution over next states; or
            [H, S, A, S], one per step h (dynamics that differ across h).
        R: mean rewards [S, A] in [0, 1] (float64); [H, S, A] with a per-step P.
        H: horizon (steps per episode).
        p0: initial-state distribution [S] (float64).
        reward_table: optional [S, A, S] deterministic reward of each transition (overrides Bernoulli).
        reward_low, reward_high: native reward range that [0, 1] represents (0, 1 for our MDPs).
        name: a label for logs.
    """

    P: torch.Tensor
    R: torch.Tensor
    H: int
    p0: torch.Tensor
    reward_table: torch.Tensor | None = None
    reward_low: float = 0.0
    reward_high: float = 1.0
    name: str = "tabular"
    has_model: bool = field(default=True, init=False)

    def __post_init__(self):
        self.P = torch.as_tensor(self.P, dtype=torch.float64)
        self.R = torch.as_tensor(self.R, dtype=torch.float64)
        self.p0 = torch.as_tensor(self.p0, dtype=torch.float64)
        self.H = int(self.H)
        if self.H < 1:
            raise ConfigError(f"horizon H must be >= 1, got {self.H}")
        per_step = self.P.dim() == 4
        if self.P.dim() not in (3, 4) or self.P.shape[-3] != self.P.shape[-1] or \
                (per_step and self.P.shape[0] != self.H):
            raise ConfigError(f"P must have shape [S, A, S] or [H, S, A, S] (H = {self.H}), got {tuple(self.P.shape)}")
        S, A = self.P.shape[-3:-1]
        r_shape = (self.H, S, A) if per_step else (S, A)
        if self.R.shape != r_shape or self.p0.shape != (S,):
            raise ConfigError(f"R must be {list(r_shape)} and p0 [S]; got {tuple(self.R.shape)}, "
                              f"{tuple(self.p0.shape)}")
        if per_step and self.reward_table is not None:
            raise ConfigError("a reward_table needs stationary dynamics P [S, A, S]")
        if (self.P < 0).any() or not torch.allclose(self.P.sum(-1), torch.ones(self.P.shape[:-1], dtype=torch.float64)):
            raise ConfigError("every P[s, a] must be a probability distribution")
        if (self.p0 < 0).any() or abs(float(self.p0.sum()) - 1) > 1e-9:
            raise ConfigError("p0 must be a probability distribution")
        if self.reward_table is not None:
            self.reward_table = torch.as_tensor(self.reward_table, dtype=torch.float64)
            self.R = (self.P * self.reward_table).sum(-1)
        if (self.R < -1e-12).any() or (self.R > 1 + 1e-12).any():
            raise ConfigError("mean rewards R must lie in [0, 1] (rescale with reward_low/reward_high)")
        self.R = self.R.clamp(0, 1)
        self._build_tables()

    # ---- shapes ------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The env's label (as gym ids), for logs and summary.json."""
        return self.name

    @property
    def S(self) -> int:
        return int(self.P.shape[-3])

    @property
    def A(self) -> int:
        return int(self.P.shape[-2])

    @property
    def stationary(self) -> bool:
        """True when P and R are the same at every step h."""
        return self.P.dim() == 3

    def step_model(self, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(P_h [S, A, S], R_h [S, A])``, the dynamics and mean rewards of step h."""
        return (self.P, self.R) if self.stationary else (self.P[h], self.R[h])

    def _build_tables(self) -> None:
        """Cumulative tables (torch for batched sampling, Python lists for the per-episode fast path)."""
        self._cdf = _safe_cdf(self.P)                       # [S, A, S] (or [H, S, A, S])
        self._p0_cdf = _safe_cdf(self.p0)                  # [S]
        SA = self.S * self.A
        rows = self._cdf.reshape(-1, SA, self.S).tolist()
        self._cdf_rows_h = rows * self.H if self.stationary else rows     # per step h (the same list if stationary)
        self._p0_list = self._p0_cdf.tolist()
        self._r_list = self.R.reshape(-1).tolist()
        self._r_list_h = [self._r_list] * self.H if self.stationary else self.R.reshape(self.H, SA).tolist()
        self._rt_list = None if self.reward_table is None else self.reward_table.reshape(
            self.S * self.A, self.S).tolist()

    # ---- simulation --------------------------------------------------------------------------
    def uniforms(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """The uniforms consumed by ``n`` episodes: [n, H, 3] (initial state, next state, reward)."""
        return torch.rand(n, self.H, 3, generator=generator, dtype=torch.float64)

    def episode_from_uniforms(self, policy: list, u: list) -> tuple[list, list, list]:
        """One episode as a pure function of a deterministic policy and its uniforms (fast path).

        Args:
            policy: ``policy[h][s]`` action ints (e.g. ``pi.tolist()`` of a [H, S] LongTensor).
            u: ``u[h] = (u_init, u_next, u_reward)``, e.g. ``uniforms(1, g)[0].tolist()``.

        Returns:
            (states, actions, rewards): ``states`` has H+1 entries (the last is the state after step
            H-1), ``actions`` and ``rewards`` H entries.
        """
        A, cdf_h, rew_h, table = self.A, self._cdf_rows_h, self._r_list_h, self._rt_list
        s = bisect.bisect_right(self._p0_list, u[0][0])
        states, actions, rewards = [], [], []
        for h in range(self.H):
            a = policy[h][s]
            row = s * A + a
            s2 = bisect.bisect_right(cdf_h[h][row], u[h][1])
            r = table[row][s2] if table is not None else (1.0 if u[h][2] < rew_h[h][row] else 0.0)
            states.append(s)
            actions.append(a)
            rewards.append(r)
            s = s2
        states.append(s)
        return states, actions, rewards

    def sample_episodes(self, policy: torch.Tensor, n: int, generator: torch.Generator):
        """``n`` episodes at once, vectorized over episodes (same uniforms -> same draws as the fast path).

        Args:
            policy: deterministic ``[H, S]`` / ``[S]`` LongTensor, or stochastic ``[H, S, A]`` / ``[S, A]``
                probabilities (actions then drawn with an extra uniform per step).

        Returns:
            (states [n, H+1], actions [n, H], rewards [n, H]); ``states[:, H]`` is the final state.
        """
        u = self.uniforms(n, generator)
        stochastic = policy.is_floating_point()
        if stochastic:
            pol = policy if policy.dim() == 3 else policy.expand(self.H, *policy.shape)
            pol_cdf = _safe_cdf(pol.to(torch.float64))
            ua = torch.rand(n, self.H, generator=generator, dtype=torch.float64)
        else:
            pi = self._as_deterministic(policy)
        states = torch.empty(n, self.H + 1, dtype=torch.long)
        actions = torch.empty(n, self.H, dtype=torch.long)
        rewards = torch.empty(n, self.H, dtype=torch.float64)
        s = torch.searchsorted(self._p0_cdf, u[:, 0, 0].contiguous(), right=True)
        states[:, 0] = s
        for h in range(self.H):
            if stochastic:
                a = torch.searchsorted(pol_cdf[h, s], ua[:, h:h + 1], right=True).squeeze(1)
            else:
                a = pi[h, s]
            cdf = self._cdf if self.stationary else self._cdf[h]
            s2 = torch.searchsorted(cdf[s, a], u[:, h, 1:2].contiguous(), right=True).squeeze(1)
            if self.reward_table is not None:
                r = self.reward_table[s, a, s2]
            else:
                r = (u[:, h, 2] < self.step_model(h)[1][s, a]).to(torch.float64)
            actions[:, h], rewards[:, h], states[:, h + 1] = a, r, s2
            s = s2
        return states, actions, rewards

    def _as_deterministic(self, policy: torch.Tensor) -> torch.Tensor:
        pi = torch.as_tensor(policy, dtype=torch.long)
        if pi.dim() == 1:
            pi = pi.expand(self.H, self.S)
        if pi.shape != (self.H, self.S):
            raise ConfigError(f"a deterministic policy must be [H, S] = [{self.H}, {self.S}], got {tuple(pi.shape)}")
        return pi

    # ---- planning with the true model --------------------------------------------------------
    def value_iteration(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Optimal finite-horizon values by backward induction.

        ``Q*_h(s, a) = R_h(s, a) + sum_s' P_h(s'|s, a) V*_{h+1}(s')``, ``V*_h = max_a Q*_h``, ``V*_H = 0``.

        Returns:
            (V [H+1, S], Q [H, S, A], pi [H, S]) with ``pi`` greedy in ``Q`` (lowest index on ties).
        """
        V = torch.zeros(self.H + 1, self.S, dtype=torch.float64)
        Q = torch.zeros(self.H, self.S, self.A, dtype=torch.float64)
        for h in reversed(range(self.H)):
            P, R = self.step_model(h)
            Q[h] = R + P @ V[h + 1]
            V[h] = Q[h].max(-1).values
        return V, Q, Q.argmax(-1)

    def optimal_value(self) -> float:
        """rho* = p0^T V*_0: the best expected H-step return (in [0, 1] reward units)."""
        return float(self.p0 @ self.value_iteration()[0][0])

    def policy_values(self, policy: torch.Tensor) -> torch.Tensor:
        """V^pi [H+1, S] of a deterministic ``[H, S]``/``[S]`` or stochastic ``[H, S, A]``/``[S, A]`` policy.

        ``V^pi_h(s) = sum_a pi_h(a|s) (R_h(s, a) + sum_s' P_h(s'|s, a) V^pi_{h+1}(s'))``.
        """
        if policy.is_floating_point():
            probs = policy.to(torch.float64)
            probs = probs if probs.dim() == 3 else probs.expand(self.H, *probs.shape)
        else:
            pi = self._as_deterministic(policy)
            probs = torch.nn.functional.one_hot(pi, self.A).to(torch.float64)
        V = torch.zeros(self.H + 1, self.S, dtype=torch.float64)
        for h in reversed(range(self.H)):
            P, R = self.step_model(h)
            V[h] = (probs[h] * (R + P @ V[h + 1])).sum(-1)
        return V

    def policy_value(self, policy: torch.Tensor) -> float:
        """rho^pi = p0^T V^pi_0, the expected H-step return of ``policy`` (in [0, 1] reward units)."""
        return float(self.p0 @ self.policy_values(policy)[0])

    def policy_value_batch(self, policies: torch.Tensor, chunk_elems: int = 1 << 22) -> torch.Tensor:
        """rho^pi of many deterministic policies ``[K, H, S]`` at once (backward induction batched over K).

        Each distinct policy is evaluated once (a greedy learner repeats its policy a lot); ``V^pi_0``
        of every policy is then weighted by ``p0`` in chunks of ``chunk_elems / S^2`` policies, the same
        matrix-vector products as evaluating every policy, so the values do not depend on the repeats
        (a BLAS product's rounding can depend on the row's position in the matrix).

        Returns:
            [K] float64 expected returns in [0, 1] reward units.
        """
        pis = torch.as_tensor(policies, dtype=torch.long)
        K = pis.shape[0]
        if K == 0:
            return torch.zeros(0, dtype=torch.float64)
        step = max(1, chunk_elems // (self.S * self.S))
        flat = np.ascontiguousarray(pis.reshape(K, -1).numpy())
        rows_as_bytes = flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel()
        _, first, inverse = np.unique(rows_as_bytes, return_index=True, return_inverse=True)
        distinct = pis[torch.from_numpy(first)]
        rows = torch.arange(self.S)
        v0 = []
        for k0 in range(0, distinct.shape[0], step):
            pi = distinct[k0:k0 + step]
            V = torch.zeros(pi.shape[0], self.S, dtype=torch.float64)
            for h in reversed(range(self.H)):
                a = pi[:, h, :]                                   # [k, S]
                P, R = self.step_model(h)
                V = R[rows, a] + (P[rows, a] @ V.unsqueeze(-1)).squeeze(-1)
            v0.append(V)
        V0 = torch.cat(v0)[torch.from_numpy(inverse.reshape(-1))]          # V^pi_0 of every policy [K, S]
        return torch.cat([V0[k0:k0 + step] @ self.p0 for k0 in range(0, K, step)])

    def to_native_return(self, ret):
        """Map an H-step return in [0, 1] reward units back to the env's native reward units."""
        return ret * (self.reward_high - self.reward_low) + self.H * self.reward_low

    def to_native_regret(self, regret):
        """Regret (a difference of returns) in native reward units."""
        return regret * (self.reward_high - self.reward_low)


# ---- constructors ----------------------------------------------------------------------------
def riverswim(horizon: int = 20, n_states: int = 6) -> TabularMDP:
    """The standard RiverSwim chain (Strehl & Littman 2008; the 6-state variant of Osband et al. 2013).

    Actions: 0 = left (swim with the current: always moves one state left), 1 = right (against it):
    from the leftmost state it moves right w.p. 0.6 (stays 0.4); in the middle right 0.35, stay 0.6,
    left 0.05; at the rightmost state stay 0.6, left 0.4. Mean rewards: 0.005 for left at state 0,
    1 for right at the last state, 0 elsewhere. Episodes start in state 0.
    """
    S = int(n_states)
    if S < 2:
        raise ConfigError(f"riverswim needs n_states >= 2, got {S}")
    P = torch.zeros(S, 2, S, dtype=torch.float64)
    for s in range(S):
        P[s, 0, max(s - 1, 0)] = 1.0
        if s == 0:
            P[s, 1, 0], P[s, 1, 1] = 0.4, 0.6
        elif s == S - 1:
            P[s, 1, s - 1], P[s, 1, s] = 0.4, 0.6
        else:
            P[s, 1, s - 1], P[s, 1, s], P[s, 1, s + 1] = 0.05, 0.6, 0.35
    R = torch.zeros(S, 2, dtype=torch.float64)
    R[0, 0], R[S - 1, 1] = 0.005, 1.0
    p0 = torch.zeros(S, dtype=torch.float64)
    p0[0] = 1.0
    return TabularMDP(P, R, horizon, p0, name=f"riverswim{S}")


def random_mdp(S: int = 10, A: int = 3, H: int = 10, seed: int = 0, alpha: float = 1.0,
               drift: float = 0.0) -> TabularMDP:
    """A random MDP: ``P[s, a] ~ Dirichlet(alpha 1_S)``, Bernoulli rewards with means ``U[0, 1]``,
    uniform initial distribution; the same ``seed`` gives the same MDP.

    ``drift > 0`` makes the dynamics differ across steps (a time-inhomogeneous MDP, which breaks the
    assumption of learners that pool their statistics over h): a second MDP ``(P', R')`` is drawn
    after the first and step h uses ``P_h = (1 - lam_h) P + lam_h P'`` (likewise R) with
    ``lam_h = drift h / (H - 1)``, so step 0 is the stationary MDP and, at ``drift = 1``, step H-1 is
    the second one. ``drift = 0`` gives the stationary MDP of the same seed.
    """
    if S < 1 or A < 1 or alpha <= 0:
        raise ConfigError(f"random_mdp needs S, A >= 1 and alpha > 0, got S={S}, A={A}, alpha={alpha}")
    if not 0.0 <= drift <= 1.0:
        raise ConfigError(f"random_mdp drift must lie in [0, 1], got {drift}")
    rng = np.random.default_rng(int(seed))
    P = torch.from_numpy(rng.dirichlet(np.full(S, float(alpha)), size=(S, A)))
    P = P / P.sum(-1, keepdim=True)
    R = torch.from_numpy(rng.uniform(0.0, 1.0, size=(S, A)))
    p0 = torch.full((S,), 1.0 / S, dtype=torch.float64)
    name = f"random_mdp(S={S},A={A},seed={seed})"
    if drift > 0:
        P1 = torch.from_numpy(rng.dirichlet(np.full(S, float(alpha)), size=(S, A)))
        P1 = P1 / P1.sum(-1, keepdim=True)
        R1 = torch.from_numpy(rng.uniform(0.0, 1.0, size=(S, A)))
        lam = torch.tensor([drift * h / max(H - 1, 1) for h in range(H)], dtype=torch.float64)
        P = (1 - lam)[:, None, None, None] * P + lam[:, None, None, None] * P1
        P = P / P.sum(-1, keepdim=True)
        R = (1 - lam)[:, None, None] * R + lam[:, None, None] * R1
        name = f"random_mdp(S={S},A={A},seed={seed},drift={drift:g})"
    return TabularMDP(P, R, H, p0, name=name)


def from_gym(env, horizon: int) -> TabularMDP:
    """The exact model of a gymnasium toy-text env (``env.unwrapped.P``, e.g. FrozenLake-v1, Taxi-v3).

    ``P[s][a]`` is a list of ``(prob, next_state, reward, terminated)``. Fixed horizon semantics: a
    state entered by a terminating transition becomes absorbing with native reward 0 (the gym episode
    is over); if such a state can also be entered without terminating, a separate absorbing copy is
    added. Native rewards (incl. the 0 after termination) are mapped affinely into [0, 1].

    Raises:
        ConfigError: the env has no ``P`` model or non-Discrete spaces.
    """
    base = getattr(env, "unwrapped", env)
    model = getattr(base, "P", None)
    S, A = _discrete_sizes(env)
    if not isinstance(model, dict):
        raise ConfigError(f"{_env_name(env)} exposes no transition model env.unwrapped.P")
    term_only, entered = set(), set()
    for s in range(S):
        for a in range(A):
            for _, s2, _, done in model[s][a]:
                (term_only if done else entered).add(int(s2))
    copies = {s2: (s2 if s2 not in entered else None) for s2 in term_only}
    extra = 0
    for s2 in sorted(copies):
        if copies[s2] is None:
            copies[s2] = S + extra
            extra += 1
    n = S + extra
    absorbing = {v for v in copies.values()}
    P = torch.zeros(n, A, n, dtype=torch.float64)
    Rn = torch.zeros(n, A, n, dtype=torch.float64)      # native reward, probability-weighted sum
    for s in range(n):
        for a in range(A):
            if s in absorbing:
                P[s, a, s] = 1.0
                continue
            for p, s2, r, done in model[s][a]:
                t = copies[int(s2)] if done else int(s2)
                P[s, a, t] += p
                Rn[s, a, t] += p * float(r)
    Rn = torch.where(P > 0, Rn / P.clamp_min(1e-300), torch.zeros_like(Rn))
    low = min(0.0, float(Rn[P > 0].min()))
    high = max(0.0, float(Rn[P > 0].max()))
    if high <= low:
        high = low + 1.0
    table = (Rn - low) / (high - low)
    P = P / P.sum(-1, keepdim=True)
    p0 = torch.zeros(n, dtype=torch.float64)
    init = getattr(base, "initial_state_distrib", None)
    if init is None:
        raise ConfigError(f"{_env_name(env)} exposes P but no initial_state_distrib; cannot build its model")
    p0[:S] = torch.as_tensor(np.asarray(init, dtype=np.float64))
    return TabularMDP(P, torch.zeros(n, A), horizon, p0 / p0.sum(), reward_table=table,
                      reward_low=low, reward_high=high, name=_env_name(env))


class GymTabularEnv:
    """A Discrete-observation/Discrete-action gymnasium env without a known model (regret unavailable).

    Same simulation interface as ``TabularMDP`` (``S``, ``A``, ``H``, ``episode_from_uniforms``-like
    ``run_episode``), so the tabular learners run on it; ``has_model`` is False and there is no
    ``value_iteration``. After the gym episode terminates or truncates the agent sits in an extra
    absorbing state ``S_env`` (index ``S - 1``) with native reward 0 until step H. Native rewards are
    clipped to ``[reward_low, reward_high]`` and mapped into [0, 1].
    """

    has_model = False

    def __init__(self, env, horizon: int, reward_low: float = 0.0, reward_high: float = 1.0, seed: int = 0,
                 own_horizon: int | None = None):
        if not reward_high > reward_low:
            raise ConfigError(f"need reward_high > reward_low, got [{reward_low}, {reward_high}]")
        self.env = env
        # the env's own episode limit (``env.horizon`` may cut the learning episodes below it): the released policy is
        # evaluated there, on this instance with its time limit lifted (no second instance: ICU-Sepsis's is 200 MB)
        self.own_horizon = int(own_horizon or horizon)
        s_env, self.A = _discrete_sizes(env)
        self.S = s_env + 1
        self.H = int(horizon)
        self.reward_low, self.reward_high = float(min(reward_low, 0.0)), float(max(reward_high, 0.0))
        self.name = self.id = _env_name(env)
        self._seed = int(seed)
        self._episodes = 0

    def run_episode(self, policy: list, seed: int | None = None, horizon: int | None = None) -> tuple[list, list, list]:
        """One H-step episode of ``policy[h][s]`` on the real env, states with H+1 entries: the next user's
        (seeded by episode index), or, given a ``seed`` (``eval_seeds``), an episode from that seed that moves
        no user's. ``horizon``: another length (beyond H on an instance that runs to the env's own limit; the
        evaluation of a stationary released policy); the episode stops once the env's episode is over."""
        if seed is None:
            seed = self._seed * 1_000_003 + self._episodes
            self._episodes += 1
        H = self.H if horizon is None else int(horizon)
        env = self.env
        limit = _time_limit(env) if H > self.H else None
        if limit is not None:      # the same instance, its episode limit lifted to H for this episode
            saved, limit._max_episode_steps = limit._max_episode_steps, H
        try:
            return self._episode(env, policy, int(seed), H, horizon is not None)
        finally:
            if limit is not None:
                limit._max_episode_steps = saved

    def _episode(self, env, policy, seed: int, H: int, stop: bool) -> tuple[list, list, list]:
        obs, _ = env.reset(seed=int(seed))
        s, over = int(obs), False
        states, actions, rewards = [], [], []
        span = self.reward_high - self.reward_low
        for h in range(H):
            if over and stop:
                break
            a = policy[h][s]
            r = 0.0
            if not over:
                obs, r, term, trunc, _ = env.step(a)
                over = bool(term or trunc)
            r = (min(max(float(r), self.reward_low), self.reward_high) - self.reward_low) / span
            states.append(s)
            actions.append(a)
            rewards.append(r)
            s = self.S - 1 if over else int(obs)
        states.append(s)
        return states, actions, rewards

    def eval_seeds(self, n: int) -> list[int]:
        """Reset seeds of ``n`` held-out evaluation episodes: public ones (``streams.public_reset_seeds``,
        stream ``eval``), the same at every evaluation."""
        return public_reset_seeds(self._seed, "eval", 0, int(n))

    def to_native_return(self, ret):
        return ret * (self.reward_high - self.reward_low) + self.H * self.reward_low

    def native_return(self, rewards: list) -> float:
        """The native return of one episode's [0, 1] rewards (any length)."""
        return float(sum(rewards)) * (self.reward_high - self.reward_low) + len(rewards) * self.reward_low

    def to_native_regret(self, regret):
        return regret * (self.reward_high - self.reward_low)


def make_tabular(env, horizon: int | None = None, reward_low: float = 0.0, reward_high: float = 1.0,
                 seed: int = 0):
    """Turn whatever the env config built into a tabular env.

    Accepts a ``TabularMDP`` (returned as is), a gymnasium env, or a factory with ``.make(seed)`` and
    ``.horizon`` (``dppo.envs.gym_env.GymEnvFactory``). A toy-text env exposing its model becomes a
    ``TabularMDP`` (exact regret); any other Discrete env a ``GymTabularEnv`` (regret unavailable).
    """
    if isinstance(env, (TabularMDP, GymTabularEnv)):
        return env
    own = None
    if hasattr(env, "make") and not hasattr(env, "step"):
        horizon = horizon if horizon is not None else getattr(env, "horizon", None)
        own = getattr(env, "own_horizon", None)
        env = env.make()
    if horizon is None:
        spec = getattr(env, "spec", None)
        horizon = getattr(spec, "max_episode_steps", None)
    if horizon is None:
        raise ConfigError(f"{_env_name(env)} has no episode limit; set env.horizon")
    if isinstance(getattr(getattr(env, "unwrapped", env), "P", None), dict):
        return from_gym(env, int(horizon))
    return GymTabularEnv(env, int(horizon), reward_low, reward_high, seed, own_horizon=own)


# ---- helpers -------------------------------------------------------------------------------
def _time_limit(env):
    """The ``TimeLimit`` wrapper in ``env``'s wrapper chain, or None."""
    from gymnasium.wrappers import TimeLimit

    while env is not None:
        if isinstance(env, TimeLimit):
            return env
        env = getattr(env, "env", None)
    return None


def _safe_cdf(p: torch.Tensor) -> torch.Tensor:
    """Cumulative sums along the last axis, with every entry from the last positive-probability
    index on set to 2 so that ``searchsorted(cdf, u, right=True)`` with u in [0, 1) never returns an
    out-of-range or zero-probability index despite rounding."""
    cdf = p.cumsum(-1)
    cdf = cdf / cdf[..., -1:].clamp_min(1e-300)
    n = p.shape[-1]
    idx = torch.arange(n).expand_as(p)
    last = torch.where(p > 0, idx, torch.zeros_like(idx)).amax(-1, keepdim=True)
    return torch.where(idx >= last, torch.full_like(cdf, 2.0), cdf)


def _discrete_sizes(env) -> tuple[int, int]:
    from gymnasium.spaces import Discrete

    obs, act = getattr(env, "observation_space", None), getattr(env, "action_space", None)
    if not (isinstance(obs, Discrete) and isinstance(act, Discrete)):
        raise ConfigError(f"{_env_name(env)} needs Discrete observation and action spaces for tabular "
                          f"learners, got {obs} and {act}; use a tabular env (env=riverswim, env=random_mdp, "
                          f"env=random_mdp_drift, or a gymnasium id with Discrete spaces, e.g. env.id=FrozenLake-v1)")
    if int(obs.start) != 0 or int(act.start) != 0:
        raise ConfigError(f"{_env_name(env)}: Discrete spaces must start at 0")
    return int(obs.n), int(act.n)


def _env_name(env) -> str:
    spec = getattr(env, "spec", None)
    return getattr(spec, "id", None) or type(getattr(env, "unwrapped", env)).__name__
