"""A native vectorized ICU-Sepsis (``pip install -e ".[icu]"``): the package's own MDP on arrays of patients,
with one copy of its tables for all of them.

The package's ``ICUSepsisEnv`` loads its 716 x 25 x 716 transition and reward tables (about 200 MB) in every
instance and draws each transition with ``np_random.choice(716, p=P[s, a])``. ``ICUSepsisVectorEnv`` holds the
tables once and steps n patients together, with the same transition law, the same rewards, terminal states and
inadmissible-action strategies, but not the package generator's draws:

* the cumulative rows are computed once per tables object (``compile_tables``, cached per P array, which is
  not to be changed in place afterwards): each row P[s, a] as its support (the next states of positive probability, padded to the largest
  support, K = 213 on the package's tables) and their cumulative probabilities, normalised so the last is
  exactly 1.0; a draw is the first support entry whose cumulative value exceeds a uniform u in [0, 1)
  (inverse CDF), found for all patients at once by a branchless binary search over K. The start state is
  drawn the same way from d0.
* the uniforms come from a counter-based generator: sub-env i's key is ``splitmix64(seed_i)`` and its k-th
  draw since that seeded reset is ``splitmix64(key + k * 0x9E3779B97F4A7C15)``, whose top 53 bits / 2**53 is
  the uniform (one draw per start state and per transition; the counter runs on across NEXT_STEP autoresets).
  A patient's episodes are thus a function of its own seed (and actions) alone: not of its slot, the other
  patients or the batch size. They are not the episodes the package's env draws with that seed
  (``tests/envs/test_icu_sepsis_vector.py`` checks the law against the tables and the seed-only dependence).

Importing this module after ``icu_sepsis`` registers it as the ``vector_entry_point`` of the ICU-Sepsis ids
that have none (``register``), so ``env.vectorization=auto`` picks it as it picks CartPole's.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import sys
import warnings
import weakref
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

ENTRY_POINT = "dppo.envs.icu_sepsis_vector:ICUSepsisVectorEnv"
IDS = ("Sepsis/ICU-Sepsis-v1", "Sepsis/ICU-Sepsis-v2")
STRATEGIES = ("mean", "terminate")
_TABLES: dict = {}
_COMPILED: dict = {}   # id(P) -> (weakref to P, the compiled tables)

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TWO_M53 = 2.0 ** -53


def package_tables(env=None) -> dict:
    """The package's tables (loaded once per process): P, R [S, A, S], d0 [S], admissible [S, A] bool,
    terminal states and the death state. ``env``: an instance of the package's env already made, whose arrays are
    taken (shared, not copied) on the first call instead of loading another 200 MB instance."""
    if not _TABLES:
        import_package()                                     # without the legacy gym's banner
        from icu_sepsis import ICUSepsisEnv
        from icu_sepsis.utils import constants

        env = env if env is not None and hasattr(env, "_tx_mat") else ICUSepsisEnv()
        admissible = np.zeros(env._tx_mat.shape[:2], dtype=bool)
        for s, acts in enumerate(env._admissible_actions):
            admissible[s, list(acts)] = True
        _TABLES.update(P=env._tx_mat, R=env._r_mat, d0=env._d_0, admissible=admissible,
                       terminal=sorted(constants.STATES_TERMINAL), death=int(constants.STATE_DEATH),
                       default_strategy=constants.inadmissible_action_strategies.DEFAULT_INADMISSIBLE_ACTION_STRATEGY)
    return _TABLES


def splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function on a uint64 array (wrapping arithmetic; ``z`` is left unchanged)."""
    with np.errstate(over="ignore"):
        z = z ^ (z >> _S30)
        z *= _M1
        z ^= z >> _S27
        z *= _M2
        z ^= z >> _S31
    return z


def seed_keys(seeds) -> np.ndarray:
    """The generator key of each seed: ``splitmix64(seed)`` (seeds are integers in [0, 2**64))."""
    out = []
    for s in seeds:
        s = int(s)
        if not 0 <= s < 2 ** 64:
            raise ValueError(f"ICUSepsisVectorEnv: a seed must be an integer in [0, 2**64), got {s}")
        out.append(s)
    return splitmix64(np.array(out, dtype=np.uint64))


def uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Draw ``counters`` of the streams ``keys``: the top 53 bits of splitmix64(key + k * golden) / 2**53."""
    with np.errstate(over="ignore"):
        z = counters * GOLDEN
        z += keys
    return (splitmix64(z) >> _S11).astype(np.float64) * _TWO_M53


def _cumulative_rows(rows: np.ndarray, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Each row's support (column indices of p > 0, in order) and cumulative probabilities, padded to the
    largest support K: cumulative values past a row's support are 2.0 (never <= a uniform), support entries 0.
    Computed ``chunk`` rows at a time (the temporaries stay a few MB)."""
    count = (np.asarray(rows) > 0).sum(1)
    if (count == 0).any():
        raise ValueError("ICUSepsisVectorEnv: every transition row and d0 needs a positive entry")
    n, K = len(count), int(count.max())
    cum = np.empty((n, K))
    sup = np.empty((n, K), dtype=np.int16 if np.shape(rows)[1] <= np.iinfo(np.int16).max else np.int64)
    for lo in range(0, n, chunk):
        block = np.asarray(rows[lo:lo + chunk], dtype=np.float64)
        c = count[lo:lo + chunk]
        order = np.argsort(~(block > 0), axis=1, kind="stable")[:, :K]   # the support first, in column order
        inside = np.arange(K) < c[:, None]
        part = np.cumsum(np.where(inside, np.take_along_axis(block, order, 1), 0.0), axis=1)
        last = np.arange(len(c)), c - 1
        part /= part[last][:, None]
        part[last] = 1.0
        part[~inside] = 2.0
        cum[lo:lo + chunk], sup[lo:lo + chunk] = part, np.where(inside, order, 0)
    return cum, sup


def compile_tables(t: dict) -> dict:
    """The draw tables of ``t``: flat cumulative rows ``cum`` [S * A * K] and supports ``sup`` (row s * A + a
    at offset (s * A + a) * K) and K, cached per P array; d0's support and cumulative values."""
    P = t["P"]
    hit = _COMPILED.get(id(P))
    if hit is not None and hit[0]() is P:
        out = dict(hit[1])
    else:
        S, A = P.shape[:2]
        cum, sup = _cumulative_rows(np.reshape(P, (S * A, S)))
        out = dict(cum=cum.ravel(), sup=sup.ravel(), K=cum.shape[1])
        try:
            ref = weakref.ref(P)
            weakref.finalize(P, _COMPILED.pop, id(P), None)
            _COMPILED[id(P)] = (ref, dict(out))
        except TypeError:   # not weak-referenceable: compiled again next time
            pass
    d0_cum, d0_sup = _cumulative_rows(np.asarray(t["d0"], dtype=np.float64)[None])
    out.update(d0_cum=d0_cum[0], d0_sup=d0_sup[0].astype(np.int64))
    return out


