"""summary.json's ``env_steps``: the users' env steps (raw, only with diagnostics on) and the public rollouts'
(evaluation, public Fisher states), each against an independent count."""
import csv
import json

import pytest

import dppo


def _eval_steps(run_dir, episodes):
    """Env steps of the final evaluation, recounted: the saved policy on the same public seeds and stream."""
    run = dppo.load(str(run_dir))
    return int(run.learner.collector.public(run.learner.policy, "eval", 0, episodes).env_steps)


@pytest.mark.parametrize("algo,extra", [("dp_pg", []), ("dp_npg", ["algo.fisher_episodes=2"])])
def test_users_and_public_env_steps_are_counted_separately(algo, extra, tiny, tmp_path):
    # evaluated at the end only: the final evaluation is the one to recount from the saved policy
    s = dppo.train([f"algo={algo}", *tiny, *extra, "eval_every=null"], run_dir=str(tmp_path))
    with open(tmp_path / "progress.csv") as f:
        users = sum(int(float(r["diag/env_steps"])) for r in csv.DictReader(f))
    assert s["env_steps"]["users"] == users > 0
    eval_steps = _eval_steps(tmp_path, 2)
    if algo == "dp_pg":   # evaluation only
        assert s["env_steps"]["public"] == eval_steps
    else:                 # plus 2 public Fisher rollouts per round, at most the horizon (50) each
        assert eval_steps < s["env_steps"]["public"] <= eval_steps + 3 * 2 * 50
    assert json.load(open(tmp_path / "summary.json"))["env_steps"] == s["env_steps"]


def test_users_env_steps_are_absent_without_diagnostics(tiny, tmp_path):
    s = dppo.train(["algo=dp_pg", *tiny, "logger.diagnostics=false"], run_dir=str(tmp_path))
    assert set(s["env_steps"]) == {"public"} and s["env_steps"]["public"] > 0 and "diag" not in s


@pytest.mark.slow  # ~15 s: a killed run and its resume (the crash paths themselves: tests/training/test_crash_recovery.py)
def test_public_env_steps_continue_across_a_crash_and_resume(tmp_path, monkeypatch):
    """Killed after round 2's logs (its checkpoint not written) and resumed: the same counts as a run that
    never stopped (seeded noise: the replay is identical)."""
    from cli_helpers import run_cli

    args = ["algo=dp_pg", "privacy.secure_rng=false", "rounds=4", "users_per_round=3", "eval_episodes=2",
            "eval_every=1", "checkpoint_every=1", "progress=false", "env.horizon=40"]
    assert run_cli([*args, f"hydra.run.dir={tmp_path / 'full'}"]).returncode == 0
    monkeypatch.setenv("DPPO_FAULT_KILL_AT", "after_dump:2")
    assert run_cli([*args, f"hydra.run.dir={tmp_path / 'killed'}"]).returncode != 0
    monkeypatch.delenv("DPPO_FAULT_KILL_AT")
    assert run_cli([f"resume={tmp_path / 'killed'}"]).returncode == 0
    full = json.load(open(tmp_path / "full" / "summary.json"))["env_steps"]
    resumed = json.load(open(tmp_path / "killed" / "summary.json"))["env_steps"]
    assert resumed == full and full["public"] > 0
