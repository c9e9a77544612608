"""Slow: SIGKILL at 5 points (one in the middle of a checkpoint write); every resume matches."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.cli_helpers import ROOT, run_cli

ARGS = ["privacy.secure_rng=false", "algo=dp_pg", "rounds=12", "users_per_round=3", "checkpoint_every=1", "eval_episodes=3", "progress=false",
        "env.horizon=60", "seed=11"]


def _killed_run(run_dir, delay=None, fault_file=None):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if fault_file:
        env["DPPO_FAULT_KILL_IN_CHECKPOINT"] = fault_file
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *ARGS, f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if delay is not None:
        ckpt_dir = os.path.join(run_dir, "checkpoints")
        while not os.path.isdir(ckpt_dir) and proc.poll() is None:  # start the clock once training runs
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode


@pytest.mark.slow
def test_five_kill_points_each_resume_matches_uninterrupted(tmp_path):
    ref_dir = tmp_path / "ref"
    assert run_cli([*ARGS, f"hydra.run.dir={ref_dir}"]).returncode == 0
    ref = json.load(open(ref_dir / "summary.json"))
    rng = random.Random(0)
    points = [("fault", "ckpt_000005.pt")] + [("time", rng.uniform(0.0, 3.0)) for _ in range(4)]
    for i, (kind, arg) in enumerate(points):
        run = tmp_path / f"k{i}"
        code = _killed_run(str(run), fault_file=arg) if kind == "fault" else _killed_run(str(run), delay=arg)
        assert code == -signal.SIGKILL or code == 0
        if kind == "fault":
            leftovers = [f for f in os.listdir(run / "checkpoints") if ".tmp." in f]
            assert leftovers  # the half-written file is there, and must be ignored
        r = run_cli([f"resume={run}"]) if (run / "checkpoints").exists() and os.listdir(run / "checkpoints") \
            else run_cli([*ARGS, f"hydra.run.dir={run}"])
        assert r.returncode == 0, r.stderr
        got = json.load(open(run / "summary.json"))
        assert got["ledger"] == ref["ledger"] and got["epsilon_spent"] == ref["epsilon_spent"]
        assert got["users_seen"] == 36 and got["final_return"] == ref["final_return"]
