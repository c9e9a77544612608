"""The GDP accountant: exact (eps, delta) of composed Gaussian releases, and the counters calibrated with it."""
import math

import numpy as np
import pytest
from scipy import integrate, stats

from dppo.errors import ConfigError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant
from dppo.privacy.accountants.gdp import gdp_to_dp
from dppo.privacy.accountants.zcdp import rho_for_target
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.tabular_counters import TabularLayout, build_counter, counter_kappa, record_counter_releases


def _hockey_stick(mu: float, eps: float) -> float:
    """delta(eps) of N(mu, 1) against N(0, 1) by numerical integration of ``max(0, p - e^eps q)``: an
    independent computation of the Gaussian mechanism's privacy profile (no closed form used)."""
    f = lambda x: max(0.0, stats.norm.pdf(x, mu) - math.exp(eps) * stats.norm.pdf(x))
    x0 = eps / mu + mu / 2                            # p > e^eps q exactly for x > x0
    return integrate.quad(f, x0, x0 + 40, epsabs=1e-15, epsrel=1e-10, limit=200)[0]


@pytest.mark.parametrize("mu", [0.3, 1.0, 2.5, 6.0])
def test_gdp_conversion_is_the_gaussian_privacy_profile(mu):
    """gdp_to_dp(mu, delta) = the eps at which the hockey-stick divergence of N(mu,1) vs N(0,1) equals delta."""
    for delta in (1e-3, 1e-5, 1e-8):
        eps = gdp_to_dp(mu, delta)
        if eps == 0.0:
            assert _hockey_stick(mu, 0.0) <= delta
            continue
        assert _hockey_stick(mu, eps) == pytest.approx(delta, rel=1e-6)


def test_composition_adds_mu_squared_and_a_calibrated_release_reports_its_target():
    """Three Gaussian entries (the counter's three statistic sets) compose to mu = sqrt(sum mu_i^2), exactly the
    one Gaussian mechanism with the joint sensitivity; a release calibrated by the analytic Gaussian mechanism
    reports its own (eps, delta); a pure-DP entry is refused."""
    acc = make_accountant("gdp")
    parts = [(1.0, 2.0), (0.5, 2.0), (2.0, 1.5)]           # (sensitivity, sigma)
    for sens, sigma in parts:
        acc.step({"mechanism": "gaussian_opt_counter", "sigma": sigma, "sensitivity": sens})
    mu = math.sqrt(sum((s / g) ** 2 for s, g in parts))
    assert acc.mu == pytest.approx(mu, rel=1e-12)
    assert acc.spent(1e-5)[0] == pytest.approx(gdp_to_dp(mu, 1e-5), rel=1e-12)
    for eps in (0.5, 1.0, 5.0, 10.0):
        one = make_accountant("gdp")
        one.step({"mechanism": "gaussian", "sigma": analytic_gaussian_sigma(eps, 1e-5, 3.0), "sensitivity": 3.0})
        assert one.spent(1e-5)[0] == pytest.approx(eps, rel=1e-9)
    with pytest.raises(ConfigError):
        make_accountant("gdp").step({"mechanism": "laplace", "eps": 1.0, "delta": 0.0, "scale": 1.0})


@pytest.mark.parametrize("kind,steps", [("gaussian_sqrt", 1000), ("gaussian_opt", 150), ("gaussian_tree", 1000)])
def test_counter_calibrated_for_the_gdp_accountant_spends_exactly_the_target(kind, steps):
    """With the gdp accountant a Gaussian counter's node noise is the analytic Gaussian mechanism's for the joint
    sensitivity Delta_c kappa (less than the zCDP calibration), and its ledger entries spend exactly (eps, delta)."""
    layout = TabularLayout(3, 2, 4, pooled=True, pool_cap=1, set_noise=(2.0, 2.0, 1.0))
    for eps in (1.0, 5.0):
        ctx = PrivacyContext(eps, 1e-5, accountant=make_accountant("gdp"), noise=NoiseSource(0, secure=False))
        c = build_counter(kind, layout, steps, ctx)
        joint = layout.weighted_l2_sensitivity * counter_kappa(kind, steps)
        assert c.sigma == pytest.approx(analytic_gaussian_sigma(eps, 1e-5, joint), rel=1e-12)
        assert c.sigma < joint / math.sqrt(2 * rho_for_target(eps, 1e-5))
        record_counter_releases(ctx, c, layout, users=steps)
        spent, delta = ctx.spent()
        assert delta == 1e-5 and spent == pytest.approx(eps, rel=1e-9) and spent <= eps * (1 + 1e-9)
        mus = np.array([e["sensitivity"] / e["sigma"] for e in ctx.ledger.entries])
        assert math.sqrt((mus ** 2).sum()) == pytest.approx(joint / c.sigma, rel=1e-12)