def _halvings(K: int) -> list[int]:
    """The branchless binary search's steps over K entries: half = n // 2, n -= half, while n > 1."""
    steps, n = [], K
    while n > 1:
        steps.append(n // 2)
        n -= n // 2
    return steps


class ICUSepsisVectorEnv(VectorEnv):
    """``num_envs`` ICU-Sepsis patients stepped together (module docstring). Discrete(716) observations and
    Discrete(25) actions (the flattened treatment, as ``Sepsis/ICU-Sepsis-v2``); autoreset: next step.

    ``reset_seeds(seeds)`` (or ``reset(seed=[...])``) starts sub-env i as a fresh episode from ``seeds[i]``;
    ``reset(seed=..., options={"reset_mask": mask})`` restarts only the masked sub-envs (gymnasium's partial
    reset). ``states`` holds each sub-env's state (its observation), ``steps`` its step count in the episode,
    ``prev_done`` whether it ended on the last step (it restarts on the next), ``draws`` its draws since its
    seeded reset.

    Args:
        num_envs: patients stepped together.
        max_episode_steps: the episode limit (500, the package's).
        inadmissible_action_strategy: ``mean`` (the package's default) or ``terminate``.
        tables: P, R, d0, admissible, terminal, death (default: the package's, ``package_tables``).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 500, render_mode: str | None = None,
                 inadmissible_action_strategy: str | None = None, tables: dict | None = None):
        if render_mode is not None:
            raise ValueError("ICUSepsisVectorEnv does not render")
        t = tables if tables is not None else package_tables()
        strategy = inadmissible_action_strategy or t.get("default_strategy", "mean")
        if strategy not in STRATEGIES:
            raise ValueError(f"ICUSepsisVectorEnv: inadmissible_action_strategy must be one of {STRATEGIES}, got "
                             f"{strategy!r} (use env.vectorization=sync for the package's env)")
        self.P, self.R, self.d0 = t["P"], t["R"], np.asarray(t["d0"], dtype=np.float64)
        self.admissible, self.death, self.strategy = np.asarray(t["admissible"], dtype=bool), int(t["death"]), strategy
        S, A = self.P.shape[:2]
        self.S, self.A = S, A
        self.is_terminal = np.zeros(S, dtype=bool)
        self.is_terminal[list(t["terminal"])] = True
        c = compile_tables(t)
        self._cum, self._sup, self._K = c["cum"], c["sup"], c["K"]
        self._d0_cum, self._d0_sup = c["d0_cum"], c["d0_sup"]
        self._steps_K = [np.int64(h) for h in _halvings(self._K)]
        self._R_flat = np.asarray(self.R).reshape(-1) if np.asarray(self.R).flags.c_contiguous else None
        self._admissible_flat = self.admissible.reshape(-1)
        self.num_envs, self.max_episode_steps, self.render_mode = int(num_envs), int(max_episode_steps), None
        self.single_observation_space = spaces.Discrete(S)
        self.single_action_space = spaces.Discrete(A)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.keys = seed_keys(np.random.default_rng().integers(0, 2 ** 63, self.num_envs))
        self.draws = np.zeros(self.num_envs, dtype=np.uint64)   # each sub-env's draws since its seeded reset
        self.states = np.zeros(self.num_envs, dtype=np.int64)
        self.steps = np.zeros(self.num_envs, dtype=np.int64)
        self.prev_done = np.zeros(self.num_envs, dtype=bool)

    def _uniforms(self, envs) -> np.ndarray:
        """The next uniform of each sub-env of ``envs`` (an index array or ``slice(None)``)."""
        k = self.draws[envs]
        u = uniforms(self.keys[envs], k)
        self.draws[envs] = k + np.uint64(1)   # after the draw: with a slice, k is a view of the counters
        return u

    def _next_states(self, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The first support entry of each transition row whose cumulative value exceeds u."""
        cum = self._cum
        base = rows * self._K
        for half in self._steps_K:
            base += half * (cum[base + (half - 1)] <= u)
        base += cum[base] <= u
        return self._sup[base]

    def _start(self, envs) -> None:
        u = self._uniforms(envs)
        self.states[envs] = self._d0_sup[np.searchsorted(self._d0_cum, u, side="right")]
        self.steps[envs] = 0

    def _reset_envs(self, envs: np.ndarray, seeds) -> None:
        self.keys[envs] = seed_keys(seeds)
        self.draws[envs] = 0
        self._start(envs)
        self.prev_done[envs] = False

    def reset_seeds(self, seeds) -> np.ndarray:
        """Sub-env i as a fresh episode from ``seeds[i]`` (missing seeds are 0; the rollout's native backend)."""
        seeds = list(seeds)[:self.num_envs] + [0] * (self.num_envs - len(seeds))
        self._reset_envs(np.arange(self.num_envs), seeds)
        return self.states.copy()

    def reset(self, *, seed: int | list | None = None, options: dict[str, Any] | None = None):
        """``seed``: a list (sub-env i from seed[i]), an int (sub-env i from seed + i) or None (fresh seeds).
        ``options={"reset_mask": bool array (num_envs,)}`` resets only the masked sub-envs (their entries of
        ``seed``) and clears their pending autoreset; the others keep their episodes."""
        mask = (options or {}).get("reset_mask")
        if isinstance(seed, (list, tuple, np.ndarray)):
            seeds = list(seed)[:self.num_envs] + [0] * (self.num_envs - len(seed))
        else:
            super().reset(seed=seed)
            base = int(self.np_random.integers(2 ** 31)) if seed is None else int(seed)
            seeds = [base + i for i in range(self.num_envs)]
        if mask is None:
            return self.reset_seeds(seeds), {}
        mask = np.asarray(mask)
        if mask.dtype != bool or mask.shape != (self.num_envs,):
            raise ValueError(f"ICUSepsisVectorEnv: reset_mask must be a bool array of shape ({self.num_envs},), "
                             f"got {mask.dtype} {mask.shape}")
        envs = np.flatnonzero(mask)
        if len(envs):
            self._reset_envs(envs, [seeds[i] for i in envs])
        return self.states.copy(), {}

    def action_masks(self) -> np.ndarray:
        """(num_envs, A) bool: each sub-env's admissible actions in its current state (the package's
        ``info["admissible_actions"]``; every action in a terminal state), sb3-contrib's vector convention."""
        return self.admissible[self.states]

    def step(self, actions):
        n, A = self.num_envs, self.A
        a = np.asarray(actions).reshape(n)
        if a.dtype.kind not in "iu":
            a = a.astype(np.int64)
        if n and (a.min() < 0 or a.max() >= A):
            raise ValueError(f"ICUSepsisVectorEnv: actions must lie in [0, {A}), got {a.min()}..{a.max()}")
        reward = np.zeros(n)
        terminated = np.zeros(n, dtype=bool)
        live_mask = ~self.prev_done & ~self.is_terminal[self.states]
        live = slice(None) if live_mask.all() else np.flatnonzero(live_mask)
        if not isinstance(live, np.ndarray) or len(live):
            rows = self.states[live] * A + a[live]
            nxt = self._next_states(rows, self._uniforms(live))
            if self.strategy == "terminate":
                nxt = np.where(self._admissible_flat[rows], nxt, self.death)
            if self._R_flat is not None:   # R[s, a, next state] at (s * A + a) * S + next state
                reward[live] = self._R_flat[rows * self.S + nxt]
            else:
                reward[live] = self.R[rows // A, rows % A, nxt]
            self.states[live] = nxt
            self.steps[live] += 1
            terminated[live] = self.is_terminal[nxt]
        truncated = (self.steps >= self.max_episode_steps) & ~terminated
        if self.prev_done.any():   # sub-envs that ended on the last step start a new episode instead
            done = np.flatnonzero(self.prev_done)
            self._start(done)
            reward[done], terminated[done], truncated[done] = 0.0, False, False
        self.prev_done = terminated | truncated
        return self.states.copy(), reward, terminated, truncated, {}


def import_package(name: str = "icu_sepsis"):
    """``importlib.import_module(name)`` for the icu_sepsis package (or one of its modules), without the banner the
    legacy ``gym`` it imports prints on stderr ("Gym has been unmaintained since 2022 ...") nor ``gym``'s warnings:
    dppo runs the package's gymnasium env, never ``gym``. Anything else written to stderr during the import is
    passed on; once ``gym`` is imported this is a plain import."""
    if "gym" in sys.modules:
        return importlib.import_module(name)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"gym(\..*)?$")
            return importlib.import_module(name)
    finally:
        rest = captured.getvalue()
        try:
            from gym_notices.notices import notices
        except Exception:  # noqa: BLE001 - no notices package: nothing known to drop
            notices = {}
        for notice in sorted(set(notices.values()), key=len, reverse=True):
            rest = rest.replace(notice + "\n", "")
        if rest:
            sys.stderr.write(rest)


def register() -> None:
    """Make this the vector entry point of the registered ICU-Sepsis ids that have none (no-op otherwise)."""
    for env_id in IDS:
        spec = gym.registry.get(env_id)
        if spec is not None and spec.vector_entry_point is None:
            spec.vector_entry_point = ENTRY_POINT
