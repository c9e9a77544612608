"""Box (continuous) actions: PG/DP-PG, NPG/DP-NPG and REBEL/DP-REBEL run on Pendulum-v1 with the Gaussian
policy through the same policy protocol; actions reach the env inside the Box; spaces still unsupported are
one-line errors."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import dppo
from dppo.envs.rollout import RolloutEngine
from dppo.envs.gym_env import GymEnvFactory
from dppo.errors import ConfigError
from dppo.policies.gaussian import GaussianMLPPolicy

SMOKE = ["rounds=2", "users_per_round=3", "eval_episodes=2", "env.horizon=20", "progress=false",
         "privacy.secure_rng=false"]
EXPERIMENTS = ["pendulum_pg", "pendulum_dp_pg", "pendulum_npg", "pendulum_dp_npg", "pendulum_rebel",
               "pendulum_dp_rebel"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_pendulum_smoke_run_for_each_family(tmp_path, experiment):
    summary = dppo.train([f"+experiment={experiment}", *SMOKE], run_dir=str(tmp_path))
    private = experiment.startswith("pendulum_dp_")
    assert summary["env_id"] == "Pendulum-v1" and summary["rounds_done"] == 2
    assert np.isfinite(summary["final_return"]) and -16.3 * 20 <= summary["final_return"] <= 0
    if private:
        assert summary["epsilon_spent"] == pytest.approx(5.0) and len(summary["ledger"]) >= 2
    else:
        assert summary["epsilon_spent"] == 0
    run = dppo.load(str(tmp_path))
    a = run.policy.predict(np.zeros(3, np.float32))
    assert a.shape == (1,) and -2.0 <= float(a[0]) <= 2.0


def test_rollout_stores_the_gaussian_sample_and_steps_the_env_with_the_squashed_action():
    env = GymEnvFactory("Pendulum-v1", horizon=15)
    torch.manual_seed(0)
    pi = GaussianMLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,), log_std_init=1.0)
    uniforms = torch.rand(2, 15, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batch = RolloutEngine(env).run(pi, [1, 2], uniforms, reward_bound=16.3)
    assert batch.actions.shape == (2, 15, 1) and batch.actions.dtype == torch.float32
    assert batch.actions.abs().max() > 2.0  # pre-squash samples, sigma = e
    # the samples are the inverse-CDF Gaussian of the caller's uniforms (the users' own streams)
    obs0 = batch.obs[:, 0]
    assert torch.allclose(batch.actions[:, 0], pi.sample_from_uniforms(obs0, uniforms[:, 0]), atol=1e-5)
    # replaying the squashed actions in a fresh env reproduces the stored (clipped) rewards
    e = env.make()
    e.reset(seed=1)
    rewards = [e.step(pi.env_action(batch.actions[0, t:t + 1]).numpy()[0])[1] for t in range(15)]
    assert np.allclose(rewards, batch.rewards[0].numpy(), atol=1e-5)


def test_reward_clipping_is_enforced_for_pendulum_rewards():
    env = GymEnvFactory("Pendulum-v1", horizon=30)
    pi = GaussianMLPPolicy(env.observation_space, env.action_space, hidden_sizes=(), log_std_init=1.0)
    uniforms = torch.rand(2, 30, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batch = RolloutEngine(env).run(pi, [3, 4], uniforms, reward_bound=1.0)
    assert batch.rewards.min() >= -1.0 and batch.reward_clip_fraction > 0.5  # Pendulum rewards reach -16.3


def test_discrete_policy_on_box_actions_is_a_one_line_error():
    with pytest.raises(ConfigError, match="policy=gaussian"):
        dppo.train(["algo=pg", "env=pendulum", "policy=mlp", *SMOKE])


def test_pendulum_runs_with_the_default_policy(tmp_path):
    """``policy=auto`` (the default) picks a Gaussian MLP for Box actions: ``env.id=Pendulum-v1`` alone runs."""
    summary = dppo.train(["env.id=Pendulum-v1", *SMOKE], run_dir=str(tmp_path))
    assert summary["env_id"] == "Pendulum-v1" and summary["rounds_done"] == 2 and summary["epsilon_spent"] == 5.0
    assert isinstance(dppo.load(str(tmp_path)).policy, GaussianMLPPolicy)


def test_the_auto_policy_follows_the_action_space():
    from dppo.policies.auto import auto_policy
    from dppo.policies.mlp import MLPPolicy

    box = gym.spaces.Box(-1, 1, (3,))
    assert isinstance(auto_policy(box, gym.spaces.Discrete(4)), MLPPolicy)
    gauss = auto_policy(box, gym.spaces.Box(-2, 2, (2,)), hidden_sizes=[8], squash="clip")
    assert isinstance(gauss, GaussianMLPPolicy) and gauss.squash == "clip" and gauss.action_dim == 2
    with pytest.raises(ConfigError, match="policy=mlp.*policy=multi_discrete.*policy=gaussian"):
        auto_policy(box, gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(3)]))
    with pytest.raises(ConfigError, match="policy.squash applies to Box"):
        auto_policy(box, gym.spaces.Discrete(2), squash="tanh")


def test_unsupported_action_spaces_stay_one_line_errors():
    with pytest.raises(ConfigError, match="1-d Box action space"):
        GaussianMLPPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiDiscrete([2, 3]))
    with pytest.raises(ConfigError, match="Discrete action space"):
        dppo.make_config(["algo=pg"])  # composes fine ...
        from dppo.policies.mlp import MLPPolicy

        MLPPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiBinary(2))


def test_the_fisher_of_a_gaussian_policy_is_a_monte_carlo_psd_matrix():
    from dppo.envs.rollout import Episodes
    from dppo.policies.spaces import make_space

    env = GymEnvFactory("Pendulum-v1", horizon=10)
    pi = GaussianMLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    space = make_space(pi, "auto", dim=6)
    obs = torch.randn(20, 1, 3)
    states = Episodes(obs, torch.zeros(20, 1, 1), torch.zeros(20, 1, dtype=torch.float64),
                      torch.ones(20, 1, dtype=torch.bool), torch.zeros(20, dtype=torch.float64), torch.zeros(20))
    F = space.fisher(states, 500).matrix
    assert F.shape == (6, 6) and torch.allclose(F, F.T) and torch.linalg.eigvalsh(F).min() >= -1e-9
