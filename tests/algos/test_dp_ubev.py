"""DP-UBEV: reduces to UBEV on exact counts, plans on released counts only, privacy bookkeeping, CLI, resume."""
import json

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
    """eps=null, pool_steps=false: the same Q as UBEV on the same counts and the same episodes."""
    mdp = random_mdp(S=4, A=3, H=5, seed=2)
    kw = dict(seed=3, episodes=400, episodes_per_round=100)
    a = _run(UBEV(mdp, privacy=_ctx(None), **kw))
    b = _run(DPUBEV(mdp, privacy=_ctx(None), pool_steps=False, **kw))
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
    from dppo.privacy.gaussian_counter import GRID, gaussian_union_quantile

    L = DPUBEV(riverswim(5), privacy=_ctx(1.0), seed=0, episodes=1000, episodes_per_round=500)
    L.train_round(0)
    z = gaussian_union_quantile(L.beta, 4 * L.S * L.A * 1000)
    assert L.count_error_bound() == pytest.approx(z * L.stats.release_std(500) + GRID / 2)


def test_resume_from_state_dict_matches_uninterrupted_run():
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
    assert summary["epsilon_spent"] == pytest.approx(1.0) and summary["accountant"] == "zcdp"
    assert len(summary["ledger"]) == 3 and summary["cumulative_regret"] > 0


def test_cli_dp_ubev_runs_a_gymnasium_env(tmp_path):
    out = run_cli(["algo=dp_ubev", "eps=5", "env.id=FrozenLake-v1", "env.horizon=10", "episodes=200",
                   "algo.episodes_per_round=100", "progress=false", "eval_episodes=5", "privacy.secure_rng=false",
                   f"hydra.run.dir={tmp_path / 'run'}"])
    assert out.returncode == 0, out.stderr[-2000:]
