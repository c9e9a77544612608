"""Episode collection: one engine for users' groups, public rollouts and evaluation, on gymnasium's
vector API, plus the former lockstep collector (kept as the reference for tests and the bench).

``RolloutEngine.run(policy, seeds, uniforms)`` runs one episode per reset seed, all in lockstep with
one batched policy call per step. Episode i's actions come from the inverse CDF of the policy at
``uniforms[i, t]``: the caller draws those from the episode owner's own stream
(``dppo.data.streams``), so an episode depends only on its seed, its uniforms and the policy, never
on the other episodes of the batch or on how they are packed into the vector env.

Backends (``env.vectorization``): ``native`` (the env's own vectorized implementation, CartPole's
``CartPoleVectorEnv``; its reset draws every sub-env from one seed, so each sub-env's start state is
overwritten with the state a single env reset with that episode's seed reaches), ``sync`` /
``async`` (``gymnasium.vector.SyncVectorEnv`` / ``AsyncVectorEnv``, reset with one seed per
sub-env), ``none`` (a list of single envs, stepping only the running ones). Vector envs are built
once per batch size and reused for the whole run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dppo.errors import ConfigError, DataError
from dppo.policies.base import pad_rows

VECTORIZATION = ("auto", "native", "sync", "async", "none")


@dataclass
class Episodes:
    """Padded episodes: ``obs[N, T, ...]``, ``actions[N, T]``, ``rewards[N, T]`` (clipped, float64),
    ``mask[N, T]`` (True on real steps), ``returns[N]`` (sum of clipped rewards). For a round, the N
    episodes are m users x G rollouts, user-major (episode i belongs to user i // G).
    ``terminated[N]`` is True when the episode ended in a terminal state (False when it was truncated at the
    horizon: its last step should be bootstrapped) and ``final_obs[N, ...]`` is the observation after its
    last step (both None from the former collector)."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    mask: torch.Tensor
    returns: torch.Tensor
    clipped: torch.Tensor  # (N,) rewards clipped per episode
    group_size: int = 1
    terminated: torch.Tensor | None = None
    final_obs: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(1)

    @property
    def reward_clip_fraction(self) -> float:
        return float(self.clipped.sum()) / max(self.env_steps, 1)

    def take(self, lo: int, hi: int, group_size: int = 1) -> "Episodes":
        """Episodes lo..hi-1 (padding trimmed to their longest)."""
        T = max(1, int(self.mask[lo:hi].sum(1).max())) if hi > lo else 1
        cut = lambda x: None if x is None else x[lo:hi]
        return Episodes(self.obs[lo:hi, :T], self.actions[lo:hi, :T], self.rewards[lo:hi, :T], self.mask[lo:hi, :T],
                        self.returns[lo:hi], self.clipped[lo:hi], int(group_size), cut(self.terminated),
                        cut(self.final_obs))

    @property
    def users(self) -> int:
        return self.mask.shape[0] // self.group_size

    @property
    def env_steps(self) -> int:
        return int(self.mask.sum())

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """Reshape a per-episode tensor (N, ...) to (users, G, ...)."""
        return x.reshape(self.users, self.group_size, *x.shape[1:])


UserEpisodes = Episodes  # the former name


def clip_rewards(rewards: np.ndarray, bound: float | None) -> tuple[np.ndarray, int]:
    """Clip rewards to [-bound, bound] (enforces the range the sensitivity assumes); NaN/inf is an error."""
    if not np.all(np.isfinite(rewards)):
        raise DataError("the environment returned a NaN/inf reward; this round's data is discarded and not released")
    if bound is None:
        return rewards, 0
    clipped = np.clip(rewards, -bound, bound)
    return clipped, int(np.count_nonzero(clipped != rewards))


def inverse_cdf_actions(logits: torch.Tensor, uniforms: torch.Tensor | None) -> torch.Tensor:
    """a = min{k : sum_{j<=k} pi_j >= u} (exact sampling from softmax(logits)); argmax if ``uniforms`` is None."""
    if uniforms is None:
        return logits.argmax(-1)
    cdf = torch.softmax(logits.double(), dim=-1).cumsum_(-1)
    return (cdf < uniforms[:, None]).sum(-1).clamp_max_(logits.shape[-1] - 1)


class _ListBackend:
    """n single envs; only the running ones are stepped."""

    def __init__(self, factory, n: int):
        self.envs = [factory.make() for _ in range(n)]

    def reset(self, seeds):
        return np.stack([np.asarray(e.reset(seed=int(s))[0], dtype=np.float32) for e, s in zip(self.envs, seeds)])

    def step(self, actions: np.ndarray, active: np.ndarray, cur: np.ndarray):
        obs, rew = cur.copy(), np.zeros(len(self.envs))
        term, trunc = np.zeros(len(self.envs), dtype=bool), ~active
        for i in np.flatnonzero(active):
            a = actions[i] if actions.dtype.kind == "f" else int(actions[i])  # Box actions stay vectors
            o, r, te, tr, _ = self.envs[i].step(a)
            obs[i], rew[i], term[i], trunc[i] = np.asarray(o, dtype=np.float32), float(r), bool(te), bool(tr)
        return obs, rew, term, trunc

    def close(self):
        for e in self.envs:
            e.close()


class _VectorBackend:
    """A gymnasium vector env of n sub-envs (``native``: the env's own; ``sync``/``async``)."""

    def __init__(self, factory, n: int, mode: str):
        import gymnasium as gym

        self.mode = mode
        vmode = "vector_entry_point" if mode == "native" else mode
        if mode == "native" and not gym.spec(factory.id).vector_entry_point:
            raise ConfigError(f"env.vectorization=native: {factory.id} has no native vectorized implementation; "
                              f"use env.vectorization=sync (or auto)")
        self.vec = gym.make_vec(factory.id, num_envs=n, vectorization_mode=vmode,
                                max_episode_steps=factory.horizon, **factory.kwargs)
        if mode == "native":
            self.probe = factory.make()
            self.vec.reset(seed=0)
            state = getattr(self.vec.unwrapped, "state", None)
            self.probe.reset(seed=0)
            single = getattr(self.probe.unwrapped, "state", None)
            if not (isinstance(state, np.ndarray) and isinstance(single, np.ndarray)
                    and state.shape == (single.shape[0], n)):
                raise ConfigError(f"env.vectorization=native: {factory.id}'s vector env has no per-sub-env state "
                                  f"to seed each user's start from; use env.vectorization=sync")

    def reset(self, seeds):
        if self.mode != "native":
            return np.asarray(self.vec.reset(seed=[int(s) for s in seeds])[0], dtype=np.float32)
        self.vec.reset(seed=0)
        obs = []
        for i, s in enumerate(seeds):  # each start state = the single env's reset with that seed
            o, _ = self.probe.reset(seed=int(s))
            self.vec.unwrapped.state[:, i] = self.probe.unwrapped.state
            obs.append(np.asarray(o, dtype=np.float32))
        return np.stack(obs)

    def step(self, actions: np.ndarray, active: np.ndarray, cur: np.ndarray):
        obs, rew, term, trunc, _ = self.vec.step(actions)
        return (np.asarray(obs, dtype=np.float32), np.asarray(rew, dtype=np.float64), np.asarray(term, dtype=bool),
                np.asarray(trunc, dtype=bool))

    def close(self):
        self.vec.close()
        if self.mode == "native":
            self.probe.close()


def resolve_vectorization(factory) -> str:
    """The backend of ``factory.vectorization``: ``auto`` = native if the env has one, else sync; factories
    without a gymnasium id (the bandit) use ``none``."""
    mode = getattr(factory, "vectorization", "none")
    if mode not in VECTORIZATION:
        raise ConfigError(f"env.vectorization must be one of {VECTORIZATION}, got '{mode}'")
    if mode == "auto":
        import gymnasium as gym

        return "native" if gym.spec(factory.id).vector_entry_point else "sync"
    return mode


class RolloutEngine:
    """Collects batches of seeded episodes with per-episode uniforms (module docstring).

    Args:
        factory: an env factory (``make()``, ``horizon``, ``observation_space``; gym factories also
            ``id``, ``kwargs`` and ``vectorization``).
    """

    def __init__(self, factory):
        self.factory = factory
        self.mode = resolve_vectorization(factory)
        self._backends: dict[int, object] = {}

    def backend(self, n: int):
        if n not in self._backends:
            self._backends[n] = (_ListBackend(self.factory, n) if self.mode == "none"
                                 else _VectorBackend(self.factory, n, self.mode))
        return self._backends[n]

    def close(self) -> None:
        for b in self._backends.values():
            b.close()
        self._backends.clear()

    @torch.no_grad()
    def run(self, policy, seeds: list[int], uniforms: torch.Tensor | None, *, reward_bound: float | None,
            group_size: int = 1) -> Episodes:
        """One episode per seed; ``uniforms`` (N, horizon) drive the sampling (None: greedy); for a continuous
        policy (N, horizon, d) or (N, horizon) when d = 1, mapped to Gaussian samples by the inverse normal CDF.

        Rewards are clipped to [-reward_bound, reward_bound] as they arrive, before anything else sees them.
        Raises ``DataError`` on NaN/inf observations or rewards, or if the env raises mid-episode.
        """
        n, horizon = len(seeds), int(self.factory.horizon)
        try:
            backend = self.backend(n)
            cur = backend.reset(seeds)
            obs_buf = np.zeros((n, horizon) + cur.shape[1:], dtype=np.float32)
            continuous = bool(getattr(policy, "continuous", False))  # Box actions (GaussianMLPPolicy)
            act_buf = (np.zeros((n, horizon, int(policy.action_dim)), dtype=np.float32) if continuous
                       else np.zeros((n, horizon), dtype=np.int64))
            rew_buf = np.zeros((n, horizon), dtype=np.float64)
            lengths = np.zeros(n, dtype=np.int64)
            active = np.ones(n, dtype=bool)
            terminated = np.zeros(n, dtype=bool)
            final = np.array(cur, dtype=np.float32)   # the observation after each episode's last step
            for t in range(horizon):
                if not active.any():
                    break
                if not np.isfinite(cur).reshape(n, -1).all(1)[active].all():
                    raise DataError("the environment returned a NaN/inf observation; this round's data is discarded")
                u_t = None if uniforms is None else uniforms[:, t]
                obs_t = pad_rows(torch.from_numpy(cur))  # batch-invariant rows (MIN_ROWS)
                if continuous:  # the stored action is the Gaussian sample, the env gets it squashed/clipped
                    u_pad = None if u_t is None else pad_rows(u_t.reshape(n, -1))
                    samples = policy.sample_from_uniforms(obs_t, u_pad)[:n]
                    act_buf[:, t] = samples.numpy()
                    actions = policy.env_action(samples).numpy().astype(np.float32)
                else:
                    actions = inverse_cdf_actions(policy.logits(obs_t)[:n], u_t).numpy()
                    act_buf[:, t] = actions
                obs_buf[:, t] = cur  # rows of finished episodes are masked out below
                nxt, rew, term, trunc = backend.step(actions, active, cur)
                rew_buf[:, t] = np.where(active, rew, 0.0)
                lengths += active
                final[active] = nxt[active]
                terminated |= active & term
                active &= ~(term | trunc)
                cur = nxt
        except DataError:
            raise
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - any env failure aborts the round without releasing it
            self._backends.pop(n, None)
            raise DataError(f"the environment raised {type(err).__name__} mid-episode ({err}); "
                            f"the round is not released") from None
        T = max(1, int(lengths.max()))
        mask = np.arange(T)[None, :] < lengths[:, None]
        raw = np.where(mask, rew_buf[:, :T], 0.0)
        rewards, _ = clip_rewards(raw, reward_bound)
        clipped = torch.from_numpy((rewards != raw).sum(1))
        rewards = torch.from_numpy(np.where(mask, rewards, 0.0))
        obs = torch.from_numpy(obs_buf[:, :T].reshape(n, T, -1))
        return Episodes(obs, torch.from_numpy(act_buf[:, :T]), rewards, torch.from_numpy(mask), rewards.sum(1),
                        clipped, int(group_size), torch.from_numpy(terminated),
                        torch.from_numpy(final.reshape(n, -1)))


# ---- the former collector (reference implementation for the tests and scripts/bench_rollout.py) ----------
def collect_episodes(policy, env_factory, reset_seeds: list[int], *, reward_bound: float | None,
                     generator: torch.Generator | None = None, greedy: bool = False, envs=None) -> Episodes:
    """Run one episode per reset seed, stepping all users in lockstep with batched policy calls; envs are
    built per call and actions drawn from one shared generator (the collector before ``RolloutEngine``).
    """
    m, horizon = len(reset_seeds), env_factory.horizon
    envs = envs or [env_factory.make() for _ in range(m)]
    obs_list, act_list, rew_list = [[] for _ in range(m)], [[] for _ in range(m)], [[] for _ in range(m)]
    try:
        cur = [np.asarray(e.reset(seed=int(s))[0], dtype=np.float32) for e, s in zip(envs, reset_seeds)]
        active = list(range(m))
        for _ in range(horizon):
            if not active:
                break
            batch = np.stack([cur[i] for i in active]).reshape(len(active), -1)
            if not np.all(np.isfinite(batch)):
                raise DataError("the environment returned a NaN/inf observation; this round's data is discarded")
            actions, _ = policy.sample(torch.as_tensor(batch), greedy=greedy, generator=generator)
            still = []
            for j, i in enumerate(active):
                a = int(actions[j])
                nxt, r, term, trunc, _ = envs[i].step(a)
                obs_list[i].append(cur[i]); act_list[i].append(a); rew_list[i].append(float(r))
                cur[i] = np.asarray(nxt, dtype=np.float32)
                if not (term or trunc):
                    still.append(i)
            active = still
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - any env failure aborts the round without releasing it
        raise DataError(f"the environment raised {type(err).__name__} mid-episode ({err}); the round is not released") from None
    finally:
        for e in envs:
            e.close()
    counts = []
    for i in range(m):  # clipped before anything else sees the rewards
        clipped, c = clip_rewards(np.asarray(rew_list[i], dtype=np.float64), reward_bound)
        rew_list[i] = clipped
        counts.append(c)
    return _pad(obs_list, act_list, rew_list, torch.tensor(counts))


def _pad(obs_list, act_list, rew_list, clipped) -> Episodes:
    m = len(obs_list)
    T = max(1, max(len(a) for a in act_list))
    obs_shape = np.asarray(obs_list[0][0]).reshape(-1).shape
    obs = torch.zeros((m, T) + obs_shape)
    actions = torch.zeros(m, T, dtype=torch.long)
    rewards = torch.zeros(m, T, dtype=torch.float64)
    mask = torch.zeros(m, T, dtype=torch.bool)
    for i in range(m):
        n = len(act_list[i])
        if n:
            obs[i, :n] = torch.as_tensor(np.stack(obs_list[i])).reshape(n, -1)
            actions[i, :n] = torch.as_tensor(act_list[i])
            rewards[i, :n] = torch.as_tensor(rew_list[i], dtype=torch.float64)
            mask[i, :n] = True
    return Episodes(obs, actions, rewards, mask, rewards.sum(1), clipped)


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{k>=t} gamma^(k-t) r_k per episode (row), zero on padding."""
    out = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running * mask[:, t]
        out[:, t] = running * mask[:, t]
    return out

