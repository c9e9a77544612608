"""Contextual bandit: users are population contexts, rewards are bounded, evaluation users are held out."""
import math

import numpy as np
import pytest
import torch

from dppo.envs.rollout import RolloutEngine
from dppo.envs.bandit import ContextualBandit
from dppo.errors import ConfigError, PrivacyError
from dppo.policies.loglinear import LogLinearPolicy


def test_user_u_sees_context_u_of_the_seeded_population():
    a, b = ContextualBandit(population=50, seed=3), ContextualBandit(population=50, seed=3)
    env = a.make()
    obs, _ = env.reset(seed=7)
    np.testing.assert_allclose(obs, a.contexts[7].astype(np.float32))
    np.testing.assert_array_equal(a.contexts, b.contexts)
    assert not np.allclose(a.contexts[7], a.contexts[8])
    assert not np.allclose(a.contexts, ContextualBandit(population=50, seed=4).contexts)


@pytest.mark.parametrize("variant", ["linear", "nonlinear"])
def test_mean_reward_is_the_declared_function_and_bounded(variant):
    bandit = ContextualBandit(population=200, dim=4, actions=3, variant=variant, seed=1)
    phi = bandit.contexts.reshape(-1, 4)
    assert np.linalg.norm(phi, axis=1).max() <= 1 + 1e-12
    z = phi @ bandit.theta_star
    expected = z if variant == "linear" else np.sin(math.pi * z)
    np.testing.assert_allclose(bandit.mean_reward(phi), expected)
    assert np.abs(bandit.mean_reward(phi)).max() <= 1.0


def test_step_pays_reward_and_reports_regret():
    bandit = ContextualBandit(population=10, noise_std=0.0, seed=0)
    env = bandit.make()
    obs, _ = env.reset(seed=2)
    means = obs.astype(np.float64) @ bandit.theta_star
    _, r, term, trunc, info = env.step(1)
    assert term and not trunc
    assert r == pytest.approx(means[1], abs=1e-6)
    assert info["regret"] == pytest.approx(means.max() - means[1], abs=1e-6)


def test_evaluation_contexts_are_never_training_users():
    bandit = ContextualBandit(population=100, seed=0)
    train = set(bandit.reset_seeds(0, range(100)))
    from dppo.data.streams import public_reset_seeds

    for run_seed in (0, 5):
        held_out = {bandit.public_seed(s) for s in public_reset_seeds(run_seed, "eval", 0, 50)}
        assert not train & held_out and min(held_out) >= bandit.population
    with pytest.raises(PrivacyError):
        bandit.reset_seeds(0, [100])


def test_rollout_clips_noisy_rewards_to_the_bound():
    bandit = ContextualBandit(population=64, noise_std=5.0, seed=0)
    policy = LogLinearPolicy(bandit.observation_space, bandit.action_space)
    uniforms = torch.rand(64, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batch = RolloutEngine(bandit).run(policy, list(range(64)), uniforms, reward_bound=1.0)
    assert batch.rewards.abs().max() <= 1.0
    assert batch.reward_clip_fraction > 0.3
    assert batch.lengths.eq(1).all()


def test_bad_bandit_config_is_a_config_error():
    with pytest.raises(ConfigError):
        ContextualBandit(variant="cubic")
    with pytest.raises(ConfigError):
        ContextualBandit(actions=1)
