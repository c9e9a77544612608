"""Episode collection: one engine for users' groups, public rollouts and evaluation, on gymnasium's
vector API, and the collector a policy-optimization learner asks for its rounds (the env side of the
learner interface: ``EpisodeCollector``; prompts have their own, ``dppo.envs.prompts.PromptCollector``).

``RolloutEngine.run(policy, seeds, uniforms)`` runs one episode per reset seed, all in lockstep with
one batched policy call per step. Episode i's actions come from the inverse CDF of the policy at
``uniforms[i, t]``: the caller draws those from the episode owner's own stream
(``dppo.data.streams``), so an episode depends only on its seed, its uniforms and the policy, never
on the other episodes of the batch or on how they are packed into the vector env.

Backends (``env.vectorization``): ``native`` (the env's own vectorized implementation: CartPole's
``CartPoleVectorEnv``, dppo's Acrobot and ICU-Sepsis ones, a user's ``gymnasium.vector.VectorEnv``), ``async``
(``gymnasium.vector.AsyncVectorEnv``), ``sync`` / ``none`` (a pool of single envs, stepping only the running
ones). Every backend works in slots: a slot takes the next episode (reset with its own seed) as soon as its own
ends, so a batch costs the steps its episodes take, not its longest episode times the batch. A vector env's
sub-env is reset alone through gymnasium's partial reset (``reset_mask``) or, for a native env that holds its
sub-envs as columns of a ``state`` array, by copying the state a single env reset with that seed reaches
(``_VectorBackend``). Observations are encoded in one call per step (``ObservationLayout.encode_batch``).
Memory is bounded: at most ``env.num_envs`` live instances (``resolve_num_envs``; ``auto`` sizes it to the
machine from the measured size of one instance), reused across users. Buffers grow with the steps taken
(``_StepRecord``), padded at the end to the longest episode, never to N x horizon. Backends are built once per
batch size and reused for the whole run.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch

from dppo.data import streams
from dppo.errors import ConfigError, DataError
from dppo.envs.masks import read_mask
from dppo.envs.memory import MAX_INSTANCES, instance_memory
from dppo.policies.base import pad_rows
from dppo.policies.observations import ObservationLayout

VECTORIZATION = ("auto", "native", "sync", "async", "none")
# the seeds of the engine's own resets (building a backend, checking a vector env's partial reset, parking an idle
# slot): public ones, never a user's (``streams.PUBLIC_SEED_BASE``: users' reset seeds lie below it)
PUBLIC = streams.PUBLIC_SEED_BASE


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

    def metrics(self) -> dict:
        """Public counts (users, episodes = users x G) and raw diagnostics of this round's users (``diag/``)."""
        return {"rollout/users": self.users, "rollout/episodes": self.users * self.group_size,
                "diag/return": float(self.returns.mean()), "diag/episode_length": float(self.lengths.double().mean()),
                "diag/env_steps": self.env_steps, "diag/reward_clip_fraction": self.reward_clip_fraction}


def clip_rewards(rewards: np.ndarray, bound: float | None,
                 reward_range: tuple[float, float] | None = None) -> tuple[np.ndarray, int]:
    """Clip rewards to the env's ``reward_range`` [low, high] and to [-bound, bound] (enforces the range the
    sensitivity assumes; either None: no such clip); NaN/inf is an error."""
    if not np.all(np.isfinite(rewards)):
        raise DataError("the environment returned a NaN/inf reward; this round's data is discarded and not released")
    clipped = rewards
    if reward_range is not None:
        clipped = np.clip(clipped, reward_range[0], reward_range[1])
    if bound is not None:
        clipped = np.clip(clipped, -bound, bound)
    return clipped, int(np.count_nonzero(clipped != rewards))


def inverse_cdf_actions(logits: torch.Tensor, uniforms: torch.Tensor | None) -> torch.Tensor:
    """a = min{k : sum_{j<=k} pi_j >= u} (exact sampling from softmax(logits)); argmax if ``uniforms`` is None."""
    if uniforms is None:
        return logits.argmax(-1)
    cdf = torch.softmax(logits.double(), dim=-1).cumsum_(-1)
    return (cdf < uniforms[:, None]).sum(-1).clamp_max_(logits.shape[-1] - 1)


