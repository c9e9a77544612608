"""dppo.privacy.composed: the replace-one sensitivity of one clipped sum (brute force), the exact GDP
composition of k adaptive releases (independent numerical integration and a Monte Carlo transcript), the
participation rule, and the ledger."""
import math

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.stats import norm

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.calibration import analytic_gaussian_sigma, gaussian_sums_calibration
from dppo.privacy.composed import ComposedGaussianSums, composed_sums


def composed_noise_multiplier(eps, delta, k, composition="gdp"):
    """z of k one-pass releases at equal shares (the one calibration function's ledger multiplier)."""
    return gaussian_sums_calibration(eps, delta, {None: (k, 1.0)}, composition=composition).noise_multiplier


def ClippedSums():
    """The non-private twin: the one release with no noise (a context without eps)."""
    return composed_sums(PrivacyContext(None, 1e-5), releases_per_user=1)


def test_replace_one_changes_a_clipped_sum_by_at_most_2C_and_opposite_large_vectors_attain_it():
    """Brute force over random rounds: replacing one user's vector (any norm, any direction) moves the sum of
    clipped vectors by <= 2C; a user replaced by its negation at norm >= C moves it by 2C (to rounding)."""
    gen = torch.Generator().manual_seed(0)
    twin = ClippedSums()
    worst = 0.0
    for trial in range(2000):
        m, d, C = 1 + trial % 7, 1 + trial % 5, float(0.1 + trial % 3)
        D = torch.randn(m, d, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-2, 3, (m, 1), generator=gen)
        Dp = D.clone()
        i = trial % m
        Dp[i] = torch.randn(d, generator=gen, dtype=torch.float64) * 10.0 ** float(torch.randint(-2, 3, (1,), generator=gen))
        s, _ = twin.release_sum(D, range(m), C)
        sp, _ = twin.release_sum(Dp, range(m), C)
        gap = float((s - sp).norm())
        assert gap <= 2 * C * (1 + 1e-12)
        worst = max(worst, gap / (2 * C))
        Dn = D.clone()
        Dn[i] = -D[i] * max(1.0, 2 * C / float(D[i].norm()))   # the negation, at norm >= C
        Dx = D.clone()
        Dx[i] = D[i] * max(1.0, 2 * C / float(D[i].norm()))
        gap_opp = float((twin.release_sum(Dx, range(m), C)[0] - twin.release_sum(Dn, range(m), C)[0]).norm())
        assert gap_opp == pytest.approx(2 * C, rel=1e-8)
    assert 0.9 < worst <= 1.0


def _delta_of_gdp_by_integration(mu: float, eps: float) -> float:
    """delta(eps) = E_{L ~ N(mu^2/2, mu^2)} [(1 - e^{eps - L})_+] (the privacy-loss distribution of a
    mu-GDP mechanism), by numerical integration (independent of the closed form used for calibration)."""
    f = lambda L: (1 - math.exp(eps - L)) * norm.pdf(L, loc=mu * mu / 2, scale=mu)
    val, _ = integrate.quad(f, eps, mu * mu / 2 + 40 * mu, limit=400, epsabs=1e-15, epsrel=1e-10)
    return val


@pytest.mark.parametrize("eps,k", [(1.0, 1), (1.0, 8), (5.0, 2), (5.0, 8), (3.0, 20)])
def test_k_releases_at_the_calibrated_multiplier_spend_exactly_eps_delta(eps, k):
    """k Gaussian releases of noise multiplier z compose to (sqrt(k)/z)-GDP; its delta at eps, integrated
    from the privacy-loss distribution, equals the target 1e-5 (the calibration is exact, not just valid)."""
    z = composed_noise_multiplier(eps, 1e-5, k)
    assert _delta_of_gdp_by_integration(math.sqrt(k) / z, eps) == pytest.approx(1e-5, rel=1e-4)
    assert z == pytest.approx(math.sqrt(k) * analytic_gaussian_sigma(eps, 1e-5, 1.0))


