"""Everyday use of a saved run, as a user of Stable-Baselines3 would write it: ``run.predict`` on every observation
space the policies take (one observation and a batch, the batch checked against per-observation calls), a short
``repr``, ``run.evaluate(return_std=True)`` against an independent replay of the held-out episodes, and ICU-Sepsis
runs without the legacy gym's stderr banner."""
from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import dppo
from dppo import evaluate as evaluate_cli
from dppo.errors import ConfigError, DataError
from dppo.policies.mlp import MLPPolicy
from dppo.policies.multi_discrete import MultiDiscreteMLPPolicy

TINY = ["rounds=2", "users_per_round=2", "eval_episodes=4", "progress=false", "privacy.secure_rng=false"]


def _train(tmp_path_factory, name, args):
    run_dir = str(tmp_path_factory.mktemp(name))
    summary = dppo.train([*args, *TINY], run_dir=run_dir)
    return run_dir, summary


@pytest.fixture(scope="module")
def frozenlake(tmp_path_factory):
    return _train(tmp_path_factory, "frozenlake", ["env.id=FrozenLake-v1", "algo=ppo"])


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    return _train(tmp_path_factory, "cartpole", ["algo=dp_pg", "env.horizon=30"])


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    return _train(tmp_path_factory, "pendulum", ["algo=dp_pg", "env=pendulum", "env.horizon=20"])


def _batch_matches_singles(run, batch):
    actions, state = run.predict(batch, deterministic=True)
    assert state is None and isinstance(actions, np.ndarray) and len(actions) == len(batch)
    singles = [run.predict(o, deterministic=True)[0] for o in batch]
    np.testing.assert_array_equal(actions, np.stack(singles))
    return actions, singles


# ---- 1. predict --------------------------------------------------------------------------------------------------

def test_frozenlake_predict_takes_an_int_and_a_batch_of_ints(frozenlake):
    run = dppo.load(frozenlake[0])
    one, state = run.predict(0)                       # the issue: IndexError in pad_rows
    assert state is None and isinstance(one, (int, np.integer)) and 0 <= one < 4
    assert isinstance(run.predict(np.int64(5), deterministic=True)[0], (int, np.integer))
    states = np.arange(16)
    actions, singles = _batch_matches_singles(run, states)   # the issue: a batch gave one action
    assert actions.shape == (16,) and all(np.ndim(a) == 0 for a in singles)
    # what the policy computes from the one-hot rows the rollout feeds it
    onehot = torch.eye(16)
    body_in = torch.as_tensor(states, dtype=torch.float32)[:, None]
    first = run.policy.body[1]                                       # the first Linear, read by index
    torch.testing.assert_close(run.policy.logits(body_in), run.policy.head(run.policy.body[2:](
        onehot @ first.weight.t() + first.bias)))
    np.testing.assert_array_equal(actions, run.policy.logits(body_in).argmax(-1).numpy())
    assert run.predict([0, 5], deterministic=True)[0].shape == (2,)  # a list is a batch too
    for bad in (16, -1, 0.5):
        with pytest.raises(DataError, match="Discrete\\(16\\)"):
            run.predict(bad)
    with pytest.raises(DataError, match="shape"):
        run.predict(np.zeros((2, 1), dtype=np.int64))


def test_cartpole_predict_single_and_batched(cartpole):
    run = dppo.load(cartpole[0])
    obs = np.random.default_rng(0).normal(size=(9, 4)).astype(np.float32)
    actions, singles = _batch_matches_singles(run, obs)
    assert actions.shape == (9,) and isinstance(singles[0], (int, np.integer))
    assert run.predict(obs[0].tolist(), deterministic=True)[0] == singles[0]   # a plain list as one observation


def test_box_action_predict_single_and_batched(pendulum):
    run = dppo.load(pendulum[0])
    obs = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    actions, singles = _batch_matches_singles(run, obs)
    assert actions.shape == (6, 1) and singles[0].shape == (1,)
    assert np.all(np.abs(actions) <= 2.0)


def _argmax_of_rows(policy, rows):
    return policy.logits(torch.as_tensor(np.asarray(rows, dtype=np.float32))).argmax(-1).numpy()


