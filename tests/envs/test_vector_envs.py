"""Any gymnasium ``VectorEnv`` runs at its own speed: slots take the next user's episode as soon as theirs ends,
each sub-env reset alone with its own seed (gymnasium's partial reset, ``reset_mask``, or a native env's state
columns), so every episode equals the single env's episode from the same seed, whichever backend, capacity or
autoreset mode runs it; a vector env that cannot reset one sub-env is refused in one line."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from dppo.envs.gym_env import GymEnvFactory
from dppo.envs.rollout import RolloutEngine
from dppo.errors import ConfigError
from dppo.policies.auto import auto_policy

FIELDS = ("obs", "actions", "rewards", "mask", "terminated", "final_obs")


class Corridor(gym.Env):
    """Walk along n cells (Discrete observations) from a random start; reward 1 at the right end."""

    def __init__(self, n: int = 6):
        self.n = n
        self.observation_space = gym.spaces.Discrete(n)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(0, 3))
        return self.pos, {}

    def step(self, action):
        slip = self.np_random.random() < 0.2
        move = (1 if int(action) == 1 else -1) * (-1 if slip else 1)
        self.pos = max(0, min(self.n - 1, self.pos + move))
        done = self.pos == self.n - 1
        return self.pos, (1.0 if done else 0.0), done, False, {}


class CorridorVec(VectorEnv):
    """A user's numpy vector Corridor: per-sub-env generators seeded as the single env's, any autoreset mode;
    ``honour_mask=False``: a broken partial reset that resets every sub-env."""

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 30, n: int = 6,
                 autoreset: AutoresetMode = AutoresetMode.NEXT_STEP, honour_mask: bool = True):
        self.metadata = {"autoreset_mode": autoreset}
        self.num_envs, self.n, self.limit, self.honour_mask = num_envs, n, max_episode_steps, honour_mask
        self.single_observation_space, self.single_action_space = gym.spaces.Discrete(n), gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.rngs = [seeding.np_random(i)[0] for i in range(num_envs)]
        self.pos = np.zeros(num_envs, dtype=np.int64)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.prev_done = np.zeros(num_envs, dtype=bool)

    def _start(self, i):
        self.pos[i], self.steps[i], self.prev_done[i] = int(self.rngs[i].integers(0, 3)), 0, False

    def reset(self, *, seed=None, options=None):
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + i for i in range(self.num_envs)]
        mask = (options or {}).get("reset_mask")
        which = np.arange(self.num_envs) if mask is None or not self.honour_mask else np.flatnonzero(mask)
        for i in which:
            self.rngs[i] = seeding.np_random(seeds[i])[0]
            self._start(i)
        return self.pos.copy(), {}

    def step(self, actions):
        reward = np.zeros(self.num_envs)
        term = np.zeros(self.num_envs, dtype=bool)
        trunc = np.zeros(self.num_envs, dtype=bool)
        info = {}
        mode = self.metadata["autoreset_mode"]
        for i, a in enumerate(np.asarray(actions)):
            if self.prev_done[i] and mode == AutoresetMode.NEXT_STEP:
                self._start(i)
                continue
            slip = self.rngs[i].random() < 0.2
            move = (1 if int(a) == 1 else -1) * (-1 if slip else 1)
            self.pos[i] = max(0, min(self.n - 1, self.pos[i] + move))
            self.steps[i] += 1
            term[i] = self.pos[i] == self.n - 1
            reward[i] = 1.0 if term[i] else 0.0
            trunc[i] = self.steps[i] >= self.limit and not term[i]
        done = term | trunc
        if mode == AutoresetMode.SAME_STEP and done.any():
            info["final_obs"] = self.pos.copy()
            info["_final_obs"] = done.copy()
            for i in np.flatnonzero(done):
                self._start(i)
        self.prev_done = done if mode == AutoresetMode.NEXT_STEP else np.zeros(self.num_envs, dtype=bool)
        return self.pos.copy(), reward, term, trunc, info


def register(env_id, **vec_kwargs):
    gym.register(env_id, entry_point=Corridor, max_episode_steps=30,
                 vector_entry_point=lambda num_envs=1, **kw: CorridorVec(num_envs, **{**kw, **vec_kwargs}))


@pytest.fixture(scope="module", autouse=True)
def corridors():
    ids = {"CorridorVec-v0": {}, "CorridorSameStep-v0": {"autoreset": AutoresetMode.SAME_STEP},
           "CorridorDisabled-v0": {"autoreset": AutoresetMode.DISABLED},
           "CorridorBrokenReset-v0": {"honour_mask": False}}
    for env_id, kw in ids.items():
        register(env_id, **kw)
    yield
    for env_id in ids:
        gym.registry.pop(env_id, None)


def run(env_id, mode, cap, policy, seeds, u):
    factory = GymEnvFactory(env_id, vectorization=mode, horizon=30, num_envs=cap)
    return RolloutEngine(factory).run(policy, seeds, u, reward_bound=None)


@pytest.mark.parametrize("env_id", ["CorridorVec-v0", "CorridorSameStep-v0", "CorridorDisabled-v0"])
def test_a_users_vector_env_gives_every_episode_of_the_single_env_at_any_capacity(env_id):
    torch.manual_seed(0)
    policy = auto_policy(gym.spaces.Discrete(6), gym.spaces.Discrete(2), hidden_sizes=[8])
    seeds = list(range(300, 340))
    u = torch.rand(len(seeds), 30, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    single = run(env_id, "sync", 64, policy, seeds, u)
    assert int(single.lengths.min()) < int(single.lengths.max())   # lengths spread: slots are refilled
    for cap in (1, 7, 64):
        got = run(env_id, "native", cap, policy, seeds, u)
        for field in FIELDS:
            assert torch.equal(getattr(got, field), getattr(single, field)), (cap, field)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_native_cartpole_and_acrobot_refill_slots_without_changing_an_episode(env_id):
    """Every episode on 3 slots (refilled as episodes end) equals the same episode on 12 (no refill): the same
    arithmetic on the same rows, so bit for bit on any CPU. (The native envs against the single ones, whose
    scalar and vectorized sin / cos may round apart on some CPUs: tests/envs/test_acrobot_vector.py, test_core.)"""
    probe = GymEnvFactory(env_id)
    policy = auto_policy(probe.observation_space, probe.action_space, hidden_sizes=[8])
    seeds = list(range(12))
    u = torch.rand(12, 500, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    run_on = lambda mode, cap: RolloutEngine(GymEnvFactory(env_id, vectorization=mode, num_envs=cap)).run(
        policy, seeds, u, reward_bound=None)
    full, refilled = run_on("native", 12), run_on("native", 3)
    for field in FIELDS:
        assert torch.equal(getattr(refilled, field), getattr(full, field)), (env_id, field)


def test_a_vector_env_that_resets_every_sub_env_is_refused_in_one_line():
    factory = GymEnvFactory("CorridorBrokenReset-v0", vectorization="native", horizon=30, num_envs=4)
    with pytest.raises(ConfigError) as err:
        RolloutEngine(factory).backend(4)
    assert "reset_mask" in str(err.value) and "\n" not in str(err.value)


def test_a_batch_steps_the_vector_env_about_as_often_as_its_episodes_need():
    """Refilled slots: a batch costs about (total steps / slots) + the longest episode of vector steps, fewer
    than running it in lockstep waves of the slots, each to its longest episode."""
    class Counting(CorridorVec):
        calls = 0

        def step(self, actions):
            Counting.calls += 1
            return super().step(actions)

    gym.register("CorridorCounting-v0", entry_point=Corridor, max_episode_steps=30,
                 vector_entry_point=lambda num_envs=1, **kw: Counting(num_envs, **kw))
    try:
        policy = auto_policy(gym.spaces.Discrete(6), gym.spaces.Discrete(2), hidden_sizes=[8])
        seeds = list(range(200))
        u = torch.rand(200, 30, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        batch = run("CorridorCounting-v0", "native", 10, policy, seeds, u)
        steps = int(batch.lengths.sum())
        assert Counting.calls <= steps / 10 + 2 * int(batch.lengths.max())
        waves = sum(int(batch.lengths[lo:lo + 10].max()) for lo in range(0, 200, 10))   # lockstep waves of 10
        assert Counting.calls < waves, (Counting.calls, waves)
    finally:
        gym.registry.pop("CorridorCounting-v0", None)


def test_a_batched_observation_encodes_as_each_observation_does():
    """``encode_batch`` (one call per step, gymnasium's batched layout) equals ``encode`` row by row, nested spaces
    and discrete starts included."""
    from gymnasium.vector.utils import concatenate, create_empty_array

    from dppo.policies.observations import ObservationLayout

    space = gym.spaces.Dict({"a": gym.spaces.Discrete(3, start=1),
                             "b": gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,)), gym.spaces.MultiDiscrete([2, 3]))),
                             "c": gym.spaces.MultiBinary(3)})
    layout = ObservationLayout(space)
    space.seed(0)
    items = [space.sample() for _ in range(7)]
    batch = concatenate(space, items, create_empty_array(space, 7))
    assert np.array_equal(layout.encode_batch(batch, 7), np.stack([layout.encode(o) for o in items]))
