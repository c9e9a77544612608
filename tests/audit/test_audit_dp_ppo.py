"""The DP-PPO audits (dppo/audit/dp_ppo.py): within their claim, with power, their statistic is the transcript's
privacy loss, and broken releases (noise calibrated for one release instead of the round's 2 x epochs,
clipping dropped) are caught."""
import copy
import math

import numpy as np
import pytest
import torch

from dppo.audit.dp_ppo import TranscriptScore, audit_dp_ppo, audit_dp_ppo_releases, build_round
from dppo.privacy.composed import ComposedGaussianSums


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("eps", [pytest.param(1.0, marks=pytest.mark.slow), 4.0])
def test_dp_ppo_releases_bound_is_below_claim_and_has_power(eps):
    n = 1_000_000 if eps < 2 else 400_000
    out = audit_dp_ppo_releases(eps, trials=n, seed=1, chunk=100_000)
    assert out.claimed_eps == pytest.approx(eps) and out.trials == n
    assert out.passed and out.eps_lb >= 0.5 * eps, (out.eps_lb, eps)


def test_dp_ppo_releases_with_an_unequal_actor_share_stay_within_the_claim_and_keep_power():
    """algo.actor_share=0.85: the actor's releases are less noisy, the critic's more; the composed round keeps
    its (eps, delta), and the bound still comes close to the claim (the canary is clipped in every release)."""
    out = audit_dp_ppo_releases(4.0, trials=400_000, seed=4, chunk=100_000, actor_share=0.85)
    assert out.claimed_eps == pytest.approx(4.0) and out.passed and out.eps_lb >= 2.0, out.eps_lb


def test_dp_ppo_round_of_the_learner_is_within_its_claim():
    out = audit_dp_ppo(2.0, trials=200, seed=1)
    assert out.claimed_eps == pytest.approx(2.0) and out.trials == 200 and out.passed


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_the_score_is_the_transcripts_privacy_loss_at_most_the_calibrated_mu():
    """Under D the adaptive round's log-likelihood ratio is N(mu^2/2, mu^2) (mean = variance / 2), with mu at
    most the calibrated sqrt(k)/z and close to it (the canary is clipped in all its k = 2 x epochs releases)."""
    learner, D, Dp = build_round(1.0, 1e-5, seed=2)
    w = TranscriptScore(learner.release, learner, 0, learner.round_targets(D),
                        learner.round_targets(Dp))
    learner.release = w
    init = copy.deepcopy(learner.state_dict())
    scores = []
    for trial in range(300):
        learner.load_state_dict(copy.deepcopy(init))
        learner.update(D, trial, [0, 1])
        scores.append(w.score)
    assert w.releases == 300 * 4        # 2 epochs x (actor, critic)
    mu = math.sqrt(4) / learner.release.noise_multiplier
    s = np.asarray(scores)
    assert 0.7 * mu < s.std() < 1.1 * mu
    assert s.mean() == pytest.approx(s.var() / 2, abs=4 * s.std() / math.sqrt(len(s)))


class _OneRelease(ComposedGaussianSums):
    """Broken on purpose: noise calibrated as if a user took part in a single release."""

    def __init__(self, privacy, parts):
        super().__init__(privacy, releases_per_user=1)
        self.parts = parts           # lets the round's k releases through, each at the one-release multiplier
        self.multipliers = {p: self.noise_multiplier for p in parts}


class _NoClip(ComposedGaussianSums):
    """Broken on purpose: the rows are summed without clipping."""

    def __init__(self, privacy, parts):
        super().__init__(privacy, parts=parts)

    def release_sum(self, per_user, users, clip, part=None):
        self._check(users, clip, part)
        return per_user.double().sum(0) + self.privacy.noise.gaussian(per_user.shape[1:], self.sigma(clip, part)), {}


@pytest.mark.parametrize("broken", [_OneRelease, _NoClip])
def test_broken_releases_are_caught(broken):
    out = audit_dp_ppo_releases(1.0, trials=400_000, seed=3, chunk=100_000, mechanism=broken)
    assert out.eps_lb > out.claimed_eps, (broken.__name__, out.eps_lb)