def test_tuple_dict_multidiscrete_observations():
    torch.manual_seed(0)
    space = gym.spaces.Tuple((gym.spaces.Discrete(3, start=1), gym.spaces.Box(-1, 1, (2,))))
    policy = MLPPolicy(space, gym.spaces.Discrete(5), hidden_sizes=(8,))
    with torch.no_grad():
        policy.head.weight.normal_(0, 3.0)
    obs = [(1, np.array([0.5, -0.5], np.float32)), (3, np.array([0.1, 0.2], np.float32)),
           (2, np.array([-0.9, 0.9], np.float32))]
    singles = [policy.predict(o, deterministic=True) for o in obs]
    rows = [[o[0] - 1, *o[1]] for o in obs]                        # the stored rows: index - start, the Box
    np.testing.assert_array_equal(singles, _argmax_of_rows(policy, rows))
    np.testing.assert_array_equal(policy.predict(obs, deterministic=True), singles)          # a list of them
    batched = (np.array([1, 3, 2]), np.stack([o[1] for o in obs]))                           # gymnasium's layout
    np.testing.assert_array_equal(policy.predict(batched, deterministic=True), singles)
    with pytest.raises(DataError, match="Discrete"):
        policy.predict((0, np.zeros(2, np.float32)))                # 0 is below start=1

    dspace = gym.spaces.Dict({"a": gym.spaces.Discrete(4), "b": gym.spaces.MultiBinary(2)})
    policy = MLPPolicy(dspace, gym.spaces.Discrete(3), hidden_sizes=(8,))
    one = policy.predict({"a": 2, "b": np.array([1, 0])}, deterministic=True)
    many = policy.predict({"a": np.array([2, 0]), "b": np.array([[1, 0], [0, 1]])}, deterministic=True)
    assert np.ndim(one) == 0 and many.shape == (2,) and many[0] == one

    mspace = gym.spaces.MultiDiscrete([3, 4])
    policy = MultiDiscreteMLPPolicy(mspace, gym.spaces.MultiDiscrete([2, 2]), hidden_sizes=(8,))
    obs = np.array([[0, 1], [2, 3], [1, 0]])
    many = policy.predict(obs, deterministic=True)
    assert many.shape == (3, 2)
    np.testing.assert_array_equal(many, np.stack([policy.predict(o, deterministic=True) for o in obs]))


def test_masked_policy_predicts_among_the_admissible_actions(tmp_path):
    from tests.envs.test_action_masks import N_STATES, allowed   # registers the MaskRing envs

    run_dir = str(tmp_path / "ring")
    dppo.train(["env.id=MaskRingInfo-v0", "algo=ppo", "rounds=2", "users_per_round=2", "eval_episodes=2",
                "progress=false"], run_dir=run_dir)
    run = dppo.load(run_dir)
    assert getattr(run.policy, "masked", False)
    states = np.arange(N_STATES)
    masks = np.stack([allowed(s) for s in states])
    batch, _ = run.predict(states, deterministic=True, action_masks=masks)
    singles = [run.predict(int(s), deterministic=True, action_masks=m)[0] for s, m in zip(states, masks)]
    np.testing.assert_array_equal(batch, singles)
    assert all(allowed(s)[a] for s, a in zip(states, batch))
    gen = torch.Generator().manual_seed(0)
    sampled = run.policy.predict(np.repeat(states, 20), action_masks=np.repeat(masks, 20, 0), generator=gen)
    assert all(allowed(s)[a] for s, a in zip(np.repeat(states, 20), sampled))
    assert run.predict(states)[0].shape == (N_STATES,)              # no masks: unmasked, still one per state
    with pytest.raises(DataError, match="action_masks of shape"):
        run.predict(states, action_masks=masks[0])
    with pytest.raises(DataError, match="no admissible action"):
        run.predict(0, action_masks=np.zeros(4))


def test_action_masks_for_an_unmasked_policy_are_refused(cartpole):
    run = dppo.load(cartpole[0])
    with pytest.raises(ConfigError, match="no action masks"):
        run.predict(np.zeros(4, np.float32), action_masks=np.ones(2))


# ---- 2. repr -----------------------------------------------------------------------------------------------------

