"""PG / DP-PG: the step's James-Stein shrinkage (``shrink``) against an independent computation, and the noise std
the release reports to it against the noise the released mean carries."""
import pytest
import torch

from dppo.algos.pg import PolicyGradient, shrinkage


def test_shrinkage_is_the_positive_part_james_stein_factor_of_the_released_mean():
    """(1 - d s^2 / ||g~||^2)_+: near 0 on pure noise (||g~||^2 ~ d s^2), near 1 with a signal far above the
    noise, exactly 1 without noise (the twin), and it lowers the mean squared error of the release."""
    gen = torch.Generator().manual_seed(0)
    d, s = 64, 0.1
    g = torch.randn(d, generator=gen, dtype=torch.float64)
    g = g / g.norm() * (0.5 * d) ** 0.5 * s  # signal energy half the noise energy
    noisy = g + s * torch.randn(2000, d, generator=gen, dtype=torch.float64)
    factors = torch.tensor([shrinkage(row, s) for row in noisy], dtype=torch.float64)
    want = (1 - d * s * s / noisy.pow(2).sum(1)).clamp_min(0)  # computed independently
    torch.testing.assert_close(factors, want)
    shrunk = factors[:, None] * noisy
    assert float((shrunk - g).pow(2).sum(1).mean()) < float((noisy - g).pow(2).sum(1).mean())
    pure = s * torch.randn(200, d, generator=gen, dtype=torch.float64)
    assert float(torch.tensor([shrinkage(row, s) for row in pure]).mean()) < 0.1
    ones = torch.full((d,), 1.0, dtype=torch.float64)
    assert abs(shrinkage(ones, s) - (1 - s * s)) < 1e-12  # ||g~||^2 = d: 1 - d s^2 / d
    assert shrinkage(g, 0.0) == 1.0


@pytest.mark.parametrize("multi_pass", [False, True])
def test_the_reported_noise_std_is_the_std_of_the_released_means_noise(multi_pass):
    """One-pass and multi-pass (Poisson) DP-PG: with zero advantages the users' clipped sum is 0, so the released
    mean is the noise over the divisor (m, or the expected count q N); ``privacy/noise_std`` (what the shrinkage and
    AdamBC are told) is its per-coordinate std, checked on the 4,610 coordinates of the MLP's gradient."""
    from dppo.data.sampler import OnePassUserSampler, PoissonUserSampler
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.policies.mlp import MLPPolicy
    from dppo.policies.spaces import make_space
    from dppo.privacy import NoiseSource, PrivacyContext
    from dppo.privacy.accountants import make_accountant

    torch.manual_seed(0)
    env = GymEnvFactory("CartPole-v1", horizon=10)
    policy = MLPPolicy(env.observation_space, env.action_space)
    space = make_space(policy, subspace="full", dim=None)
    privacy = PrivacyContext(2.0, 1e-5, accountant=make_accountant("rdp" if multi_pass else "parallel"),
                             noise=NoiseSource(4, secure=False), multi_pass=multi_pass,
                             population_size=40 if multi_pass else None)
    sampler = PoissonUserSampler(4, 40, seed=0) if multi_pass else OnePassUserSampler(4, seed=0)
    learner = PolicyGradient(policy, env, privacy, sampler, space=space, seed=0, rounds=5, reward_bound=1.0,
                             max_grad_norm=0.5, group_size=2, advantage="to_go")
    batch = learner.collect([0, 1, 2], 0)
    direction, stats = learner.update_direction(batch, torch.zeros_like(batch.rewards), 0, [0, 1, 2])
    z = learner.release.noise_multiplier
    want = z * 0.5 / (0.1 * 40) if multi_pass else z * 2 * 0.5 / 3   # sensitivity C (add/remove) or 2C, over q N or m
    assert stats["privacy/noise_std"] == pytest.approx(want, rel=1e-12)
    assert float(direction.std()) == pytest.approx(want, rel=0.05) and abs(float(direction.mean())) < 0.1 * want
