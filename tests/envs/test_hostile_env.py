"""Environments that misbehave: rewards out of range, NaN/inf, exceptions mid-episode."""
import gymnasium as gym
import numpy as np
import pytest

import dppo
from dppo.errors import DataError
from dppo.training.checkpoint import load_latest_checkpoint


class Hostile(gym.Env):
    """CartPole-shaped env whose rewards/observations go bad from a given global step on."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)
    calls = 0

    def __init__(self, mode="big", after=10**9):
        self.mode, self.after, self.t = mode, after, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.normal(size=4).astype(np.float32), {}

    def step(self, action):
        Hostile.calls += 1
        self.t += 1
        obs = self.np_random.normal(size=4).astype(np.float32)
        reward = 1000.0 if self.mode == "big" else 1.0
        if Hostile.calls > self.after:
            if self.mode == "nan_reward":
                reward = float("nan")
            elif self.mode == "inf_obs":
                obs[0] = np.inf
            elif self.mode == "raise":
                raise RuntimeError("sensor failure")
        return obs, reward, False, self.t >= 20, {}


gym.register("DppoTest/Hostile-v0", entry_point=Hostile)


def _run(tmp_path, mode, after=10**9):
    Hostile.calls = 0
    return dppo.train(["algo=dp_pg", "env.id=DppoTest/Hostile-v0", f"+env.kwargs.mode={mode}",
                       f"+env.kwargs.after={after}", "rounds=4", "users_per_round=3", "group_size=2", "checkpoint_every=1",
                       "reward_bound=1",   # the env declares no range: a private run must be given one
                       "eval_episodes=1", "eval_every=null",   # the step count is of the training rollouts only
                       "progress=false"], run_dir=str(tmp_path))


def test_rewards_outside_the_bound_are_clipped_and_counted(tmp_path):
    import csv

    _run(tmp_path, "big")
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert all(float(r["diag/reward_clip_fraction"]) == 1.0 for r in rows)
    assert all(float(r["diag/return"]) <= 20.0 for r in rows)  # 20 steps x reward_bound 1


@pytest.mark.parametrize("mode", ["nan_reward", "inf_obs", "raise"])
def test_bad_data_aborts_the_round_unreleased_with_a_resumable_checkpoint(tmp_path, mode):
    with pytest.raises(DataError):
        _run(tmp_path, mode, after=3 * 2 * 20 * 2 + 5)  # 3 users x 2 rollouts x 20 steps: bad during round 2
    state, _ = load_latest_checkpoint(str(tmp_path / "checkpoints"))
    assert state["round"] == 2
    assert [e["round"] for e in state["privacy"]["ledger"]["entries"]] == [0, 1]  # round 2 not released
    assert len(state["sampler"]["used"]) == 9  # the failed round's users stay used: never reused
