"""The privacy audit: its statistics, every mechanism within its claim, power, and broken variants caught.

Fast tests (default suite) use the vectorized audits with enough trials for the power and
broken-variant checks of the Gaussian mechanisms, and small smoke audits of the others; the full
audit of every mechanism (the numbers of runs/reference/audit.md) is ``pytest -m slow``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom, norm

from dppo.audit import eps_from_rates, threshold_audit
from dppo.audit.__main__ import main
from dppo.audit.bounds import clopper_pearson_upper
from dppo.audit.dp_pg import audit_dp_pg
from dppo.audit.gfa import audit_gfa
from dppo.audit.multi_pass import audit_multi_pass_dp_pg
from dppo.audit.oracle_rounds import audit_oracle_round
from dppo.audit.oracles import audit_dp_gd, audit_exp_mech, audit_ssp
from dppo.audit.run import power_checks, run_suite, suite
from dppo.audit.gaussian_counter import audit_gaussian_counter
from dppo.audit.tree_counter import audit_tree_counter
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.composed import ComposedGaussianSums
from dppo.privacy.gaussian_counter import GaussianTreeCounter
from dppo.privacy.tree_counter import TreeCounter


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


# ---- statistics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("k,n,level", [(0, 100, 0.975), (7, 1000, 0.975), (500, 1000, 0.95), (99, 100, 0.99)])
def test_clopper_pearson_upper_solves_the_binomial_tail_equation(k, n, level):
    p = float(clopper_pearson_upper(k, n, level))
    assert binom.cdf(k, n, p) == pytest.approx(1 - level, rel=1e-6)   # P[Bin(n, p_hi) <= k] = 1 - level
    assert p > k / n


def test_clopper_pearson_upper_is_one_when_every_trial_succeeds():
    assert float(clopper_pearson_upper(50, 50, 0.975)) == 1.0


def test_eps_from_rates_is_the_larger_of_the_two_dp_inequalities():
    assert float(eps_from_rates(0.01, 0.5, 0.0)) == pytest.approx(math.log(0.5 / 0.01))
    assert float(eps_from_rates(0.5, 0.01, 1e-3)) == pytest.approx(math.log((0.5 - 1e-3) / 0.01))
    assert float(eps_from_rates(0.5, 0.5, 0.0)) == 0.0


def test_threshold_audit_of_identical_distributions_gives_no_privacy_loss():
    rng = np.random.default_rng(0)
    out = threshold_audit(rng.normal(size=200_000), rng.normal(size=200_000), 1e-5)
    assert out.eps_lb < 0.1


def test_threshold_audit_of_calibrated_gaussians_stays_below_and_near_eps():
    """N(0, s^2) vs N(Delta, s^2) with s from the analytic Gaussian mechanism at eps = 2: the bound is
    at most eps (and far from 0); the 2x-too-small s must give a bound above eps."""
    rng = np.random.default_rng(1)
    s = analytic_gaussian_sigma(2.0, 1e-5, 1.0)
    good = threshold_audit(rng.normal(0, s, 1_000_000), rng.normal(1.0, s, 1_000_000), 1e-5)
    bad = threshold_audit(rng.normal(0, s / 2, 1_000_000), rng.normal(1.0, s / 2, 1_000_000), 1e-5)
    assert 1.0 < good.eps_lb <= 2.0
    assert bad.eps_lb > 2.0
    # the evaluation counts are consistent with the Gaussian tails at the chosen threshold
    t = good.sign * good.threshold
    expected_fp = norm.sf(good.threshold / s) if good.sign == 1 else norm.cdf(t / s)
    assert good.false_pos / good.n_null == pytest.approx(expected_fp, abs=6 * math.sqrt(expected_fp / good.n_null) + 1e-5)


# ---- Gaussian mechanisms: within claim, power, broken variants -------------------------------------
@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_dp_pg_round_bound_is_below_claim_and_has_power(eps):
    out = audit_dp_pg(eps, trials=1_000_000 if eps < 2 else 400_000, seed=int(eps))
    assert out.claimed_eps == eps and out.delta == 1e-5
    assert 0.5 * eps <= out.eps_lb <= eps


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_dp_rebel_round_bound_is_below_claim_and_has_power(eps):
    out = audit_oracle_round(eps, algo="dp_rebel", trials=1_000_000, seed=3 + int(eps))
    assert 0.5 * eps <= out.eps_lb <= eps


def _dp_npg_round(eps, **kwargs):
    return audit_oracle_round(eps, algo="dp_npg", **kwargs)


@pytest.mark.parametrize("eps", [1.0, 4.0])
@pytest.mark.parametrize("run,trials", [(audit_ssp, 1_000_000), (audit_dp_gd, 400_000), (_dp_npg_round, 1_000_000)])
def test_oracle_bound_is_below_claim_and_has_power(run, trials, eps):
    """The oracles' stacked audits (ssp with a noisy Gram, 20-step dp_gd, DP-NPG's public-Gram ssp)."""
    out = run(eps, trials=trials, seed=20 + int(eps))
    assert out.claimed_eps == eps
    assert 0.5 * eps <= out.eps_lb <= eps


def test_ssp_calibrated_to_the_separate_bounds_halved_is_caught(monkeypatch):
    """An SSP whose stds are half what the joint sensitivity needs must be caught at eps = 1."""
    import dataclasses

    from dppo.privacy import calibration

    def halved(*a, **k):
        cal = calibration.ssp_calibration(*a, **k)
        return dataclasses.replace(cal, sigma_gram=0.5 * cal.sigma_gram, sigma_moment=0.5 * cal.sigma_moment)

    monkeypatch.setattr("dppo.privacy.mechanisms.ssp_calibration", halved)
    out = audit_ssp(1.0, trials=1_000_000, seed=9)
    assert out.claimed_eps == 1.0 and out.eps_lb > 1.0


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_multi_pass_release_bound_is_below_claim_and_has_power():
    out = audit_multi_pass_dp_pg(1.0, trials=1_000_000, seed=4, accountant="prv")
    assert out.claimed_eps == pytest.approx(1.0, abs=0.01) and out.delta == 1e-5
    assert 0.5 * out.claimed_eps <= out.eps_lb <= out.claimed_eps


def test_multi_pass_release_without_real_subsampling_is_caught(monkeypatch):
    """A sampler that includes every user while the accountant counts on q = 1/8 amplification."""
    from dppo.data.sampler import PoissonUserSampler

    monkeypatch.setattr(PoissonUserSampler, "next_round", lambda self: list(range(self.population_size)))
    out = audit_multi_pass_dp_pg(1.0, trials=400_000, seed=4, accountant="rdp", users=1, population=8)
    assert out.eps_lb > out.claimed_eps


class _HalfNoise(ComposedGaussianSums):
    def sigma(self, clip, part=None):
        return 0.5 * super().sigma(clip, part)


class _SensitivityC(ComposedGaussianSums):
    def sensitivity(self, clip, part=None):
        return float(clip)

    def sigma(self, clip, part=None):   # the noise of the wrong sensitivity C
        return self._multiplier(part) * self.sensitivity(clip, part)


def _no_clipping(per_user, max_norm):
    return per_user, per_user.norm(dim=1)


@pytest.mark.parametrize("variant", ["clipping_disabled", "noise_halved", "sensitivity_C"])
def test_dp_pg_broken_variant_is_caught(variant, monkeypatch):
    cls = {"noise_halved": _HalfNoise, "sensitivity_C": _SensitivityC}.get(variant)
    release = None if cls is None else (lambda privacy, clip: cls(privacy, parts={"actor": (1, 1.0)}))
    if variant == "clipping_disabled":
        monkeypatch.setattr("dppo.privacy.composed.clip_per_user", _no_clipping)
    out = audit_dp_pg(1.0, trials=400_000, seed=11, release=release)
    assert out.claimed_eps == 1.0
    assert out.eps_lb > 1.0


# ---- the other mechanisms: small smoke audits, and the tree counter's broken variant ------------------
@pytest.mark.parametrize("run,trials", [(audit_ssp, 1_000), (audit_dp_gd, 200), (audit_exp_mech, 2_000),
                                        (audit_gfa, 2_000), (audit_tree_counter, 100_000), (_dp_npg_round, 2_000)])
def test_mechanism_bound_is_below_claim_small(run, trials):
    out = run(4.0, trials=trials, seed=5)
    assert out.trials >= 0.9 * trials
    assert out.eps_lb <= out.claimed_eps


class _LevelZeroNoiseDropped(TreeCounter):
    def _next_noise(self):
        z = super()._next_noise()
        t = int(self.t)
        return z * 0.0 if (t & -t).bit_length() - 1 == 0 else z


def test_tree_counter_with_a_level_without_noise_is_caught():
    out = audit_tree_counter(1.0, trials=100_000, seed=2, counter_cls=_LevelZeroNoiseDropped)
    assert out.eps_lb > 1.0


def test_tree_counter_bound_has_power():
    out = audit_tree_counter(1.0, trials=100_000, seed=3)
    assert 0.5 <= out.eps_lb <= 1.0


@pytest.mark.parametrize("kind", ["gaussian_sqrt", "gaussian_tree"])
def test_gaussian_counter_within_claim_on_raw_float_bits(kind):
    out = audit_gaussian_counter(1.0, trials=60_000, kind=kind, float_bits=True, seed=6)
    assert out.eps_lb <= out.claimed_eps


@pytest.mark.parametrize("kind", ["gaussian_sqrt", "gaussian_tree"])
def test_gaussian_counter_with_halved_noise_is_caught(kind):
    out = audit_gaussian_counter(1.0, trials=300_000, kind=kind, sigma_scale=0.5, seed=7, levels=4)
    assert out.eps_lb > out.claimed_eps


@pytest.mark.parametrize("kind", ["gaussian_sqrt", "gaussian_tree"])
def test_gaussian_counter_bound_has_power(kind):
    out = audit_gaussian_counter(4.0, trials=100_000, kind=kind, seed=9)
    assert 0.5 * out.claimed_eps <= out.eps_lb <= out.claimed_eps


class _GaussianLevelZeroDropped(GaussianTreeCounter):
    def _next_noise(self, out):
        z = super()._next_noise(out)
        if int(self._views()["t"]) & 1:                               # leaf nodes (level 0) without noise
            z *= 0.0
        return z


def test_gaussian_tree_counter_with_a_level_without_noise_is_caught():
    out = audit_gaussian_counter(1.0, trials=20_000, kind="gaussian_tree", counter_cls=_GaussianLevelZeroDropped,
                                 seed=8, first_release_only=True)
    assert out.eps_lb > out.claimed_eps
    ok = audit_gaussian_counter(1.0, trials=20_000, kind="gaussian_tree", seed=8, first_release_only=True)
    assert ok.eps_lb <= ok.claimed_eps


# ---- entry point ----------------------------------------------------------------------------------
def test_module_entry_prints_the_table_and_exits_zero(capsys):
    assert main(["--trials", "20000", "--only", "dp_pg_round"]) == 0
    out = capsys.readouterr().out
    assert "| dp_pg_round |" in out and "Power checks" in out


def test_module_entry_rejects_an_unknown_mechanism(capsys):
    assert main(["--only", "nope"]) == 2
    assert "unknown mechanism" in capsys.readouterr().err


# ---- full audit ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_audit_every_mechanism_within_claim_and_gaussian_power():
    rows = run_suite(fast=False)
    names = {r.mechanism.split(" ")[0] for r in rows}
    assert {s.name for s in suite()} - {"tree_counter_float_bits", "multi_pass_dp_pg_prv", "multi_pass_dp_ppo_prv",
                                        "gaussian_sqrt_counter_float_bits", "correlated_noise",
                                        "correlated_noise_E6"} <= names | {"gfa_exponential"}
    assert {"multi_pass_dp_pg (rdp)", "multi_pass_dp_pg (prv)", "multi_pass_dp_ppo (rdp)",
            "multi_pass_dp_ppo (prv)"} <= {r.mechanism for r in rows}
    bad = [(r.mechanism, r.claimed_eps, r.eps_lb) for r in rows if not r.passed]
    assert not bad, f"eps_LB above the claimed eps (privacy bug): {bad}"
    checks = power_checks(rows)
    assert {m.split(" ")[0] for m, *_ in checks} == {"dp_pg_round", "dp_ppo_releases", "dp_ppo_releases_actor_share", "dp_rebel_round", "dp_npg_round", "ssp", "dp_gd",
                                                     "multi_pass_dp_pg", "multi_pass_dp_ppo", "gaussian_sqrt_counter",
                                                     "gaussian_tree_counter", "correlated_noise_banded_b4_E1",
                                                     "correlated_noise_banded_b4_E6"}
    assert all(ok for *_, ok in checks), checks


@pytest.mark.slow
def test_exp_mech_oracle_with_beta_doubled_is_caught(monkeypatch):
    from dppo.privacy.calibration import exp_mech_beta

    monkeypatch.setattr("dppo.privacy.mechanisms.exp_mech_beta", lambda eps, sens: 2 * exp_mech_beta(eps, sens))
    out = audit_exp_mech(1.0, trials=100_000, seed=7)
    assert out.claimed_eps == 1.0 and out.eps_lb > 1.0


@pytest.mark.slow
def test_gfa_exponential_mechanism_with_beta_doubled_is_caught():
    out = audit_gfa(1.0, trials=200_000, seed=7, beta_factor=2.0)
    assert out.claimed_eps == 1.0 and out.eps_lb > 1.0