class _PoolBackend:
    """``size`` single env instances, each reset and stepped on its own (``sync`` / ``none``)."""

    def __init__(self, factory, size: int, layout):
        self.envs = [factory.make() for _ in range(size)]
        self.layout = layout
        self.mask_source = getattr(factory, "mask_source", None)
        self.n_actions = int(getattr(factory.action_space, "n", 0)) if self.mask_source else 0
        self.infos: list = [{}] * len(self.envs)

    @property
    def size(self) -> int:
        return len(self.envs)

    def start(self, slots: np.ndarray, seeds: list) -> np.ndarray:
        """Reset ``slots[j]`` with ``seeds[j]``: their first observations (k, raw_dim)."""
        rows = []
        for i, s in zip(slots, seeds):
            o, self.infos[i] = self.envs[i].reset(seed=int(s))
            rows.append(self.layout.encode(o))
        return np.stack(rows)

    def masks(self, slots: np.ndarray) -> np.ndarray:
        """The slots' current action masks (k, A) bool (``dppo.envs.masks``)."""
        return np.stack([read_mask(self.envs[i], self.infos[i], self.mask_source, self.n_actions) for i in slots])

    def step(self, slots: np.ndarray, actions: np.ndarray):
        k = len(slots)
        obs = np.zeros((k, self.layout.raw_dim), dtype=np.float32)
        rew, term, trunc = np.zeros(k), np.zeros(k, dtype=bool), np.zeros(k, dtype=bool)
        for j, i in enumerate(slots):
            a = actions[j]
            a = int(a) if a.ndim == 0 and a.dtype.kind in "iu" else a   # Box / MultiDiscrete actions stay arrays
            o, r, te, tr, self.infos[i] = self.envs[i].step(a)
            obs[j], rew[j], term[j], trunc[j] = self.layout.encode(o), float(r), bool(te), bool(tr)
        return obs, rew, term, trunc

    def idle(self, slots: np.ndarray) -> None:
        """Slots whose episode ended with no episode left for them (a single env is simply not stepped)."""

    def close(self):
        for e in self.envs:
            e.close()


