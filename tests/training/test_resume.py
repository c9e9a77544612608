"""A run killed with SIGKILL and resumed ends with the same ledger as an uninterrupted run."""
import pytest
import json
import os
import signal
import subprocess
import sys
import time

from tests.cli_helpers import ROOT, run_cli

ARGS = ["privacy.secure_rng=false", "algo=dp_pg", "rounds=8", "users_per_round=3", "checkpoint_every=1", "eval_episodes=3", "progress=false",
        "env.horizon=40", "seed=4"]


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert run_cli([*ARGS, f"hydra.run.dir={full}"]).returncode == 0
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *ARGS, f"hydra.run.dir={killed}"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = killed / "checkpoints" / "ckpt_000003.pt"
    deadline = time.time() + 180
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert target.exists()
    r = run_cli([f"resume={killed}"])
    assert r.returncode == 0, r.stderr
    a = json.load(open(full / "summary.json"))
    b = json.load(open(killed / "summary.json"))
    assert b["rounds_done"] == 8 and b["complete"]
    assert [e["round"] for e in b["ledger"]] == list(range(8))
    assert b["ledger"] == a["ledger"] and b["epsilon_spent"] == a["epsilon_spent"]
    assert b["users_seen"] == a["users_seen"] == 24  # no user used twice
    assert b["final_return"] == a["final_return"]  # RNG, sampler and noise states resumed exactly


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_resume_refuses_a_changed_config(tmp_path):
    run = tmp_path / "run"
    assert run_cli([*ARGS, "rounds=2", f"hydra.run.dir={run}"]).returncode == 0
    r = run_cli([f"resume={run}", "eps=3"])
    assert r.returncode == 2 and "different configuration" in r.stderr and "Traceback" not in r.stderr
