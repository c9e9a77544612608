"""dppo.privacy.composed with Poisson sampling (multi-pass DP-PPO): the add/remove sensitivity C of one clipped sum
(brute force), the round's k releases as one subsampled Gaussian of multiplier 1 / mu, the accountant's eps after
the planned rounds recomputed with Opacus' RDP accountant directly, the mean over the expected count, refusals."""
import math
from types import SimpleNamespace

import pytest
import torch
from opacus.accountants import RDPAccountant as OpacusRDP

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants.opacus import RDPAccountant
from dppo.privacy.composed import Poisson, composed_sums
from dppo.privacy.correlated import CorrelatedNoise

PARTS = {"actor": (3, 0.7), "critic": (3, 0.3)}


def _ctx(eps=2.0, population=200, **kw):
    return PrivacyContext(eps, 1e-5, accountant=RDPAccountant(), noise=NoiseSource(0, secure=False), multi_pass=True,
                          population_size=population, **kw)


def _sampler(q=0.05, population=200):
    return SimpleNamespace(sample_rate=q, population_size=population, multi_pass=True)


def test_adding_or_removing_one_user_changes_a_clipped_sum_by_at_most_C_and_a_large_vector_attains_it():
    gen = torch.Generator().manual_seed(0)
    twin, worst = composed_sums(PrivacyContext(None, 1e-5), releases_per_user=1), 0.0
    for trial in range(1000):
        m, d, C = 1 + trial % 6, 1 + trial % 4, float(0.2 + trial % 3)
        D = torch.randn(m, d, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-2, 3, (m, 1), generator=gen)
        i = trial % m
        without = torch.cat([D[:i], D[i + 1:]])
        s, _ = twin.release_sum(D, range(m), C)
        s2 = twin.release_sum(without, range(m - 1), C)[0] if m > 1 else torch.zeros(d, dtype=torch.float64)
        gap = float((s - s2).norm())
        assert gap <= C * (1 + 1e-9)
        worst = max(worst, gap / C)
    assert worst > 1 - 1e-6   # a user of norm >= C moves the sum by C


def test_the_round_is_one_subsampled_gaussian_whose_accountant_eps_after_the_planned_rounds_is_the_target():
    privacy = _ctx()
    rel = composed_sums(privacy, parts=PARTS, sampler=_sampler(), rounds=20)
    assert isinstance(rel.sampling, Poisson)
    k = 6
    z = rel.noise_multiplier
    # the parts split mu^2 = sum_p k_p / z_p^2 by their shares, and mu = 1 / z_round
    assert rel.gdp_mu * z == pytest.approx(1.0, rel=1e-12)
    assert 3 / rel.multipliers["actor"] ** 2 == pytest.approx(0.7 / z ** 2, rel=1e-12)
    assert rel.multipliers["actor"] == pytest.approx(math.sqrt(k) * z * math.sqrt(3 / (k * 0.7)), rel=1e-12)
    assert rel.sigma(0.5, "critic") == pytest.approx(rel.multipliers["critic"] * 0.5)   # sensitivity C, not 2C
    for r in range(20):
        entry = rel.open_round(r, [10 * r, 10 * r + 1], (0.5, 0.25))
        y, _ = rel.release_sum(torch.ones(2, 3), [10 * r, 10 * r + 1], 0.5, part="actor")
    assert entry["adjacency"] == "add_remove" and entry["sample_rate"] == 0.05 and entry["eps"] is None
    assert entry["sigmas"] == pytest.approx([rel.multipliers["actor"] * 0.5, rel.multipliers["critic"] * 0.25])
    direct = OpacusRDP()
    direct.history = [(z, 0.05, 20)]
    eps = direct.get_epsilon(1e-5)
    assert privacy.spent()[0] == pytest.approx(eps, rel=1e-9) and 1.9 < eps <= 2.0 + 1e-9
    assert rel.batch_size(7) == pytest.approx(0.05 * 200)   # the mean divides by q N, not the sampled count


def test_a_user_takes_part_in_at_most_its_parts_releases_of_a_round():
    rel = composed_sums(_ctx(), parts={"actor": (1, 0.5), "critic": (1, 0.5)}, sampler=_sampler(), rounds=5)
    rel.open_round(0, [1, 2], (1.0, 1.0))
    rel.release_sum(torch.ones(1, 2), [1], 1.0, part="actor")
    with pytest.raises(PrivacyError, match="more than 1"):
        rel.release_sum(torch.ones(1, 2), [1], 1.0, part="actor")


def test_multi_pass_refuses_correlated_noise_in_one_line():
    privacy = _ctx()
    privacy.noise_correlation = CorrelatedNoise("banded_sqrt", 2)
    with pytest.raises(ConfigError, match="one-pass users"):
        composed_sums(privacy, parts=PARTS, sampler=_sampler(), rounds=5)
