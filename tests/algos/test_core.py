"""The policy-optimization core: per-user streams (one user's rollouts never depend on other users or on
packing), disjoint public seeds, vectorized collection equal to single-env episodes, group advantages
against an independent computation, and every group learner running with default settings on three envs."""
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from dppo.algos.core import group_advantages
from dppo.algos.npg import NaturalPolicyGradient
from dppo.envs.rollout import RolloutEngine
from dppo.data import streams
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.gym_env import GymEnvFactory
from dppo.oracles import make_oracle
from dppo.policies.mlp import MLPPolicy
from dppo.privacy.context import PrivacyContext


def learner_for(env_id="CartPole-v1", vectorization="auto", group_size=4, horizon=80):
    env = GymEnvFactory(env_id, horizon=horizon, vectorization=vectorization)
    torch.manual_seed(0)
    policy = MLPPolicy(env.observation_space, env.action_space)
    return NaturalPolicyGradient(policy, env, PrivacyContext(), OnePassUserSampler(3),
                                 make_oracle("exact", x_bound=None, y_bound=None), seed=7, rounds=1,
                                 group_size=group_size, reward_bound=1.0)


def user_slices(batch, users):
    G = batch.group_size
    T = int(batch.lengths.max())
    return {u: (batch.obs[i * G:(i + 1) * G, :T], batch.actions[i * G:(i + 1) * G, :T],
                batch.rewards[i * G:(i + 1) * G, :T], batch.lengths[i * G:(i + 1) * G]) for i, u in enumerate(users)}


def trimmed(part):
    obs, act, rew, n = part
    return [(obs[g, :n[g]], act[g, :n[g]], rew[g, :n[g]]) for g in range(len(n))]


def assert_same_rollouts(a, b):
    for (o1, a1, r1), (o2, a2, r2) in zip(trimmed(a), trimmed(b)):
        assert torch.equal(o1, o2) and torch.equal(a1, a2) and torch.equal(r1, r2)


def test_user_and_public_seeds_are_disjoint_by_construction():
    users = [streams.user_seed(s, u) for s in (0, 1, 2**20) for u in range(2000)]
    public = [x for s in (0, 1, 2**20) for st in ("eval", "fisher") for x in streams.public_reset_seeds(s, st, 3, 500)]
    assert max(users) < streams.PUBLIC_SEED_BASE <= min(public)
    assert streams.user_reset_seeds(0, 5, 3) == [streams.user_seed(0, 5)] * 3
    assert streams.user_generator(0, 5, 1).initial_seed() < 2**63 <= streams.public_generator(0, "eval", 1).initial_seed()


@pytest.mark.parametrize("vectorization", ["native", "sync", "none"])
def test_replacing_one_user_leaves_every_other_users_rollouts_bit_identical(vectorization):
    learner = learner_for(vectorization=vectorization)
    a = user_slices(learner.collect([3, 4, 5], round_idx=2), [3, 4, 5])
    b = user_slices(learner.collect([3, 99, 5], round_idx=2), [3, 99, 5])
    assert_same_rollouts(a[3], b[3])
    assert_same_rollouts(a[5], b[5])


def test_a_users_rollouts_do_not_depend_on_packing_or_backend():
    """User 4 alone, first or last in its round, on every backend: the same G rollouts."""
    ref = user_slices(learner_for(vectorization="none").collect([4], 1), [4])[4]
    for vec in ("native", "sync"):
        for users in ([4], [4, 8, 9], [1, 2, 3, 4]):
            got = user_slices(learner_for(vectorization=vec).collect(users, 1), users)[4]
            assert_same_rollouts(ref, got)


def test_native_vector_start_states_equal_single_env_resets():
    factory = GymEnvFactory("CartPole-v1", vectorization="native")
    engine = RolloutEngine(factory)
    seeds = [streams.user_seed(0, u) for u in range(6)]
    start = engine.backend(6).start(np.arange(6), seeds)
    single = gym.make("CartPole-v1")
    for i, s in enumerate(seeds):
        obs, _ = single.reset(seed=s)
        np.testing.assert_array_equal(start[i], obs)
        np.testing.assert_array_equal(engine.backend(6).vec.unwrapped.state[:, i], single.unwrapped.state)