def test_adaptive_transcript_privacy_loss_matches_the_composed_gaussian_by_monte_carlo():
    """A k-step adaptive transcript (each step's mean shift, of norm 2C, points in a direction that depends
    on the earlier noisy outputs): the privacy loss sum_j <y_j - mid_j, diff_j> / sigma^2 is N(mu^2/2, mu^2)
    with mu = sqrt(k)/z, whatever the adaptivity; its empirical delta at eps matches the calibration."""
    eps, delta, k, C, d, n = 1.0, 0.05, 4, 0.5, 3, 200_000
    z = composed_noise_multiplier(eps, delta, k)
    sigma = z * 2 * C
    rng = np.random.default_rng(0)
    loss = np.zeros(n)
    prev = np.zeros((n, d))
    for _ in range(k):
        direction = np.tanh(prev + 1.0)                       # adaptive: a function of earlier outputs
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        mean_D, mean_Dp = C * direction, -C * direction      # the canary's clipped vector under D and D'
        y = mean_D + rng.normal(scale=sigma, size=(n, d))    # released under D
        loss += ((y - mean_Dp) ** 2 - (y - mean_D) ** 2).sum(1) / (2 * sigma ** 2)
        prev = y
    mu = math.sqrt(k) / z
    assert loss.mean() == pytest.approx(mu * mu / 2, rel=0.02)
    assert loss.std() == pytest.approx(mu, rel=0.02)
    emp_delta = np.mean(np.clip(1 - np.exp(eps - loss), 0, None))
    assert emp_delta == pytest.approx(delta, rel=0.05)


def test_rdp_calibration_is_valid_and_needs_more_noise_than_the_exact_gdp():
    """Opacus' RDP accountant (sample rate 1, k steps) at the rdp multiplier spends <= eps, and that multiplier
    is at least the exact GDP one."""
    from opacus.accountants import RDPAccountant

    for eps, k in [(1.0, 8), (5.0, 8)]:
        z_rdp, z_gdp = composed_noise_multiplier(eps, 1e-5, k, "rdp"), composed_noise_multiplier(eps, 1e-5, k)
        acc = RDPAccountant()
        acc.history = [(z_rdp, 1.0, k)]
        assert acc.get_epsilon(1e-5) <= eps * (1 + 1e-3)
        assert z_rdp >= z_gdp


def _ctx(eps=5.0):
    return PrivacyContext(eps, 1e-5, noise=NoiseSource(0))


def test_one_ledger_entry_per_round_and_the_run_spends_eps_by_parallel_composition():
    privacy = _ctx(5.0)
    mech = composed_sums(privacy, parts={"a": (2, 0.5), "b": (2, 0.5)})   # k = 4, equal shares
    for r in range(3):
        users = list(range(10 * r, 10 * r + 10))
        mech.open_round(r, users, (1.0, 0.5))
        for _ in range(2):
            for half in (users[:5], users[5:]):
                mech.release_sum(torch.ones(5, 3), half, 1.0, part="a")
                mech.release_sum(torch.ones(5, 2), half, 0.5, part="b")
    assert len(privacy.ledger.entries) == 3
    entry = privacy.ledger.entries[0]
    assert entry["mechanism"] == "composed_gaussian_sum" and entry["releases_per_user"] == 4
    assert entry["sigmas"] == pytest.approx([2 * mech.noise_multiplier, mech.noise_multiplier])
    assert privacy.spent()[0] == pytest.approx(5.0)


def test_the_noise_of_a_sum_has_std_z_times_its_sensitivity():
    privacy = _ctx(2.0)
    mech = ComposedGaussianSums(privacy, releases_per_user=200_000)
    users = list(range(2))
    mech.open_round(0, users, (0.3,))
    draws = torch.stack([mech.release_sum(torch.zeros(2, 1), users, 0.3)[0] for _ in range(20_000)])
    assert float(draws.std()) == pytest.approx(mech.noise_multiplier * 0.6, rel=0.03)


def test_participation_beyond_k_a_foreign_user_and_a_release_before_open_round_are_refused():
    mech = ComposedGaussianSums(_ctx(), releases_per_user=2)
    with pytest.raises(PrivacyError, match="open_round"):
        mech.release_sum(torch.ones(1, 2), [0], 1.0)
    mech.open_round(0, [0, 1, 2], (1.0,))
    mech.release_sum(torch.ones(2, 2), [0, 1], 1.0)
    mech.release_sum(torch.ones(1, 2), [0], 1.0)
    with pytest.raises(PrivacyError, match="more than 2 releases"):
        mech.release_sum(torch.ones(1, 2), [0], 1.0)
    with pytest.raises(PrivacyError, match="distinct users of the opened round"):
        mech.release_sum(torch.ones(1, 2), [7], 1.0)
    mech.open_round(1, [3, 4], (1.0,))          # a new round resets the counts
    mech.release_sum(torch.ones(2, 2), [3, 4], 1.0)


