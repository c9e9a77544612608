"""Log-linear policy: logits are theta . phi(x, a) for given or outer-product features."""
import gymnasium as gym
import numpy as np
import torch

from dppo.policies.loglinear import LogLinearPolicy


def test_given_features_logits_and_log_prob():
    policy = LogLinearPolicy(gym.spaces.Box(-1, 1, (3, 2)), gym.spaces.Discrete(3), init_scale=1.0, seed=1)
    obs = torch.randn(5, 3, 2)
    theta = policy.theta.detach()
    expected = torch.log_softmax(obs @ theta, -1)
    actions = torch.tensor([0, 1, 2, 1, 0])
    torch.testing.assert_close(policy.log_prob(obs.reshape(5, -1), actions), expected[torch.arange(5), actions])


def test_flat_observation_uses_one_weight_row_per_action():
    policy = LogLinearPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), init_scale=1.0)
    s = torch.randn(6, 4)
    W = policy.theta.detach().reshape(2, 5)
    expected = torch.cat([s, torch.ones(6, 1)], 1) @ W.T
    torch.testing.assert_close(policy.logits(s), expected)


def test_zero_init_is_uniform():
    policy = LogLinearPolicy(gym.spaces.Box(-1, 1, (4, 3)), gym.spaces.Discrete(4))
    probs = torch.softmax(policy.logits(torch.randn(2, 12)), -1)
    np.testing.assert_allclose(probs.detach().numpy(), 0.25)