class _VectorBackend:
    """A gymnasium vector env of ``size`` sub-envs (``native``: the env's own; ``async``), every sub-env a slot.

    A slot whose episode ends takes the next episode at once, reset with that episode's own seed, so the vector
    env runs at its own speed whatever the spread of episode lengths. Two ways to reset one sub-env:

    * ``mask``: gymnasium's partial reset, ``reset(seed=[...], options={"reset_mask": mask})`` (gymnasium's
      ``SyncVectorEnv`` / ``AsyncVectorEnv``, the native ICU-Sepsis env, any ``VectorEnv`` that implements it;
      ``docs/api.md``); checked once at construction (the unmasked sub-envs keep their state);
    * ``state``: a native env holding its sub-envs as columns of a ``state`` array, with ``prev_done`` and
      ``steps`` (gymnasium's ``CartPoleVectorEnv``, dppo's Acrobot): the sub-env's column is set to the state a
      single env reset with that seed reaches, its pending autoreset and step count cleared.

    Any autoreset mode: a slot is reset by the engine before its next step (next-step autoreset never fires on
    it); with same-step autoreset the episode's last observation is read from ``info["final_obs"]``; a slot left
    idle is stepped with a dummy action and its results ignored (with autoreset disabled it is reset first, on
    a public seed).
    """

    def __init__(self, factory, size: int, mode: str, layout):
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode

        self.mode, self.layout, self.size = mode, layout, int(size)
        vmode = "vector_entry_point" if mode == "native" else mode
        if mode == "native" and not gym.spec(factory.id).vector_entry_point:
            raise ConfigError(f"env.vectorization=native: {factory.id} has no native vectorized implementation; "
                              f"use env.vectorization=sync (or auto)")
        extra = {}
        if mode != "native" and getattr(factory, "wrappers", None):
            extra["wrappers"] = [lambda e, c=c, kw=kw: c(e, **kw) for c, kw in factory.wrappers]
        self.vec = gym.make_vec(factory.id, num_envs=self.size, vectorization_mode=vmode,
                                max_episode_steps=factory.horizon, **extra, **factory.kwargs)
        self.single_space = factory.observation_space
        self.autoreset = self.vec.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.same_step = self.autoreset == AutoresetMode.SAME_STEP
        self.disabled = self.autoreset == AutoresetMode.DISABLED
        self.zero_action = None
        self.vec.reset(seed=PUBLIC)   # a native env's state arrays exist after its first reset
        u = self.vec.unwrapped
        self.protocol = "state" if (mode == "native" and isinstance(getattr(u, "state", None), np.ndarray)
                                    and hasattr(u, "prev_done") and hasattr(u, "steps")) else "mask"
        if self.protocol == "state":
            self.probe = factory.make()
            self._check_state_protocol()
        else:
            self._check_partial_reset(factory.id)
        self.mask_fn = None
        if getattr(factory, "mask_source", None):
            self.mask_fn = getattr(u, "action_masks", None)
            if not callable(self.mask_fn):
                raise ConfigError(f"{factory.id}'s vector env (env.vectorization={mode}) gives no action masks (an "
                                  f"action_masks() method returning one row per sub-env); use env.vectorization=sync, "
                                  f"or env.action_mask=none to run without masks")

    def masks(self, slots: np.ndarray) -> np.ndarray:
        """The slots' current action masks (k, A) bool, from the vector env's ``action_masks()``."""
        m = np.asarray(self.mask_fn(), dtype=bool)[np.asarray(slots, dtype=np.int64)]
        m[~m.any(1)] = True
        return m

    def _check_state_protocol(self) -> None:
        self.vec.reset(seed=PUBLIC)
        self.probe.reset(seed=PUBLIC)
        state, single = self.vec.unwrapped.state, getattr(self.probe.unwrapped, "state", None)
        if not (isinstance(single, np.ndarray) and state.shape == (single.shape[0], self.size)):
            raise ConfigError(f"env.vectorization=native: the vector env has no per-sub-env state to start each "
                              f"user's episode from; use env.vectorization=sync")

    def _check_partial_reset(self, env_id) -> None:
        """The vector env resets only the masked sub-envs (gymnasium's ``reset_mask``), each from its own seed."""
        first = self._rows(self.vec.reset(seed=[PUBLIC + i for i in range(self.size)])[0])
        if self.size < 2:
            return
        mask = np.zeros(self.size, dtype=bool)
        mask[0] = True
        try:
            again = self._rows(self.vec.reset(seed=[PUBLIC + self.size + i for i in range(self.size)],
                                              options={"reset_mask": mask})[0])
        except Exception as err:  # noqa: BLE001 - any failure: the interface is missing
            raise ConfigError(f"{env_id}'s vector env cannot reset one sub-env ({type(err).__name__}: {err}); "
                              f"implement gymnasium's partial reset, reset(seed=[...], options={{'reset_mask': "
                              f"mask}}) (docs/api.md), or use env.vectorization=sync") from None
        if not np.array_equal(first[1:], again[1:]):
            raise ConfigError(f"{env_id}'s vector env reset sub-envs outside options['reset_mask']; implement "
                              f"gymnasium's partial reset (docs/api.md), or use env.vectorization=sync")

    def _rows(self, obs) -> np.ndarray:
        return self.layout.encode_batch(obs, self.size)

    def start(self, slots: np.ndarray, seeds: list) -> np.ndarray:
        """Reset ``slots[j]`` with ``seeds[j]`` (the other sub-envs untouched): their first observations."""
        slots = np.asarray(slots, dtype=np.int64)
        if self.protocol == "state":
            u, obs = self.vec.unwrapped, []
            for i, s in zip(slots, seeds):   # each start state = the single env's reset with that seed
                o, _ = self.probe.reset(seed=int(s))
                u.state[:, i] = self.probe.unwrapped.state
                obs.append(self.layout.encode(o))
            u.prev_done[slots], u.steps[slots] = False, 0
            return np.stack(obs)
        full = np.full(self.size, PUBLIC, dtype=np.int64)   # the unmasked sub-envs' entries are not read
        full[slots] = [int(s) for s in seeds]
        if len(slots) == self.size:
            return self._rows(self.vec.reset(seed=full.tolist())[0])[slots]
        mask = np.zeros(self.size, dtype=bool)
        mask[slots] = True
        return self._rows(self.vec.reset(seed=full.tolist(), options={"reset_mask": mask})[0])[slots]

    def step(self, slots: np.ndarray, actions: np.ndarray):
        if self.zero_action is None or self.zero_action.shape[1:] != actions.shape[1:]:
            self.zero_action = np.zeros((self.size,) + actions.shape[1:], dtype=actions.dtype)
        full = self.zero_action.copy()
        full[slots] = actions
        obs, rew, term, trunc, info = self.vec.step(full)
        rows = self._rows(obs)
        term, trunc = np.asarray(term, dtype=bool), np.asarray(trunc, dtype=bool)
        if self.same_step and "final_obs" in info:   # the ended sub-envs already show their next episode's start
            ended = np.flatnonzero(term | trunc)
            if len(ended):
                rows = rows.copy()
                rows[ended] = np.stack([self.layout.encode(info["final_obs"][i]) for i in ended])
        sel = slice(0, len(slots)) if len(slots) and slots[-1] == len(slots) - 1 else slots   # the first k: a view
        return rows[sel], np.asarray(rew, dtype=np.float64)[sel], term[sel], trunc[sel]

    def idle(self, slots: np.ndarray) -> None:
        """Slots left without an episode: stepped with dummy actions from now on (reset first, on the public seed
        0, where the env does not reset itself)."""
        if self.disabled and len(slots):
            self.start(slots, [PUBLIC] * len(slots))

    def close(self):
        self.vec.close()
        if self.protocol == "state":
            self.probe.close()