def test_repr_is_a_few_lines(cartpole, frozenlake):
    run = dppo.load(cartpole[0])
    assert len(run.summary["ledger"]) == 2
    text = repr(run)
    assert len(text) < 600 and len(text.splitlines()) <= 8 and "ledger" not in text
    assert text == str(run)
    for part in ("dp_pg", "CartPole-v1", "eps spent 5 of 5", "delta spent", "rounds: 2 of 2", "final_return",
                 cartpole[0], "checkpoints/ckpt_"):
        assert part in text, (part, text)
    shared = dppo.load(os.path.join(cartpole[0], "policy.pt"))
    assert "loaded: policy.pt" in repr(shared) and len(repr(shared)) < 600
    plain = repr(dppo.load(frozenlake[0]))
    assert "ppo on FrozenLake-v1" in plain and "non-private" in plain and len(plain) < 600


# ---- 3. evaluate -------------------------------------------------------------------------------------------------

def _replay(run, n):
    """The held-out episodes played independently: gymnasium's env at the run's horizon, the public evaluation
    seeds, greedy actions from ``run.predict``."""
    from dppo.evaluate import evaluation_seeds

    env = gym.make(run.env.id, max_episode_steps=run.env.horizon)
    returns, lengths = [], []
    for seed in evaluation_seeds(run, n):
        obs, _ = env.reset(seed=int(seed))
        total, steps, done = 0.0, 0, False
        while not done:
            obs, r, term, trunc, _ = env.step(run.predict(obs, deterministic=True)[0])
            total, steps, done = total + float(r), steps + 1, term or trunc
        returns.append(total)
        lengths.append(steps)
    env.close()
    return np.asarray(returns), lengths


def test_evaluate_mean_and_std_as_sb3(cartpole):
    run_dir, summary = cartpole
    run = dppo.load(run_dir)
    assert run.evaluate() == pytest.approx(summary["final_return"])          # unchanged: the mean
    returns, lengths = _replay(run, 6)
    mean, std = run.evaluate(6, greedy=True, return_std=True)
    assert mean == pytest.approx(returns.mean()) and std == pytest.approx(returns.std())   # numpy's std, as SB3
    assert mean == pytest.approx(run.evaluate(6, greedy=True))
    rewards, lens = run.evaluate(6, greedy=True, return_episode_rewards=True)
    np.testing.assert_allclose(rewards, returns)
    assert lens == lengths
    mean_s, std_s = run.evaluate(return_std=True)                           # stochastic, the run's episodes
    assert mean_s == pytest.approx(summary["final_return"]) and std_s >= 0


def test_evaluate_cli_prints_mean_and_std(cartpole, capsys):
    run_dir, _ = cartpole
    mean, std = dppo.load(run_dir).evaluate(5, return_std=True)
    assert evaluate_cli.main([run_dir, "--episodes", "5"]) == 0
    assert f"mean return {mean:.6g} +/- {std:.6g} (std) over 5 held-out episodes" in capsys.readouterr().out


# ---- 4. ICU-Sepsis without gym's banner ----------------------------------------------------------------------------

ICU_SCRIPT = """
import numpy as np, torch
from dppo.envs.gym_env import GymEnvFactory
from dppo.policies.masked import wrap_for_env
from dppo.policies.mlp import MLPPolicy
f = GymEnvFactory("icu_sepsis:Sepsis/ICU-Sepsis-v2")
torch.manual_seed(0)
policy = wrap_for_env(MLPPolicy(f.observation_space, f.action_space, hidden_sizes=(8,)), f)
from dppo.envs.icu_sepsis_vector import package_tables
ok = package_tables()["admissible"]
states = np.array([0, 5, 400, 715])
batch = policy.predict(states, deterministic=True, action_masks=ok[states])
single = [int(policy.predict(int(s), deterministic=True, action_masks=ok[s])) for s in states]
assert list(batch) == single and all(ok[s, a] for s, a in zip(states, batch)), (batch, single)
assert policy.predict(states).shape == (4,)
print("ok", f.observation_space)
"""


def test_icu_sepsis_imports_without_the_gym_banner_and_predicts_on_its_716_states():
    pytest.importorskip("icu_sepsis")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", ICU_SCRIPT], capture_output=True, text=True, timeout=300, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok Discrete(716)" in out.stdout
    assert "Gym has been unmaintained" not in out.stderr and "migration_guide" not in out.stderr, out.stderr
