"""Noise sources: the OS-CSPRNG path has the right distributions, is not reproducible and keeps no state;
the seeded path is reproducible."""
import numpy as np
import pytest
import torch
from scipy import stats

from dppo.privacy import NoiseSource, PrivacyContext

N = 100_000
KS_MAX = 0.01   # P(Kolmogorov-Smirnov D > 0.01) at n = 1e5 is about 1e-8 for a correct sampler


@pytest.mark.parametrize("draw,cdf", [
    (lambda s: s.gaussian((N,), 2.0), stats.norm(scale=2.0).cdf),
    (lambda s: s.gaussian((N - 1,), 1.0), stats.norm.cdf),                 # odd size: Box-Muller pairs cut
    (lambda s: s.laplace((N,), 0.5), stats.laplace(scale=0.5).cdf),
    (lambda s: s.gumbel((N,)), stats.gumbel_r.cdf),
    (lambda s: s.uniform((N,)), stats.uniform.cdf),
])
def test_secure_draws_follow_their_distribution(draw, cdf):
    x = draw(NoiseSource.os_csprng())
    assert x.dtype == torch.float64 and torch.isfinite(x).all()
    assert stats.kstest(x.numpy(), cdf).statistic < KS_MAX


def test_secure_uniforms_lie_strictly_inside_the_unit_interval_on_a_53_bit_grid():
    u = NoiseSource.os_csprng().uniform((4, 50_000)).numpy()
    assert u.shape == (4, 50_000) and u.min() > 0 and u.max() < 1
    k = u * 2.0 ** 53 - 0.5
    assert np.array_equal(k, np.round(k))                 # (k + 1/2) / 2^53 exactly


def test_secure_source_has_no_seed_and_no_state_seeded_source_is_reproducible():
    a, b = NoiseSource.os_csprng(), NoiseSource.os_csprng()
    assert not torch.equal(a.gaussian((64,), 1.0), b.gaussian((64,), 1.0))
    assert a.state_dict() == {"secure": True} and a.label == "os_csprng"
    s1, s2 = NoiseSource(3), NoiseSource(3)
    assert torch.equal(s1.gaussian((64,), 1.0), s2.gaussian((64,), 1.0)) and s1.label == "seeded"
    state = s1.state_dict()
    x = s1.laplace((8,), 1.0)
    s2.load_state_dict(state)
    assert torch.equal(s2.laplace((8,), 1.0), x)


def test_a_privacy_context_without_explicit_noise_is_secure():
    assert PrivacyContext(1.0).noise.secure