def resolve_vectorization(factory) -> str:
    """The backend of ``factory.vectorization``: ``auto`` = native if the env has one (and no per-instance
    wrappers), else sync; factories without a gymnasium id (the bandit) use ``none``."""
    mode = getattr(factory, "vectorization", "none")
    if mode not in VECTORIZATION:
        raise ConfigError(f"env.vectorization must be one of {VECTORIZATION}, got '{mode}'")
    if mode == "auto":
        import gymnasium as gym

        native = gym.spec(factory.id).vector_entry_point and getattr(factory, "native_ok", True)
        return "native" if native else "sync"
    return mode


def resolve_num_envs(factory) -> int:
    """Live env instances at most: ``env.num_envs``, or for ``auto`` as many as fit in ``instance_memory()``
    bytes at the size the factory measured for one instance (``instance_bytes``), within [1, MAX_INSTANCES]."""
    n = getattr(factory, "num_envs", "auto")
    if n != "auto":
        return int(n)
    if resolve_vectorization(factory) == "native":   # one vector env: sub-envs are rows of arrays, not instances
        return MAX_INSTANCES
    per = int(getattr(factory, "instance_bytes", 0) or 0)
    return MAX_INSTANCES if per <= 0 else max(1, min(MAX_INSTANCES, instance_memory() // per))


class RolloutEngine:
    """Collects batches of seeded episodes with per-episode uniforms (module docstring), on at most
    ``capacity`` live env instances (``resolve_num_envs``).

    Args:
        factory: an env factory (``make()``, ``horizon``, ``observation_space``; gym factories also
            ``id``, ``kwargs``, ``vectorization``, ``num_envs`` and ``instance_bytes``).
    """

    def __init__(self, factory):
        self.factory = factory
        self.mode = resolve_vectorization(factory)
        self.capacity = resolve_num_envs(factory)
        space = getattr(factory, "observation_space", None)
        self.layout = ObservationLayout(space) if space is not None else _RawLayout()
        # action masks (``dppo.envs.masks``): stored as A more columns after each observation row, which a masked
        # policy (``dppo.policies.masked``) reads
        self.mask_actions = int(factory.action_space.n) if getattr(factory, "mask_source", None) else 0
        self._backends: dict[int, object] = {}

    def backend(self, n: int):
        """The backend for batches of ``n`` episodes: min(n, capacity) instances; the cached backends together
        never hold more than ``capacity`` instances."""
        size = max(1, min(int(n), self.capacity))
        if size not in self._backends:
            if sum(self._backends) + size > self.capacity:
                self.close()
            self._backends[size] = (_PoolBackend(self.factory, size, self.layout) if self.mode in ("sync", "none")
                                    else _VectorBackend(self.factory, size, self.mode, self.layout))
        return self._backends[size]

    def close(self) -> None:
        for b in self._backends.values():
            b.close()
        self._backends.clear()

    @torch.no_grad()
    def run(self, policy, seeds: list[int], uniforms: torch.Tensor | None, *, reward_bound: float | None,
            group_size: int = 1) -> Episodes:
        """One episode per seed; ``uniforms`` (N, horizon) drive the sampling (None: greedy); for a continuous or
        MultiDiscrete policy (N, horizon, d) or (N, horizon) when d = 1 (Gaussian samples by the inverse normal
        CDF, one component each).

        Rewards are clipped to the env's declared ``reward_range`` and to [-reward_bound, reward_bound] as they
        arrive, before anything else sees them. Raises ``DataError`` on NaN/inf observations or rewards, or if
        the env raises mid-episode. Buffers grow with the steps taken, never with N x horizon.
        """
        n, horizon = len(seeds), int(self.factory.horizon)
        kind = "continuous" if getattr(policy, "continuous", False) else (
            "multi" if getattr(policy, "multi_discrete", False) else "discrete")
        rec = _StepRecord(n)
        if self.mask_actions and kind != "discrete":
            raise ConfigError("action masks apply to a Discrete-action policy; set env.action_mask=none")
        try:
            self._run_slots(self.backend(n), policy, seeds, uniforms, kind, horizon, rec)
        except (DataError, ConfigError):
            raise
        except Exception as err:  # noqa: BLE001 - any env failure aborts the round without releasing it
            self.close()
            raise DataError(f"the environment raised {type(err).__name__} mid-episode ({err}); "
                            f"the round is not released") from None
        width = None if self.layout.raw_dim is None else self.layout.raw_dim + self.mask_actions
        return rec.episodes(width, getattr(self.factory, "reward_range", None), reward_bound, group_size)

    def _act(self, policy, kind, rows: np.ndarray, u: torch.Tensor | None):
        """(stored actions, env actions) for observation rows, from their uniforms (None: greedy)."""
        n = rows.shape[0]
        obs_t = pad_rows(torch.from_numpy(rows))  # batch-invariant rows (MIN_ROWS)
        if kind == "discrete":
            a = inverse_cdf_actions(policy.logits(obs_t)[:n], u).numpy()
            return a, a
        u_pad = None if u is None else pad_rows(u.reshape(n, -1))
        samples = policy.sample_from_uniforms(obs_t, u_pad)[:n]
        if kind == "continuous":  # the stored action is the Gaussian sample, the env gets it squashed/clipped
            return samples.numpy(), policy.env_action(samples).numpy().astype(np.float32)
        return samples.numpy(), policy.env_action(samples).numpy()

    @staticmethod
    def _check_obs(rows: np.ndarray) -> None:
        if not np.isfinite(rows).all():
            raise DataError("the environment returned a NaN/inf observation; this round's data is discarded")

    def _run_slots(self, backend, policy, seeds, uniforms, kind, horizon, rec) -> None:
        """Slots take episodes in order and the next one as soon as theirs ends (every episode from its own seed
        and uniforms, whichever slot and step it starts at)."""
        n, size = len(seeds), backend.size
        episode = np.full(size, -1, dtype=np.int64)   # the slot's episode (-1: idle)
        t = np.zeros(size, dtype=np.int64)
        d, A = self.layout.raw_dim, self.mask_actions
        cur = np.zeros((size, d + A), dtype=np.float32)    # observation rows, then the action mask's A columns
        obs_cols = cur[:, :d] if A else cur
        first = np.arange(min(size, n))
        episode[first] = first
        obs_cols[first] = backend.start(first, seeds[:len(first)])
        if A:
            cur[first, d:] = backend.masks(first)
        nxt_ep = len(first)
        if len(first) < size:
            backend.idle(np.arange(len(first), size))
        while True:
            slots = np.flatnonzero(episode >= 0)
            if len(slots) == 0:
                return
            eps, ts = episode[slots], t[slots]
            rows = cur[slots]
            self._check_obs(rows)
            u = None if uniforms is None else uniforms[torch.from_numpy(eps), torch.from_numpy(ts)]
            stored, env_actions = self._act(policy, kind, rows, u)
            obs, rew, term, trunc = backend.step(slots, env_actions)
            t[slots] += 1
            done = term | trunc | (t[slots] >= horizon)
            rec.add(eps, ts, rows, stored, rew)
            obs_cols[slots] = obs
            if A:
                cur[slots, d:] = backend.masks(slots)
            ended = np.flatnonzero(done)
            if len(ended) == 0:
                continue
            for j in ended:
                rec.finish(eps[j], int(t[slots[j]]), cur[slots[j]], bool(term[j]))
            freed = slots[ended]
            k = min(len(freed), n - nxt_ep)
            refill, left = freed[:k], freed[k:]
            if k:
                episode[refill], t[refill] = np.arange(nxt_ep, nxt_ep + k), 0
                obs_cols[refill] = backend.start(refill, seeds[nxt_ep:nxt_ep + k])
                if A:
                    cur[refill, d:] = backend.masks(refill)
                nxt_ep += k
            if len(left):
                episode[left] = -1
                backend.idle(left)


class _RawLayout:
    """The layout of a factory without an observation space: observations stored flattened as they are."""

    is_box = True
    raw_dim = None

    @staticmethod
    def encode(obs) -> np.ndarray:
        return np.asarray(obs, dtype=np.float32).reshape(-1)


class _StepRecord:
    """The steps of a batch as they are taken, in blocks (one per policy call), packed into padded episodes at
    the end: memory grows with the steps taken, not with episodes x horizon."""

    def __init__(self, n: int):
        self.n = n
        self.blocks: list[tuple] = []
        self.lengths = np.zeros(n, dtype=np.int64)
        self.terminated = np.zeros(n, dtype=bool)
        self.final: list = [None] * n

    def add(self, eps, ts, obs, actions, rewards, fresh: bool = True) -> None:
        """One block of steps; ``fresh``: the arrays are the caller's new ones (kept as they are, not copied)."""
        keep = (lambda x: x) if fresh else np.array
        self.blocks.append((eps, ts, keep(obs), keep(actions), np.asarray(rewards, dtype=np.float64)))

    def finish(self, ep: int, length: int, final_obs: np.ndarray, terminated: bool) -> None:
        self.lengths[ep], self.final[ep], self.terminated[ep] = length, final_obs.copy(), terminated

    def episodes(self, raw_dim, reward_range, reward_bound, group_size: int) -> Episodes:
        n = self.n
        T = max(1, int(self.lengths.max())) if n else 1
        eps = np.concatenate([b[0] for b in self.blocks]) if self.blocks else np.zeros(0, dtype=np.int64)
        ts = np.concatenate([b[1] for b in self.blocks]) if self.blocks else np.zeros(0, dtype=np.int64)
        d = raw_dim if raw_dim is not None else (self.blocks[0][2].shape[1] if self.blocks else 1)
        obs = np.zeros((n, T, d), dtype=np.float32)
        rewards = np.zeros((n, T), dtype=np.float64)
        a0 = self.blocks[0][3] if self.blocks else np.zeros(0, dtype=np.int64)
        actions = np.zeros((n, T) + a0.shape[1:], dtype=a0.dtype)
        if self.blocks:
            obs[eps, ts] = np.concatenate([b[2] for b in self.blocks])
            actions[eps, ts] = np.concatenate([b[3] for b in self.blocks])
            rewards[eps, ts] = np.concatenate([b[4] for b in self.blocks])
        self.blocks = []
        mask = np.arange(T)[None, :] < self.lengths[:, None]
        raw = np.where(mask, rewards, 0.0)
        clipped_r, _ = clip_rewards(raw, reward_bound, reward_range)
        clipped = torch.from_numpy((clipped_r != raw).sum(1))
        r = torch.from_numpy(np.where(mask, clipped_r, 0.0))
        final = np.stack(self.final) if n else np.zeros((0, d), dtype=np.float32)
        return Episodes(torch.from_numpy(obs), torch.from_numpy(actions), r, torch.from_numpy(mask), r.sum(1),
                        clipped, int(group_size), torch.from_numpy(self.terminated), torch.from_numpy(final))


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{k>=t} gamma^(k-t) r_k per episode (row), zero on padding."""
    out = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running * mask[:, t]
        out[:, t] = running * mask[:, t]
    return out


class EpisodeCollector:
    """What a policy-optimization learner asks of an env of episodes (gymnasium envs, the bandit).

    A round's users: user u runs G rollouts (``group_size``) of the current policy, all from u's own start
    state (``streams.user_reset_seeds``, or the env's own ``reset_seeds``: bandit user u = context u), with
    actions drawn from u's own stream (``streams.user_generator(run seed, u, round)``), so a user's episodes
    depend on that user alone. Public rollouts (evaluation, the states of a public Fisher matrix) start from
    public seeds, disjoint from every user's by construction, with public sampling streams.

    Options a learner may set (both change only how a user's own episodes are drawn, from its own data):
    ``user_horizon`` cuts the users' episodes after that many steps (the cut episodes are truncated, not
    terminated: ``Episodes.terminated`` is False and ``final_obs`` holds the state to bootstrap from; public
    rollouts and evaluation keep the env's horizon); ``action_noise_corr`` = rho draws a user's sampling
    uniforms as Phi(z_t) with z an AR(1) process along each rollout, z_0 = e_0, z_t = rho z_{t-1} +
    sqrt(1 - rho^2) e_t, e iid N(0, 1) from the user's own stream, so every u_t is still exactly U(0, 1) (each
    action marginally pi(.|s_t)) while successive actions are correlated (0: iid uniforms).

    ``public_env_steps`` counts the env steps of every public rollout run so far (the public rollouts of
    ``users(..., public=k)``, ``public``, ``evaluate``): public, reported in ``summary.json``.

    Args:
        env: an env factory (``make()``, ``horizon``, ``observation_space``, ``action_space``).
        seed: the run seed.
        user_horizon: cut users' episodes at this many steps (None: the env's horizon).
        action_noise_corr: rho in [0, 1) of the users' AR(1) sampling uniforms.
    """

    def __init__(self, env, seed: int, *, user_horizon: int | None = None, action_noise_corr: float = 0.0):
        self.env, self.seed = env, int(seed)
        self.engine = RolloutEngine(env)
        self.public_env_steps = 0
        if not 0.0 <= float(action_noise_corr) < 1.0:
            raise ConfigError(f"action_noise_corr must lie in [0, 1), got {action_noise_corr}")
        self.action_noise_corr, self._ar1 = float(action_noise_corr), None
        self.user_engine, self.user_horizon = self.engine, int(env.horizon)
        if user_horizon is not None and int(user_horizon) < int(env.horizon):
            if int(user_horizon) < 1:
                raise ConfigError(f"user_horizon must be >= 1, got {user_horizon}")
            cut = copy.copy(env)
            cut.horizon = int(user_horizon)
            self.user_engine, self.user_horizon = RolloutEngine(cut), int(user_horizon)

    def check(self, policy, rounds: int, sampler) -> None:
        """Nothing to check before round 0 (the sampler checks the population)."""

    def user_reset_seeds(self, users, group_size: int) -> list[int]:
        """Reset seeds of the users' groups, user-major (the env's own mapping if it has one)."""
        if hasattr(self.env, "reset_seeds"):
            return [s for s in self.env.reset_seeds(self.seed, users) for _ in range(group_size)]
        return [s for s in streams.user_seeds(self.seed, users) for _ in range(group_size)]

    def public_seeds(self, stream: str, round_idx: int, n: int) -> list[int]:
        seeds = streams.public_reset_seeds(self.seed, stream, round_idx, n)
        return [self.env.public_seed(s) for s in seeds] if hasattr(self.env, "public_seed") else seeds

    @staticmethod
    def uniform_shape(policy) -> tuple:
        """Uniforms per step beyond one: (d,) for a continuous policy with d > 1 action dimensions, or a
        MultiDiscrete one with d > 1 components."""
        multi = getattr(policy, "continuous", False) or getattr(policy, "multi_discrete", False)
        d = int(getattr(policy, "action_dim", 1)) if multi else 1
        return (d,) if d > 1 else ()

    def users(self, policy, users, round_idx: int, group_size: int, reward_bound: float | None,
              public: int = 0) -> tuple[Episodes, Episodes | None]:
        """The users' groups (G rollouts each) and ``public`` public rollouts (stream ``fisher``) of this round.

        The public rollouts ride in the same vectorized batch (every row depends only on its own seed and
        uniforms, so packing them together changes nothing), unless the users' episodes are cut
        (``user_horizon``): then they run on their own at the env's horizon.
        """
        H, k, G = self.user_horizon, int(public), int(group_size)
        extra = self.uniform_shape(policy)
        uniforms = [self.user_uniforms(gen, (G, H) + extra)
                    for gen in streams.user_generators(self.seed, users, round_idx)]
        seeds = self.user_reset_seeds(users, G)
        n = len(users) * G
        if k and self.user_engine is not self.engine:
            batch = self.user_engine.run(policy, seeds, torch.cat(uniforms), reward_bound=reward_bound)
            public_batch = self.public(policy, "fisher", round_idx, k, reward_bound=reward_bound)
            return batch.take(0, n, G), public_batch
        if k:
            uniforms.append(torch.rand((k, H) + extra, generator=streams.public_generator(self.seed, "fisher",
                                                                                          round_idx),
                                       dtype=torch.float64))
            seeds = seeds + self.public_seeds("fisher", round_idx, k)
        both = self.user_engine.run(policy, seeds, torch.cat(uniforms), reward_bound=reward_bound)
        public_batch = both.take(n, n + k) if k else None
        if k:
            self.public_env_steps += public_batch.env_steps
        return both.take(0, n, G), public_batch

    def user_uniforms(self, generator: torch.Generator, shape: tuple) -> torch.Tensor:
        """One user's sampling uniforms (G, horizon, ...) from its own generator: iid U(0, 1), or Phi of the
        AR(1) process along the horizon (``action_noise_corr``, class docstring)."""
        rho = self.action_noise_corr
        if rho == 0.0:
            return torch.rand(shape, generator=generator, dtype=torch.float64)
        e = torch.randn(shape, generator=generator, dtype=torch.float64)
        H = shape[1]
        if self._ar1 is None or self._ar1.shape[0] != H:
            t = torch.arange(H, dtype=torch.float64)
            lag = (t[:, None] - t[None, :]).clamp_min(0)
            L = torch.where(t[:, None] >= t[None, :], rho ** lag, 0.0) * math.sqrt(1 - rho * rho)
            L[:, 0] = rho ** t     # z_t = rho^t e_0 + sqrt(1 - rho^2) sum_{1<=k<=t} rho^(t-k) e_k
            self._ar1 = L
        z = torch.einsum("tk,gk...->gt...", self._ar1, e)
        return torch.special.ndtr(z).clamp(1e-12, 1 - 1e-12)

    def public(self, policy, stream: str, round_idx: int, n: int, greedy: bool = False, *,
               reward_bound: float | None = None) -> Episodes:
        """``n`` rollouts of the current (released) policy from public seeds, public sampling stream (counted in
        ``public_env_steps``)."""
        gen = streams.public_generator(self.seed, stream, round_idx)
        uniforms = None if greedy else torch.rand((n, int(self.env.horizon)) + self.uniform_shape(policy),
                                                  generator=gen, dtype=torch.float64)
        episodes = self.engine.run(policy, self.public_seeds(stream, round_idx, n), uniforms,
                                   reward_bound=reward_bound)
        self.public_env_steps += episodes.env_steps
        return episodes

    def evaluate(self, policy, episodes: int, greedy: bool = False, stream: str = "eval") -> float:
        """Mean return over ``episodes`` held-out episodes (public seeds, never a user's) of public ``stream``:
        ``eval`` (what a run reports) or ``select`` (what ``eval.select=best`` chooses on: other public seeds)."""
        return float(self.evaluate_episodes(policy, episodes, greedy, stream)[0].mean())

    def evaluate_episodes(self, policy, episodes: int, greedy: bool = False, stream: str = "eval"):
        """``(returns, lengths)`` of the ``episodes`` held-out episodes ``evaluate`` averages."""
        played = self.public(policy, stream, 0, episodes, greedy=greedy)
        return played.returns, played.lengths

    def log_examples(self, policy, logger, round_idx: int) -> None:
        """Nothing beyond the metrics for episodes."""

    def summary(self, policy) -> dict:
        return {}
