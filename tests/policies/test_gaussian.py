"""Gaussian MLP policy: densities against torch.distributions, actions inside the Box, predict shapes."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Independent, Normal, TransformedDistribution
from torch.distributions.transforms import AffineTransform, TanhTransform

from dppo.errors import ConfigError
from dppo.policies.gaussian import GaussianMLPPolicy

OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
ACT = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


def _policy(**kw):
    torch.manual_seed(0)
    return GaussianMLPPolicy(OBS, ACT, hidden_sizes=(8,), **kw)


@pytest.mark.parametrize("log_std", ["param", "state"])
def test_tanh_log_prob_is_the_density_of_the_squashed_action(log_std):
    pi = _policy(log_std=log_std, log_std_init=-0.3)
    obs = torch.randn(5, 3)
    u, logp = pi.sample(obs, generator=torch.Generator().manual_seed(1))
    mu, log_std_v = pi.mean_and_log_std(obs)
    low, high = torch.tensor(ACT.low), torch.tensor(ACT.high)
    ref = TransformedDistribution(Independent(Normal(mu, log_std_v.exp()), 1),
                                  [TanhTransform(), AffineTransform((low + high) / 2, (high - low) / 2)])
    a = pi.env_action(u)
    assert torch.allclose(logp, ref.log_prob(a.clamp(low + 1e-6, high - 1e-6)), atol=1e-3)
    assert torch.allclose(a, (low + high) / 2 + (high - low) / 2 * torch.tanh(u), atol=1e-6)


def test_clip_log_prob_is_the_gaussian_density_of_the_unclipped_sample():
    pi = _policy(squash="clip")
    obs = torch.randn(4, 3)
    u, logp = pi.sample(obs, generator=torch.Generator().manual_seed(2))
    mu, log_std = pi.mean_and_log_std(obs)
    assert torch.allclose(logp, Independent(Normal(mu, log_std.exp()), 1).log_prob(u), atol=1e-5)
    a = pi.env_action(u * 10)
    assert torch.all(a >= torch.tensor(ACT.low)) and torch.all(a <= torch.tensor(ACT.high))


def test_score_function_matches_autograd_of_the_reference_density():
    pi = _policy()
    obs, u = torch.randn(3, 3), torch.randn(3, 2)
    g = torch.autograd.grad(pi.log_prob(obs, u).sum(), pi.log_std)[0]
    mu, log_std = pi.mean_and_log_std(obs)
    z = (u - mu) / log_std.exp()
    assert torch.allclose(g, (z**2 - 1).sum(0).detach(), atol=1e-4)  # d/dlog_sigma log N = z^2 - 1


def test_state_dependent_log_std_stays_in_its_range_and_starts_at_init():
    pi = _policy(log_std="state", log_std_init=-1.0, log_std_min=-4.0, log_std_max=1.0)
    _, ls = pi.mean_and_log_std(torch.randn(6, 3))
    assert torch.allclose(ls, torch.full_like(ls, -1.0), atol=1e-5)
    with torch.no_grad():
        pi.log_std_head.weight.fill_(100.0)
    _, ls = pi.mean_and_log_std(torch.randn(50, 3) * 10)
    assert ls.min() >= -4.0 and ls.max() <= 1.0


def test_predict_single_and_batched_observations_returns_numpy_actions_in_the_box():
    pi = _policy()
    one = pi.predict(np.zeros(3))
    many = pi.predict(np.zeros((7, 3)), deterministic=True)
    assert isinstance(one, np.ndarray) and one.shape == (2,) and ACT.contains(one.astype(np.float32))
    assert many.shape == (7, 2) and np.allclose(many, many[0])  # deterministic: the mean
    with pytest.raises(Exception, match="shape"):
        pi.predict(np.zeros(5))


def test_unsupported_spaces_are_one_line_errors():
    with pytest.raises(ConfigError, match="1-d Box action space"):
        GaussianMLPPolicy(OBS, gym.spaces.Discrete(3))
    with pytest.raises(ConfigError, match="bounded"):
        GaussianMLPPolicy(OBS, gym.spaces.Box(-np.inf, np.inf, shape=(1,)))
    assert GaussianMLPPolicy(OBS, gym.spaces.Box(-np.inf, np.inf, shape=(1,)), squash="clip").action_dim == 1
