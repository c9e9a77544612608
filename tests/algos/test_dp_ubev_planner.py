"""DP-UBEV's fast CPU planner computes the same floats as a straightforward array implementation.

``reference_plan`` below is the plain form of the induction in ``dppo/algos/dp_ubev.py``'s module
docstring: one NumPy expression per formula, fresh arrays, ``np.matmul`` for the next-state term.
The learner's ``PlanArrays`` (preallocated, Python floats for the elementwise steps of small S A)
must agree with it bit for bit, and so must the regret of a seeded run.
"""
import math

import numpy as np
import pytest
import torch

from dppo.algos import tabular_plan
from dppo.algos.dp_ubev import DPUBEV
from dppo.algos.tabular_plan import PlanArrays, Widths
from dppo.envs.tabular import random_mdp, riverswim
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant

UNVISITED = 1e30


def reference_plan(l, n, m, H, log_term, wd, private, floor=None):
    """Q [H, S, A] of DP-UBEV from released (l~, n~, m~) [Hc, S, A(, S)] (Hc = 1: pooled); ``floor``: the running
    lower counts of the earlier releases (updated in place to ``max(floor, n^ - E)``)."""
    Hc, S, A = n.shape
    n, l, m = n.reshape(Hc, S * A), l.reshape(Hc, S * A), m.reshape(Hc, S * A, S)
    if wd.mix:
        n = (1 - wd.mix) * n + wd.mix * m.sum(-1)
    n_lo = n - wd.E
    open_ = n_lo > 0
    if floor is not None:
        n_lo = np.maximum(n_lo, floor.reshape(Hc, S * A))
        floor[...] = n_lo.reshape(floor.shape)
        open_ = (n_lo > 0) & (n > 0)
    lo = np.where(open_, n_lo, 1.0)
    phi = np.where(open_, np.sqrt((2 * np.log(np.log(np.maximum(lo, math.e))) + log_term) / lo), UNVISITED)
    inv = np.where(open_, 1.0 / np.where(open_, n, 1.0), 0.0)
    aug = np.zeros((Hc, S * A, S + 3))
    aug[..., :S] = m * inv[..., None]
    aug[..., S] = phi
    r = l * inv
    if private:
        aug[..., S + 1] = wd.t_noise * inv
        aug[..., S + 2] = wd.t_round * inv
        rbar = np.minimum((np.maximum(l, 0.0) + wd.r_noise + wd.r_round) / lo, 1.0)
        r = r + (np.sqrt(wd.r_noise ** 2 + (wd.r_noise_n * rbar) ** 2) + wd.r_round + wd.r_round_n * rbar) * inv
    r = np.minimum(r + phi, 1.0)
    Q = np.empty((H, S, A))
    va = np.zeros(S + 3)
    c = vmax = 0.0
    for h in range(H - 1, -1, -1):
        hc = 0 if Hc == 1 else h
        va[S] = H - 1 - h
        Q[h] = (r[hc] + np.minimum(np.matmul(aug[hc], va) + c, vmax)).reshape(S, A)
        V = Q[h].max(-1)
        vmax, c = float(V.max()), float(V.min())
        W = V - c
        w = vmax - c
        ww = float(np.dot(W, W))
        va = np.concatenate([W, [0.0, math.sqrt(max(ww, ww - 2 * w * wd.mix * float(np.sum(W)) + w * w * wd.s2)), w]])
    return Q


def _random_counts(rng, S, A, Hc, scale, integer):
    n = rng.normal(scale, scale, (Hc, S, A))
    l = rng.normal(scale / 2, scale, (Hc, S, A))
    m = rng.normal(scale / S, scale, (Hc, S, A, S))
    return (np.round(l), np.round(n), np.round(m)) if integer else (l, n, m)


@pytest.mark.parametrize("small", [True, False])
def test_planner_matches_reference_bit_for_bit_on_random_counts(small):
    """Both induction paths (scalar for small S A, arrays otherwise) give the reference's exact bytes."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        S, A, H = int(rng.integers(1, 8)), int(rng.integers(1, 5)), int(rng.integers(1, 25))
        Hc = 1 if rng.random() < 0.5 else H
        scale = 10 ** rng.uniform(0, 5)
        l, n, m = _random_counts(rng, S, A, Hc, scale, integer=rng.random() < 0.3)
        private = bool(rng.random() < 0.8)
        if private:
            mix = float(rng.choice([0.0, 1.0 / (S + 1), rng.uniform(0, 1)]))
            wd = Widths(*(float(rng.uniform(0, hi)) for hi in (scale, scale, scale, 3, 3, scale, 3)), mix=mix,
                        s2=(1 - mix) ** 2 + mix * mix * S)
        else:
            wd = Widths()
        args = (float(rng.uniform(1, 10)), wd, private)
        planner = PlanArrays(l, n, m, H)
        planner.small = small
        want = reference_plan(l, n, m, H, *args)
        for _ in range(2):                       # twice: the work arrays are reused
            assert planner.plan(*args).tobytes() == want.tobytes()
        if private:                              # with the running lower count of earlier releases
            floor = n.reshape(Hc, S, A) + rng.normal(0, scale, (Hc, S, A))
            floor_ref = floor.copy()
            want = reference_plan(l, n, m, H, *args, floor_ref)
            assert planner.plan(*args, floor).tobytes() == want.tobytes()
            assert floor.tobytes() == floor_ref.tobytes()


def _ctx(eps):
    return PrivacyContext(eps, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(5, secure=False))


@pytest.mark.parametrize("kw", [dict(mdp="riverswim"), dict(mdp="riverswim", counter="gaussian_tree", pool_steps=False),
                                dict(mdp="random", pool_cap=None), dict(mdp="riverswim", block_growth=None),
                                dict(mdp="riverswim", counter="laplace_tree")])
def test_seeded_run_regret_equals_the_reference_planner_run(kw, monkeypatch):
    """A seeded 600-episode run: the fast planner's per-episode regret equals, float for float, the
    regret of the same run planned by ``reference_plan`` (the learner's policies are argmaxes of Q)."""
    kw = dict(kw)
    mdp = riverswim(8) if kw.pop("mdp") == "riverswim" else random_mdp(S=5, A=3, H=6, seed=1)

    def run():
        learner = DPUBEV(mdp, privacy=_ctx(2.0), seed=4, episodes=600, episodes_per_round=200, **kw)
        for r in range(learner.num_rounds):
            learner.train_round(r)
        return learner.episode_regret.clone()

    fast = run()
    monkeypatch.setattr(tabular_plan.PlanArrays, "plan", lambda self, *a: reference_plan(self.l, self.n, self.m, self.H, *a))
    ref = run()
    assert torch.isfinite(fast).all()
    assert torch.equal(fast, ref)