def test_twin_is_the_same_clipped_sum_without_noise_and_records_nothing():
    privacy = PrivacyContext(None, 1e-5)
    mech = composed_sums(privacy, releases_per_user=4)
    assert not mech.private and mech.mechanism == "none" and mech.open_round(0, [0, 1], (1.0,)) is None
    v = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    s, stats = mech.release_sum(v, [0, 1], 1.0)
    assert torch.allclose(s, torch.tensor([0.6 + 0.3, 0.8 + 0.4], dtype=torch.float64), atol=1e-8)
    assert stats["diag/clip_fraction"] == 0.5 and not privacy.ledger.entries


def test_multi_pass_and_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="one-pass"):
        ComposedGaussianSums(PrivacyContext(1.0, 1e-5, multi_pass=True, population_size=10), 2)
    with pytest.raises(ConfigError, match="accountant"):
        composed_sums(_ctx(), 2, composition="advanced")
    with pytest.raises(ConfigError, match=">= 1"):
        composed_noise_multiplier(1.0, 1e-5, 0)


@pytest.mark.parametrize("eps,ka,kc,share", [(5.0, 6, 6, 0.8), (1.0, 4, 4, 0.3), (3.0, 2, 5, 0.6)])
def test_unequal_shares_spend_exactly_eps_delta_by_integration_and_rdp_stays_within_eps(eps, ka, kc, share):
    """Two parts (k_a releases with share w, k_c with 1 - w): the composed mu = sqrt(sum_p k_p / z_p^2), from the
    parts' own multipliers, has delta(eps) = 1e-5 by integrating its privacy-loss distribution; the actor part's
    noise is lower than at equal noise exactly when w > k_a / k; under ``rdp`` Opacus' accountant over the
    parts' (z_p, k_p) spends <= eps."""
    from opacus.accountants import RDPAccountant

    parts = {"actor": (ka, share), "critic": (kc, 1 - share)}
    for composition in ("gdp", "rdp"):
        mech = ComposedGaussianSums(_ctx(eps), composition=composition, parts=parts)
        za, zc = mech.multipliers["actor"], mech.multipliers["critic"]
        mu = math.sqrt(ka / za ** 2 + kc / zc ** 2)
        equal = composed_noise_multiplier(eps, 1e-5, ka + kc, composition)
        assert (za < equal) == (share > ka / (ka + kc)) and mu == pytest.approx(mech.gdp_mu, rel=1e-12)
        if composition == "gdp":
            assert _delta_of_gdp_by_integration(mu, eps) == pytest.approx(1e-5, rel=1e-4)
        else:
            acc = RDPAccountant()
            acc.history = [(za, 1.0, ka), (zc, 1.0, kc)]
            assert acc.get_epsilon(1e-5) <= eps * (1 + 1e-3)


def test_equal_shares_give_the_one_part_multiplier_exactly_and_each_part_has_its_own_participation_limit():
    one = ComposedGaussianSums(_ctx(), releases_per_user=12)
    two = ComposedGaussianSums(_ctx(), parts={"actor": (6, 0.5), "critic": (6, 0.5)})
    assert two.multipliers == {"actor": one.noise_multiplier, "critic": one.noise_multiplier}
    mech = ComposedGaussianSums(_ctx(), parts={"actor": (1, 0.7), "critic": (2, 0.3)})
    mech.open_round(0, [0, 1], (1.0, 0.5))
    mech.release_sum(torch.ones(2, 2), [0, 1], 1.0, part="actor")
    with pytest.raises(PrivacyError, match="more than 1 releases of part 'actor'"):
        mech.release_sum(torch.ones(1, 2), [0], 1.0, part="actor")
    mech.release_sum(torch.ones(1, 2), [0], 0.5, part="critic")
    mech.release_sum(torch.ones(1, 2), [0], 0.5, part="critic")
    with pytest.raises(PrivacyError, match="unknown part"):
        mech.release_sum(torch.ones(1, 2), [1], 0.5, part="value")
    entry = mech.privacy.ledger.entries[0]
    assert entry["sigmas"] == pytest.approx([2 * mech.multipliers["actor"], mech.multipliers["critic"]])
    assert entry["parts"]["actor"]["share"] == 0.7
    with pytest.raises(ConfigError, match="sum to 1"):
        ComposedGaussianSums(_ctx(), parts={"actor": (1, 0.7), "critic": (2, 0.4)})
