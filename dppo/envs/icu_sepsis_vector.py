"""A native vectorized ICU-Sepsis (``pip install -e ".[icu]"``): the package's own MDP on arrays of patients,
with one copy of its tables for all of them.

The package's ``ICUSepsisEnv`` loads its 716 x 25 x 716 transition and reward tables (about 200 MB) in every
instance and draws each transition with ``np_random.choice(716, p=P[s, a])``. ``ICUSepsisVectorEnv`` holds the
tables once and steps n patients together, each with its own generator seeded exactly as gymnasium seeds a
single env's ``reset(seed=...)`` (``gymnasium.utils.seeding.np_random``), drawing the same single uniform per
transition that ``Generator.choice`` draws and inverting the same CDF (``cumsum`` of the row over its last
entry, ``searchsorted(side="right")``): every patient's episode is bit-identical to the package's env reset
with that patient's seed (``tests/envs/test_icu_sepsis_vector.py`` checks it against numpy's ``choice`` and,
where the package is installed, against the env itself).

Importing this module after ``icu_sepsis`` registers it as the ``vector_entry_point`` of the ICU-Sepsis ids
that have none (``register``), so ``env.vectorization=auto`` picks it as it picks CartPole's.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

ENTRY_POINT = "dppo.envs.icu_sepsis_vector:ICUSepsisVectorEnv"
IDS = ("Sepsis/ICU-Sepsis-v1", "Sepsis/ICU-Sepsis-v2")
STRATEGIES = ("mean", "terminate")
_TABLES: dict = {}


def package_tables() -> dict:
    """The package's tables (loaded once per process): P, R [S, A, S], d0 [S], admissible [S, A] bool,
    terminal states and the death state."""
    if not _TABLES:
        from icu_sepsis import ICUSepsisEnv
        from icu_sepsis.utils import constants

        env = ICUSepsisEnv()
        admissible = np.zeros(env._tx_mat.shape[:2], dtype=bool)
        for s, acts in enumerate(env._admissible_actions):
            admissible[s, list(acts)] = True
        _TABLES.update(P=env._tx_mat, R=env._r_mat, d0=env._d_0, admissible=admissible,
                       terminal=sorted(constants.STATES_TERMINAL), death=int(constants.STATE_DEATH),
                       default_strategy=constants.inadmissible_action_strategies.DEFAULT_INADMISSIBLE_ACTION_STRATEGY)
    return _TABLES


class ICUSepsisVectorEnv(VectorEnv):
    """``num_envs`` ICU-Sepsis patients stepped together (module docstring). Discrete(716) observations and
    Discrete(25) actions (the flattened treatment, as ``Sepsis/ICU-Sepsis-v2``); autoreset: next step.

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
        self.admissible, self.death, self.strategy = t["admissible"], int(t["death"]), strategy
        S, A = self.P.shape[:2]
        self.is_terminal = np.zeros(S, dtype=bool)
        self.is_terminal[list(t["terminal"])] = True
        self.num_envs, self.max_episode_steps, self.render_mode = int(num_envs), int(max_episode_steps), None
        self.single_observation_space = spaces.Discrete(S)
        self.single_action_space = spaces.Discrete(A)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.rngs = [seeding.np_random(None)[0] for _ in range(self.num_envs)]
        self.state = np.zeros(self.num_envs, dtype=np.int64)
        self.steps = np.zeros(self.num_envs, dtype=np.int64)
        self.prev_done = np.zeros(self.num_envs, dtype=bool)

    def _draw(self, rows: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """``Generator.choice(S, p=row)`` for each (row, env): cdf = cumsum / last, one uniform, side=right."""
        cdf = np.cumsum(rows, axis=-1)
        cdf /= cdf[:, -1:]
        u = np.array([self.rngs[i].random() for i in envs])
        return (cdf <= u[:, None]).sum(1)

    def _start(self, envs: np.ndarray) -> None:
        self.state[envs] = self._draw(np.broadcast_to(self.d0, (len(envs), self.d0.shape[0])), envs)
        self.steps[envs] = 0

    def reset_seeds(self, seeds) -> np.ndarray:
        """Sub-env i as the single env after ``reset(seed=seeds[i])`` (the rollout's native backend)."""
        seeds = list(seeds) + [0] * (self.num_envs - len(seeds))
        self.rngs = [seeding.np_random(int(s))[0] for s in seeds]
        self._start(np.arange(self.num_envs))
        self.prev_done[:] = False
        return self.state.copy()

    def reset(self, *, seed: int | list | None = None, options: dict[str, Any] | None = None):
        if isinstance(seed, (list, tuple, np.ndarray)):
            return self.reset_seeds(seed), {}
        super().reset(seed=seed)
        base = int(self.np_random.integers(2 ** 31)) if seed is None else int(seed)
        return self.reset_seeds([base + i for i in range(self.num_envs)]), {}

    def step(self, actions):
        a = np.asarray(actions, dtype=np.int64).reshape(self.num_envs)
        reward = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        live = np.flatnonzero(~self.prev_done & ~self.is_terminal[self.state])
        if len(live):
            s, act = self.state[live], a[live]
            nxt = self._draw(self.P[s, act], live)
            if self.strategy == "terminate":
                nxt = np.where(self.admissible[s, act], nxt, self.death)
            reward[live] = self.R[s, act, nxt]
            self.state[live] = nxt
            self.steps[live] += 1
            terminated[live] = self.is_terminal[nxt]
        truncated = (self.steps >= self.max_episode_steps) & ~terminated
        if self.prev_done.any():   # sub-envs that ended on the last step start a new episode instead
            done = np.flatnonzero(self.prev_done)
            self._start(done)
            reward[done], terminated[done], truncated[done] = 0.0, False, False
        self.prev_done = terminated | truncated
        return self.state.copy(), reward, terminated, truncated, {}


def register() -> None:
    """Make this the vector entry point of the registered ICU-Sepsis ids that have none (no-op otherwise)."""
    for env_id in IDS:
        spec = gym.registry.get(env_id)
        if spec is not None and spec.vector_entry_point is None:
            spec.vector_entry_point = ENTRY_POINT
