"""The multi-pass DP-PPO audit (dppo/audit/multi_pass_ppo.py): within the accountant's claim for one round, with
power, on the worst-case canary (one minibatch, and two), and two broken releases are caught (noise calibrated for
one release instead of the round's 2 x epochs; a sampler that includes everyone while the accountant counts on
subsampling)."""
import pytest
import torch

from dppo.audit.multi_pass_ppo import CANARY, audit_multi_pass_dp_ppo
from dppo.privacy.composed import ComposedGaussianSums, Poisson


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("accountant", ["rdp", pytest.param("prv", marks=pytest.mark.slow)])
def test_multi_pass_dp_ppo_bound_is_below_the_accountants_claim(accountant):
    out = audit_multi_pass_dp_ppo(1.0, trials=100_000, seed=1, accountant=accountant)
    assert out.mechanism == f"multi_pass_dp_ppo ({accountant})" and out.trials == 100_000
    assert out.claimed_eps == pytest.approx(1.0, abs=0.01) and out.delta == 1e-5
    assert out.passed, (out.eps_lb, out.claimed_eps)


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_multi_pass_dp_ppo_bound_has_power():
    out = audit_multi_pass_dp_ppo(4.0, trials=400_000, seed=4, chunk=100_000, accountant="prv")
    assert 0.5 * out.claimed_eps <= out.eps_lb <= out.claimed_eps, (out.eps_lb, out.claimed_eps)


def test_two_minibatches_bound_is_below_the_accountants_claim():
    """algo.minibatches=2: each user's minibatch a public draw of its own, the canary in one per epoch; the claim is
    the one of minibatches=1 (the same round multiplier)."""
    out = audit_multi_pass_dp_ppo(1.0, trials=100_000, seed=1, minibatches=2)
    assert out.mechanism == "multi_pass_dp_ppo (rdp, minibatches=2)"
    assert out.claimed_eps == pytest.approx(1.0, abs=0.01) and out.passed, (out.eps_lb, out.claimed_eps)


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_two_minibatches_bound_has_power():
    out = audit_multi_pass_dp_ppo(4.0, trials=400_000, seed=4, chunk=100_000, accountant="prv", minibatches=2)
    assert 0.5 * out.claimed_eps <= out.eps_lb <= out.claimed_eps, (out.eps_lb, out.claimed_eps)


def test_the_canary_is_clipped_in_every_release_it_takes_part_in():
    """Its actor and critic vectors exceed the clip norms, so each of its releases moves by exactly C (add/remove
    worst case) and the included transcript's privacy loss has mu = 1 / z_round, the accounted multiplier."""
    from dppo.audit.dp_ppo import build_round
    from dppo.data.sampler import PoissonUserSampler
    from dppo.privacy.accountants import make_accountant
    from dppo.privacy.context import PrivacyContext

    privacy = PrivacyContext(1.0, 1e-5, accountant=make_accountant("rdp"), multi_pass=True, population_size=8)
    learner, batch, _ = build_round(1.0, 1e-5, users=4, minibatches=1, privacy=privacy,
                                    sampler=PoissonUserSampler(4, 8), rounds=1)
    g_actor, g_critic, _ = learner.minibatch_gradients(learner.round_targets(batch), torch.arange(4))
    assert float(g_actor[CANARY].norm()) > learner.clip and float(g_critic[CANARY].norm()) > learner.critic_clip
    release = learner.release
    assert isinstance(release.sampling, Poisson)
    mu_sq = sum(kp / release.multipliers[p] ** 2 for p, (kp, _) in release.parts.items())
    assert mu_sq == pytest.approx(1.0 / release.noise_multiplier ** 2)


class _OneRelease(ComposedGaussianSums):
    """Broken on purpose: every release at the round's multiplier, as if a user took part in a single release."""

    def __init__(self, privacy, parts, sampler):
        super().__init__(privacy, parts=parts, sampling=Poisson(sampler.sample_rate, sampler.population_size, 1))
        self.multipliers = {p: self.noise_multiplier for p in parts}


def test_noise_calibrated_for_one_release_is_caught():
    out = audit_multi_pass_dp_ppo(1.0, trials=100_000, seed=3, mechanism=_OneRelease)
    assert out.eps_lb > out.claimed_eps, out.eps_lb


def test_a_round_without_real_subsampling_is_caught(monkeypatch):
    """A sampler that includes every user while the accountant counts on q = 2/16 amplification."""
    from dppo.data.sampler import PoissonUserSampler

    monkeypatch.setattr(PoissonUserSampler, "next_round", lambda self: list(range(self.population_size)))
    out = audit_multi_pass_dp_ppo(1.0, trials=200_000, seed=3, users=2, population=16)
    assert out.eps_lb > out.claimed_eps, out.eps_lb