def test_an_env_without_a_native_vector_env_falls_back_to_sync():
    from dppo.envs.rollout import resolve_vectorization
    from dppo.errors import ConfigError

    assert resolve_vectorization(GymEnvFactory("MountainCar-v0")) == "sync"
    assert resolve_vectorization(GymEnvFactory("CartPole-v1")) == "native"
    assert resolve_vectorization(GymEnvFactory("Acrobot-v1")) == "native"  # dppo/envs/acrobot_vector.py
    with pytest.raises(ConfigError):
        RolloutEngine(GymEnvFactory("MountainCar-v0", vectorization="native")).backend(2)


def test_group_advantages_match_an_independent_computation():
    rng = np.random.default_rng(0)
    R = rng.normal(size=(5, 6))
    R[2] = 3.0  # zero spread
    A, zero = group_advantages(torch.tensor(R), std=True)
    expected = (R - R.mean(1, keepdims=True)) / np.maximum(R.std(1, keepdims=True), 1e-12)
    expected[2] = 0.0
    np.testing.assert_allclose(A.numpy(), expected, rtol=1e-12, atol=1e-12)
    assert zero.tolist() == [False, False, True, False, False]
    loo, _ = group_advantages(torch.tensor(R), std=False, leave_one_out=True)
    for i in (0, 1, 3):
        for g in range(6):
            assert loo[i, g].item() == pytest.approx(R[i, g] - np.delete(R[i], g).mean())


def test_env_steps_and_episodes_are_logged_per_round():
    learner = learner_for()
    metrics = learner.train_round(0)
    assert metrics["rollout/episodes"] == 3 * 4 and metrics["rollout/users"] == 3
    assert metrics["diag/env_steps"] >= 12 and 0.0 <= metrics["diag/zero_spread_fraction"] <= 1.0
    assert not any(k.startswith("rollout/") and k not in ("rollout/users", "rollout/episodes") for k in metrics)


ENVS = {"cartpole": ["env.id=CartPole-v1", "env.horizon=100"], "acrobot": ["env.id=Acrobot-v1", "env.horizon=100"],
        "bandit": ["env=bandit", "policy=loglinear"]}


