"""Multi-pass rounds draw a Poisson sample, whose realised size depends on who is in the population (add/remove
adjacency): shareable files hold only the expected counts (q N users, q N G episodes), the realised ones are
raw diagnostics."""
from __future__ import annotations

import csv
import json
import os

import pytest

import dppo

COMMON = ["privacy.multi_pass=true", "privacy.population_size=40", "users_per_round=8", "rounds=3", "eps=3",
          "group_size=2", "eval_episodes=0", "eval_every=null", "progress=false", "env.horizon=20",
          "privacy.secure_rng=false"]


def _run(tmp_path, name, algo, seed, diagnostics):
    extra = ["algo.minibatches=1", "algo.epochs=2"] if algo == "dp_ppo" else []
    run_dir = str(tmp_path / name)
    summary = dppo.train([f"algo={algo}", f"seed={seed}", f"logger.diagnostics={str(diagnostics).lower()}",
                          *COMMON, *extra], run_dir=run_dir)
    with open(os.path.join(run_dir, "progress.csv")) as f:
        rows = list(csv.DictReader(f))
    return summary, rows


@pytest.mark.parametrize("algo", [pytest.param("dp_pg", marks=pytest.mark.slow), "dp_ppo"])
def test_shareable_counts_are_the_expected_ones_whatever_the_sample_drew(tmp_path, algo):
    public = ("global_step", "rollout/users", "rollout/episodes")
    runs = [_run(tmp_path, f"s{seed}", algo, seed, diagnostics=False) for seed in (0, 1)]
    for summary, rows in runs:
        assert [float(r["rollout/users"]) for r in rows] == [8.0] * 3
        assert [float(r["rollout/episodes"]) for r in rows] == [16.0] * 3
        assert summary["users_seen"] is None and summary["users_burned"] is None
        assert [e["users"] for e in summary["ledger"]] == [8] * 3
        assert not any(k.startswith("diag/") for k in rows[0])
        assert json.dumps(summary).count("diag") == 0
    assert [[r[k] for k in public] for r in runs[0][1]] == [[r[k] for k in public] for r in runs[1][1]]
    # the realised sizes differ between the two draws: they are kept, as raw diagnostics, with diagnostics on
    realised = [[float(r["diag/users"]) for r in _run(tmp_path, f"d{seed}", algo, seed, True)[1]] for seed in (0, 1)]
    assert realised[0] != realised[1]
