"""DP-UBEV: reduces to UBEV on exact counts, plans on released counts only, privacy bookkeeping, CLI, resume."""
import json
import math

import numpy as np
import pytest
import torch

from dppo.algos.dp_ubev import DPUBEV
from dppo.algos.ucb import UBEV
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.tabular import random_mdp, riverswim
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant
from tests.cli_helpers import run_cli


def _ctx(eps, seed=0):
    return PrivacyContext(eps, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(seed))


def _run(learner):
    for r in range(learner.num_rounds):
        learner.train_round(r)
    return learner


def test_exact_counts_per_step_is_ubev():
    """eps=null, pool_steps=false, a release after every episode: the same Q as UBEV on the same counts and
    the same episodes."""
    mdp = random_mdp(S=4, A=3, H=5, seed=2)
    kw = dict(seed=3, episodes=400, episodes_per_round=100)
    a = _run(UBEV(mdp, privacy=_ctx(None), **kw))
    b = _run(DPUBEV(mdp, privacy=_ctx(None), pool_steps=False, block_growth=None, **kw))
    assert np.allclose(a.q_values(), b.q_values(), rtol=1e-12, atol=1e-12)
    assert torch.allclose(a.episode_regret, b.episode_regret, rtol=1e-12, atol=1e-12)


def test_plan_is_a_post_processing_of_the_released_counts():
    L = DPUBEV(riverswim(6), privacy=_ctx(1.0), seed=0, episodes=300, episodes_per_round=100)
    L.train_round(0)
    q = L.q_values()
    L.stats.counts.copy_(torch.rand_like(L.stats.counts) * 1e6)     # corrupt the exact counts
    assert np.array_equal(q, L.q_values())


@pytest.mark.parametrize("counter", ["gaussian", "gaussian_tree", "laplace_tree"])
@pytest.mark.parametrize("pool", [True, False])
def test_ledger_and_epsilon_follow_the_counter(counter, pool):
    ctx = _ctx(2.0)
    L = _run(DPUBEV(riverswim(4), privacy=ctx, seed=1, episodes=200, episodes_per_round=100,
                    sampler=OnePassUserSampler(100, seed=1), counter=counter, pool_steps=pool))
    entries = ctx.ledger.entries
    assert len(entries) == 3 and {e["counter_set"] for e in entries} == {"rewards", "visits", "transitions"}
    assert all(e["adjacency"] == "replace_one" for e in entries)
    assert ctx.spent()[0] == pytest.approx(2.0, rel=1e-9)
    assert len(L.sampler.used) == 200
    s = L.summary()
    assert s["cumulative_regret"] > 0 and 0 <= s["gate_open_fraction"] <= 1 and s["count_error_bound"] > 0


def test_error_bound_uses_the_exact_release_std_and_the_union_over_used_releases():
    from dppo.privacy.gaussian_counter import GRID, chi_union_quantile, gaussian_union_quantile
    from dppo.privacy.tabular_counters import release_schedule

    L = DPUBEV(riverswim(5), privacy=_ctx(1.0), seed=0, episodes=1000, episodes_per_round=500, set_noise=None)
    ends = release_schedule(1000, 1.05)
    assert L.stats.capacity == len(ends) and L.pair_releases == L.S * L.A * len(ends)
    L.train_round(0)
    steps = sum(e <= 500 for e in ends)
    assert L.stats.steps_done == steps
    N, S = L.S * L.A * len(ends), L.S
    z = gaussian_union_quantile(L.beta / 3, N)
    std = L.stats.release_std(steps)
    s = math.sqrt(S / (S + 1))                      # std factor of n^ = (S n~ + sum m~) / (S + 1)
    assert L.mix == 1 / (S + 1)
    assert L.count_error_bound() == pytest.approx(z * s * std + GRID / 2 * (2 * S / (S + 1)))
    wd = L.widths()
    assert wd.r_noise == pytest.approx(chi_union_quantile(L.beta / 3, N, 2) * std)
    assert wd.r_noise_n == pytest.approx(wd.r_noise * s) and wd.s2 == pytest.approx(s * s)
    assert wd.t_noise == pytest.approx(chi_union_quantile(L.beta / 3, N, S + 1) * std)
    assert (wd.r_round, wd.t_round) == (GRID / 2, GRID / 2 * (2 * S + 1))


