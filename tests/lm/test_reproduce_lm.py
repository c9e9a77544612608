"""scripts/reproduce_lm.py: the share of the *best* non-private gain, run naming and reuse, checked on
synthetic finished runs against the formula computed by hand."""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import reproduce_lm as rl  # noqa: E402


def fake_run(work, job, value, greedy=0.5):
    path = os.path.join(work, job.name())
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"complete": True, "final_return": value, "final_greedy_return": greedy,
                   "trainable_parameters": 1024, "wall_time_s": 1.0}, f)
    if job.impl == "dppo":
        with open(os.path.join(path, "progress.csv"), "w") as f:
            f.write(f"global_step,rollout/round,eval/return\n8192,15,{value}\n")


def test_the_share_is_against_the_better_non_private_row_per_seed_and_for_the_means(tmp_path, monkeypatch):
    monkeypatch.setitem(rl.TASKS, "exact", {**rl.TASKS["exact"], "best_dppo": ("full", 1e-3, ()),
                                            "best_trl": ("full", 1e-3, ()), "private": ("lora_r2_qv", 0.03, ())})
    work, seeds, sft = str(tmp_path), [0, 1], 0.5
    rows = rl.reference_rows("exact", seeds, [8.0], with_trl=True)
    values = {"best_dppo": [0.70, 0.74], "best_trl": [0.80, 0.76], "twin": [0.60, 0.62], "eps8": [0.62, 0.68]}
    for key, jobs in rows:
        for job, v in zip(jobs, values[key]):
            fake_run(work, job, v)
    summary = {"tasks": {}}
    lines = rl.task_table("exact", rows, (sft, 0.1), SimpleNamespace(work=work), summary)
    t = summary["tasks"]["exact"]
    assert t["best"] == "best_trl"                                   # mean 0.78 > 0.72
    best = [0.80, 0.76]
    assert t["rows"]["eps8"]["share_of_best"] == pytest.approx((0.65 - sft) / (0.78 - sft))
    assert t["rows"]["eps8"]["share_per_seed"] == pytest.approx([(p - sft) / (b - sft) for p, b in zip([0.62, 0.68], best)])
    assert t["rows"]["best_dppo"]["share_of_best"] == pytest.approx((0.72 - sft) / (0.78 - sft))
    assert any("own non-private twin" in ln and f"{(0.65 - sft) / (0.61 - sft):.2f}" in ln for ln in lines)


def test_jobs_name_their_settings_and_finished_runs_are_reused(tmp_path):
    a = rl.Job("addition", "dppo", "lora_r2_qv", 0.01, 8.0, 0, ("users_per_round=2048", "rounds=8"))
    b = rl.Job("addition", "dppo", "lora_r2_qv", 0.01, 8.0, 0)
    c = rl.Job("addition", "trl", "full", 1e-3, None, 0, (), ("--scheduler", "constant"))
    assert len({a.name(), b.name(), c.name()}) == 3 and "eps8" in a.name() and "constant" in c.name()
    assert "users_per_round=2048" in a.overrides() and "eps=8.0" in a.overrides()
    assert "policy.lora=null" in c.overrides() and not any(o.startswith("algo.lr") for o in c.overrides())
    fake_run(str(tmp_path), b, 0.7)
    assert rl.result(b, str(tmp_path))["final_return"] == 0.7 and rl.result(a, str(tmp_path)) is None
    rl.run_all([b], str(tmp_path), 1, "reuse")                       # nothing to run: it is finished
