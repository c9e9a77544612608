"""GFA accounting: advanced composition, zCDP of the exponential mechanism, the eps_0 calibration."""
import math

import numpy as np
import pytest
import torch

from dppo.privacy.accountants import make_accountant
from dppo.privacy.accountants.advanced import advanced_composition_eps, paper_eps0
from dppo.privacy.accountants.zcdp import zcdp_to_dp
from dppo.privacy.calibration import exp_mech_beta

DELTA = 1e-5


def release(eps, mechanism="exponential"):
    return {"mechanism": mechanism, "round": 0, "users": 1, "eps": eps, "delta": 0.0}


def test_advanced_composition_matches_the_textbook_formula():
    """Dwork & Roth Thm 3.20, k = 400, eps_0 = 0.01, delta' = 1e-5: 0.959705 + 0.040201 = 0.999906."""
    k, e = 400, 0.01
    want = math.sqrt(2 * k * math.log(1 / DELTA)) * e + k * e * (math.exp(e) - 1)
    assert want == pytest.approx(0.999906, abs=1e-6)
    acc = make_accountant("advanced")
    for _ in range(k):
        acc.step(release(e))
    assert acc.spent(DELTA) == (pytest.approx(want, rel=1e-12), DELTA)


def test_advanced_accountant_falls_back_to_basic_composition_when_smaller():
    acc = make_accountant("advanced")
    for _ in range(3):
        acc.step(release(0.5))
    assert acc.spent(DELTA) == (pytest.approx(1.5), 0.0)


@pytest.mark.parametrize("eps,m", [(5, 11), (8, 11), (5, 200), (8, 200)])
def test_largest_eps0_meets_the_target_exactly_and_is_maximal(eps, m):
    for name in ("advanced", "zcdp"):
        acc = make_accountant(name)
        e0 = acc.largest_eps0(eps, DELTA, m)
        for _ in range(m):
            acc.step(release(e0))
        assert acc.spent(DELTA)[0] == pytest.approx(eps, rel=1e-9)
        bigger = make_accountant(name)
        for _ in range(m):
            bigger.step(release(e0 * 1.001))
        assert bigger.spent(DELTA)[0] > eps


def test_paper_eps0_overshoots_under_the_full_advanced_composition_for_many_releases():
    """eps / sqrt(2 M log(1/delta)) drops the k eps_0 (e^eps_0 - 1) term: the true total exceeds eps."""
    m = 400
    e0 = paper_eps0(5.0, m, DELTA)
    assert advanced_composition_eps([e0] * m, DELTA) > 5.0
    assert make_accountant("advanced").largest_eps0(5.0, DELTA, m) < e0


def test_standard_zcdp_conversion_is_rho_plus_two_sqrt_rho_log():
    rho = 0.37
    assert zcdp_to_dp(rho, DELTA, "standard") == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / DELTA)))


@pytest.mark.parametrize("rho", [0.01, 0.3, 1.0, 5.0])
def test_cks_conversion_agrees_with_opacus_rdp_conversion(rho):
    """rho-zCDP = (alpha, alpha rho)-RDP; Opacus converts RDP on a grid of orders (independent code)."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    orders = np.concatenate([np.linspace(1.01, 10, 2000), np.linspace(10, 2000, 4000)])
    eps_opacus, _ = get_privacy_spent(orders=orders, rdp=orders * rho, delta=DELTA)
    ours = zcdp_to_dp(rho, DELTA, "cks")
    assert ours <= eps_opacus + 1e-9
    assert ours == pytest.approx(eps_opacus, rel=2e-3)
    assert ours < zcdp_to_dp(rho, DELTA, "standard")


def test_zcdp_accountant_charges_eps_squared_over_8_for_the_exponential_mechanism():
    acc = make_accountant("zcdp")
    for _ in range(10):
        acc.step(release(0.6))
    assert acc.rho == pytest.approx(10 * 0.36 / 8)
    other = make_accountant("zcdp")
    other.step(release(0.6, mechanism="laplace"))
    assert other.rho == pytest.approx(0.18)


def exp_mech_log_probs(scores, beta):
    return torch.log_softmax(beta * scores, 0)


@pytest.mark.parametrize("seed", range(5))
def test_exponential_mechanism_is_eps0_dp_and_eps0_bounded_range_on_neighbouring_scores(seed):
    """Replace-one neighbours move every score by at most Delta: the log-probability ratio lies in
    [-eps_0, eps_0] (pure DP) and spans at most eps_0 over outcomes (bounded range)."""
    g = torch.Generator().manual_seed(seed)
    delta_s, eps0 = 3.0, 0.8
    beta = exp_mech_beta(eps0, delta_s)
    s = torch.randn(50, generator=g, dtype=torch.float64) * 10
    s2 = s + (torch.rand(50, generator=g, dtype=torch.float64) * 2 - 1) * delta_s
    loss = exp_mech_log_probs(s, beta) - exp_mech_log_probs(s2, beta)
    assert loss.abs().max() <= eps0 + 1e-12
    assert loss.max() - loss.min() <= eps0 + 1e-12


@pytest.mark.parametrize("alpha", [1.5, 2.0, 4.0, 10.0])
def test_bounded_range_mechanism_has_renyi_divergence_at_most_alpha_eps_squared_over_8(alpha):
    """Numerical check of eps-BR => eps^2/8-zCDP on the worst kind of neighbours (scores shifted by +-Delta)."""
    eps0, delta_s = 1.0, 1.0
    beta = exp_mech_beta(eps0, delta_s)
    worst = 0.0
    for k in range(1, 50):
        s = torch.zeros(50, dtype=torch.float64)
        s2 = s.clone()
        s2[:k] += delta_s
        s2[k:] -= delta_s
        p, q = exp_mech_log_probs(s, beta).exp(), exp_mech_log_probs(s2, beta).exp()
        d = float(torch.log((p ** alpha * q ** (1 - alpha)).sum()) / (alpha - 1))
        worst = max(worst, d)
    assert worst <= alpha * eps0 ** 2 / 8 + 1e-12


def test_zcdp_allows_a_larger_eps0_than_advanced_composition_at_eps_5_and_8():
    for eps in (5.0, 8.0):
        for m in (11, 23, 49):
            a = make_accountant("advanced").largest_eps0(eps, DELTA, m)
            z = make_accountant("zcdp").largest_eps0(eps, DELTA, m)
            assert z > 1.2 * a


def test_accountant_state_round_trips():
    acc = make_accountant("zcdp")
    acc.step(release(0.3))
    clone = make_accountant("zcdp")
    clone.load_state_dict(acc.state_dict())
    assert clone.spent(DELTA) == acc.spent(DELTA)
    adv = make_accountant("advanced")
    adv.step(release(0.3))
    clone = make_accountant("advanced")
    clone.load_state_dict(adv.state_dict())
    assert clone.spent(DELTA) == adv.spent(DELTA)