def test_optimized_counter_is_tuned_for_the_releases_past_their_gate():
    """counter=gaussian with block releases runs the optimized factorization, weighted 1 on the releases whose
    block ends after counter_focus x E_j (E_j: the gate under the square-root factorization, read off a
    learner that runs it) and 1e-3 before; on those releases its error is lower at the same budget."""
    kw = dict(privacy=_ctx(1.0), seed=0, episodes=5000, episodes_per_round=1000)
    ref = DPUBEV(riverswim(5), counter="gaussian_sqrt", **kw)
    L = DPUBEV(riverswim(5), counter="gaussian", counter_focus=5.0, **kw)
    assert L.counter_kind == "gaussian_opt" and L.stats.capacity == ref.stats.capacity
    s, _ = ref._visit_std_factor()
    B = ref.stats.capacity
    E = np.array([ref.z * s * ref.stats.release_std(j) for j in range(1, B + 1)])
    focus = np.asarray(ref.release_ends) > 5.0 * E
    assert 0 < focus.sum() < B
    assert L.stats.row_weights == tuple(np.where(focus, 1.0, 1e-3).tolist())
    std = lambda c: np.array([c.release_std(j) for j in range(1, B + 1)])
    assert std(L.stats)[focus].mean() < 0.95 * std(ref.stats)[focus].mean()
    assert DPUBEV(riverswim(5), counter_focus=None, **kw).stats.row_weights is None


def test_unequal_set_noise_widths_use_each_sets_std_and_inverse_variance_visits():
    from dppo.privacy.gaussian_counter import GRID, chi_union_quantile, gaussian_union_quantile

    cl, cn, cm = 2.0, 3.0, 0.5
    L = DPUBEV(riverswim(5), privacy=_ctx(1.0), seed=0, episodes=1000, episodes_per_round=500,
               set_noise=(cl, cn, cm))
    L.train_round(0)
    S, N, std = L.S, L.pair_releases, L.stats.release_std()
    b = cn ** 2 / (cn ** 2 + S * cm ** 2)
    s = math.sqrt((1 - b) ** 2 * cn ** 2 + b * b * S * cm ** 2)        # std of n^ / sigma_t
    assert L.mix == pytest.approx(b) and s < min(cn, math.sqrt(S) * cm)  # better than either estimate alone
    wd = L.widths()
    assert wd.E == pytest.approx(gaussian_union_quantile(L.beta / 3, N) * s * std + GRID / 2 * ((1 - b) + b * S))
    assert wd.r_noise == pytest.approx(chi_union_quantile(L.beta / 3, N, 2) * cl * std)
    assert wd.r_noise_n == pytest.approx(chi_union_quantile(L.beta / 3, N, 2) * s * std)
    assert wd.t_noise == pytest.approx(chi_union_quantile(L.beta / 3, N, S + 1) * cm * std)
    assert wd.s2 == pytest.approx((s / cm) ** 2)


@pytest.mark.parametrize("counter,set_noise", [("gaussian", None), ("gaussian_tree", None), ("laplace_tree", None),
                                               ("gaussian", (2.0, 3.0, 1.0))])
