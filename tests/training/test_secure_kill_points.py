"""Secure noise, SIGKILL at four points (mid-round after the take, mid-round after the release, after the
round's TensorBoard/CSV writes, mid-checkpoint): after resume no user id is in two takes, two releases or
two rounds' outputs, the crashed attempt's users are burned and counted, every round is released once."""
import csv
import json
import os
import subprocess
import sys

import pytest

from tests.cli_helpers import ROOT, run_cli
from dppo.training.journal import JOURNAL_NAME, UserJournal

ARGS = ["algo=dp_pg", "privacy.secure_rng=true", "rounds=8", "users_per_round=3", "checkpoint_every=2",
        "eval_episodes=2", "progress=false", "env.horizon=40", "seed=5"]

# (environment that kills, rounds lost = burned, i.e. journalled after the checkpoint the resume loads)
POINTS = {
    "mid_round_after_take": ({"DPPO_FAULT_KILL_AT": "after_take:3"}, [2, 3]),
    "mid_round_after_release": ({"DPPO_FAULT_KILL_AT": "after_release:5"}, [4, 5]),
    "after_tensorboard_writes": ({"DPPO_FAULT_KILL_AT": "after_dump:4"}, [4]),
    "mid_checkpoint": ({"DPPO_FAULT_KILL_IN_CHECKPOINT": "ckpt_000006.pt"}, [4, 5]),
}


def _killed_run(run_dir, fault_env):
    env = dict(os.environ, OMP_NUM_THREADS="1", **fault_env)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *ARGS, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    return proc.returncode


@pytest.mark.parametrize("point", [pytest.param("mid_round_after_take", marks=pytest.mark.slow),
                                   pytest.param("mid_round_after_release", marks=pytest.mark.slow),
                                   pytest.param("after_tensorboard_writes", marks=pytest.mark.slow), "mid_checkpoint"])
def test_secure_run_killed_and_resumed_never_releases_a_user_twice(tmp_path, point):
    fault_env, lost_rounds = POINTS[point]
    run = tmp_path / "run"
    assert _killed_run(run, fault_env) == -9
    r = run_cli([f"resume={run}"])
    assert r.returncode == 0, r.stderr
    summary = json.load(open(run / "summary.json"))
    events = UserJournal.read(str(run / JOURNAL_NAME))
    takes = [e for e in events if e["event"] == "take"]
    ids = [u for e in takes for u in e["users"]]
    assert len(ids) == len(set(ids))                          # no user in two rounds, attempts included
    burned = [u for e in takes if e["incarnation"] == 0 and e["round"] in lost_rounds for u in e["users"]]
    assert summary["users_burned"] == len(burned) == 3 * len(lost_rounds)
    assert summary["users_seen"] == 8 * 3 + len(burned)
    live = [e for e in summary["ledger"] if not e.get("lost")]
    assert [e["round"] for e in live] == list(range(8))     # each round released once on fresh users
    # every release (the crashed attempt's too) is made on the users of its own take: one take per release
    releases = [e for e in events if e["event"] == "release"]
    owners = {(e["incarnation"], e["round"]) for e in takes}
    assert all((e["incarnation"], e["round"]) in owners for e in releases)
    assert len({(e["incarnation"], e["round"]) for e in releases}) == len(releases)
    assert summary["epsilon_spent"] == pytest.approx(5.0) and summary["noise_source"] == "os_csprng"
    rows = list(csv.DictReader(open(run / "progress.csv")))
    assert [int(float(row["rollout/round"])) for row in rows] == list(range(8))   # one output row per round
    steps = [int(float(row["global_step"])) for row in rows]                  # cumulative env steps (C7)
    assert steps == sorted(steps) and len(set(steps)) == 8