@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("algo", ["pg", "dp_pg", "npg", "dp_npg", "rebel", "dp_rebel"])
def test_every_group_learner_runs_with_default_settings(tmp_path, algo, env):
    """In process, through the API's one configuration path (the CLI's subprocess path: tests/cli)."""
    from dppo.api import train

    args = [f"algo={algo}", *ENVS[env], "rounds=2", "users_per_round=4", "eval_episodes=2", "progress=false",
            "privacy.secure_rng=false"]
    train(args, run_dir=str(tmp_path / "run"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_done"] == 2
    assert len(summary["ledger"]) == (2 if algo.startswith("dp_") else 0)


def test_eps_is_the_one_non_private_switch(cli, tmp_path):
    """``algo=pg`` is DP-PG's twin by name only (dp_pg + eps=null): with an eps it is the DP-PG run, named so;
    ``algo=dp_pg eps=null`` is the twin, named pg."""
    from dppo.api import make_config
    from dppo.build import build

    private, twin = build(make_config(["algo=pg", "eps=5"])), build(make_config(["algo=dp_pg", "eps=null"]))
    assert private.privacy.private and private.meta["algo"] == "dp_pg"
    assert not twin.privacy.private and twin.meta["algo"] == "pg" and type(twin.learner) is type(private.learner)
    res = cli(["algo=ubev", "env=riverswim", "group_size=4", f"hydra.run.dir={tmp_path}"])
    assert res.returncode == 2 and "group_size=4 does not apply to algo=ubev" in res.stderr


def test_range_bonus_matches_a_loop_over_each_episodes_bounded_coordinates():
    """b(tau) = mean over finitely bounded coordinates of (max - min) / (high - low) over the real steps."""
    from dppo.algos.core import range_bonus

    class Batch:
        pass
    gen = torch.Generator().manual_seed(0)
    batch = Batch()
    batch.obs = torch.rand(5, 7, 3, generator=gen) * 2 - 1
    lengths = [7, 3, 1, 5, 2]
    batch.mask = torch.arange(7)[None, :] < torch.tensor(lengths)[:, None]
    low, high = np.array([-1.0, -np.inf, -2.0]), np.array([1.0, np.inf, 2.0])
    got = range_bonus(batch, low, high)
    for i, n in enumerate(lengths):
        o = batch.obs[i, :n].double()
        want = ((o[:, 0].max() - o[:, 0].min()) / 2 + (o[:, 2].max() - o[:, 2].min()) / 4) / 2
        assert abs(float(got[i]) - float(want)) < 1e-6
    assert float(got[2]) == 0.0  # one step covers no range
    assert torch.equal(range_bonus(batch, np.full(3, -np.inf), np.full(3, np.inf)), torch.zeros(5, dtype=torch.float64))


def test_range_bonus_steps_are_the_growth_of_each_prefix_range_and_sum_to_the_rollouts_bonus():
    """Step t gets b(s_0..s_{t+1}) - b(s_0..s_t), recomputed here prefix by prefix; 0 on the last real step and
    on padding; each row sums to range_bonus (the per-step form DP-PPO's GAE reads)."""
    from dppo.algos.core import range_bonus, range_bonus_steps

    class Batch:
        pass
    gen = torch.Generator().manual_seed(1)
    batch = Batch()
    batch.obs = torch.rand(4, 6, 3, generator=gen) * 2 - 1
    lengths = [6, 3, 1, 4]
    batch.mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]
    low, high = np.array([-1.0, -np.inf, -2.0]), np.array([1.0, np.inf, 2.0])

    def b(o):  # the bounded coordinates' covered range of a prefix, by hand
        return float(((o[:, 0].max() - o[:, 0].min()) / 2 + (o[:, 2].max() - o[:, 2].min()) / 4) / 2)
    got = range_bonus_steps(batch, low, high)
    for i, n in enumerate(lengths):
        o = batch.obs[i].double()
        for t in range(6):
            want = b(o[:t + 2]) - b(o[:t + 1]) if t < n - 1 else 0.0
            assert abs(float(got[i, t]) - want) < 1e-6, (i, t)
    torch.testing.assert_close(got.sum(1), range_bonus(batch, low, high), rtol=0, atol=1e-12)


def test_explore_bonus_gives_mountain_car_groups_a_spread_and_reads_only_each_rollout():
    """On MountainCar every random rollout returns -200 (zero spread); with the bonus a user's advantages
    differ, and a user's advantages do not change when another user is replaced."""
    env = GymEnvFactory("MountainCar-v0", horizon=200)
    torch.manual_seed(0)
    policy = MLPPolicy(env.observation_space, env.action_space, normalize_obs=True)
    learners = [NaturalPolicyGradient(policy, env, PrivacyContext(), OnePassUserSampler(3),
                                      make_oracle("exact"), seed=7, rounds=1, group_size=4, reward_bound=1.0,
                                      explore_bonus=c) for c in (0.0, 10.0)]
    batch = learners[0].collect([0, 1, 2], round_idx=0)
    assert float(batch.returns.max()) == -200.0
    assert learners[0].step_advantages(batch)[1] == 1.0
    A, zero = learners[1].step_advantages(batch)
    assert zero == 0.0 and float(A.abs().max()) > 0
    other = learners[1].collect([0, 9, 2], round_idx=0)
    A2, _ = learners[1].step_advantages(other)
    G = 4
    torch.testing.assert_close(A[:G], A2[:G], rtol=0, atol=0)


def test_bounds_scaling_maps_the_observation_box_onto_minus_one_one():
    from dppo.policies.mlp import BoundsScaling
    space = gym.spaces.Box(np.array([-1.2, -0.07, -np.inf], dtype=np.float32),
                           np.array([0.6, 0.07, np.inf], dtype=np.float32))
    scale = BoundsScaling(space)
    out = scale(torch.tensor([[-1.2, -0.07, 5.0], [0.6, 0.07, -3.0], [-0.3, 0.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[-1.0, -1.0, 5.0], [1.0, 1.0, -3.0], [0.0, 0.0, 0.0]]))
    policy = MLPPolicy(space, gym.spaces.Discrete(3), normalize_obs=True)
    assert all(p.requires_grad for p in policy.parameters())  # the scaling adds buffers, no parameters