def test_widths_cover_the_noise_actually_added_at_every_release(counter, set_noise):
    """On the noise event the module docstring's three bounds hold for every pair at every release; simulated
    (seeded noise, the learner's own releases, 5 seeds): never violated, and the widths of the plan bound the
    actual gap between the private estimates and the twin's (l/n, m.W/n for random W >= 0)."""
    rng = np.random.default_rng(0)
    for seed in range(5):
        L = DPUBEV(riverswim(5), privacy=_ctx(5.0, seed), seed=seed, episodes=3000, episodes_per_round=1000,
                   counter=counter, set_noise=set_noise)
        seen = 0
        for r in range(L.num_rounds):
            L.train_round(r)
            with np.errstate(divide="ignore", invalid="ignore"):      # closed pairs are not compared
                S = L.S
                l, n, m = (x.reshape(S * L.A, -1) for x in L.released_stats())
                k = L.layout.sa
                ex = L.stats.counts.numpy()
                el, en, em = ex[:k].reshape(-1, 1), ex[k:2 * k].reshape(-1, 1), ex[2 * k:].reshape(k, S)
                wd = L.widths()
                nh = L.visits_estimate().reshape(-1, 1)            # n^, what the plan divides by
                assert (np.abs(nh - en) <= wd.E).all()
                ok = (nh[:, 0] > wd.E) & (en[:, 0] > 0)
                lo, nh = nh[:, 0] - wd.E, nh[:, 0]
                for W in (rng.uniform(0, 3, S), np.zeros(S), np.eye(S)[0] * 4.0, np.ones(S)):
                    w, ww = W.max(), W @ W
                    gap = np.abs(m @ W / nh - em @ W / np.maximum(en[:, 0], 1))
                    norm = math.sqrt(max(ww, ww - 2 * w * wd.mix * W.sum() + w * w * wd.s2))
                    width = (wd.t_noise * norm + wd.t_round * w) / nh
                    assert (gap[ok] <= width[ok] + 1e-9).all()
                rbar = np.minimum((np.maximum(l[:, 0], 0) + wd.r_noise + wd.r_round) / lo, 1.0)
                gap = np.abs(l[:, 0] / nh - el[:, 0] / np.maximum(en[:, 0], 1))
                width = (np.sqrt(wd.r_noise ** 2 + (wd.r_noise_n * rbar) ** 2) + wd.r_round + wd.r_round_n * rbar) / nh
                assert (gap[ok] <= width[ok] + 1e-9).all()
                # the running lower count (max over the planned releases of n^ - E) stays below the exact count,
                # so the plan's phi(lower count) and rbar stay on the optimistic side
                floor = L.count_floor.numpy().reshape(-1)
                assert (floor <= en[:, 0] + 1e-9).all()
                lo_run = np.maximum(lo, floor)
                rbar = np.minimum((np.maximum(l[:, 0], 0) + wd.r_noise + wd.r_round) / np.maximum(lo_run, 1e-300), 1.0)
                assert (el[:, 0][ok] <= rbar[ok] * en[:, 0][ok] + 1e-9).all()
            seen += int(ok.sum())
        assert seen > 0


def test_a_block_is_planned_once_and_each_user_enters_one_counter_step(monkeypatch):
    from dppo.privacy.tabular_counters import release_schedule

    calls = []
    L = DPUBEV(riverswim(4), privacy=_ctx(2.0), seed=1, episodes=700, episodes_per_round=300, block_growth=1.2)
    plan = L._plan
    monkeypatch.setattr(L, "_plan", lambda: calls.append(L.stats.steps_done) or plan())
    _run(L)
    ends = release_schedule(700, 1.2)
    assert L.stats.steps_done == len(ends) and int(L.stats.pending_users) == 0
    assert calls == sorted(set(calls)) == list(range(len(ends)))          # one plan per release
    pooled = L.stats.counts.numpy()[L.layout.sa:2 * L.layout.sa]
    assert 700 <= pooled.sum() <= 700 * 4                                     # every episode counted once


def test_resume_from_state_dict_matches_uninterrupted_run():
    """Blocks cross the round boundaries (ends ..., 97, 102, ..., 191, 201): the open block travels with the
    checkpoint."""
    def make(seed_noise):
        return DPUBEV(riverswim(5), privacy=_ctx(1.0, seed_noise), seed=4, episodes=300, episodes_per_round=100)

    full = _run(make(7))
    part = make(7)
    part.train_round(0)
    state, noise = part.state_dict(), part.privacy.noise.state_dict()
    resumed = make(7)
    resumed.load_state_dict(state)
    resumed.privacy.noise.load_state_dict(noise)
    resumed.train_round(1)
    resumed.train_round(2)
    assert torch.equal(full.episode_regret, resumed.episode_regret)


def test_cli_dp_ubev_riverswim_writes_summary(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli(["algo=dp_ubev", "eps=1", "env=riverswim", "episodes=300", "algo.episodes_per_round=100",
                   "progress=false", "eval_episodes=5", "privacy.secure_rng=false", f"hydra.run.dir={run_dir}"])
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epsilon_spent"] == pytest.approx(1.0) and summary["accountant"] == "gdp"   # exact Gaussian
    assert len(summary["ledger"]) == 3 and summary["cumulative_regret"] > 0


def test_cli_dp_ubev_runs_a_gymnasium_env(tmp_path):
    out = run_cli(["algo=dp_ubev", "eps=5", "env.id=FrozenLake-v1", "env.horizon=10", "episodes=200",
                   "algo.episodes_per_round=100", "progress=false", "eval_episodes=5", "privacy.secure_rng=false",
                   f"hydra.run.dir={tmp_path / 'run'}"])
    assert out.returncode == 0, out.stderr[-2000:]
