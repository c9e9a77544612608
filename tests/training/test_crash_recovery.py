"""Every crash can be resumed, and no dead end leads to reuse: a run killed (SIGKILL) before its first
checkpoint, or whose checkpoints are all damaged, resumes from its initial state with the journal applied
(users burned, releases charged), its logs purged of the lost attempt; half-written temp files are removed;
a resume whose charges would end the run above its target eps is refused unless allowed."""
import csv
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import dppo
from dppo.api import load_run_config
from dppo.cli import entry
from dppo.errors import PrivacyError
from dppo.training.callbacks import Callback
from dppo.training.journal import JOURNAL_NAME, UserJournal
from tests.cli_helpers import ROOT, run_cli

SECURE = ["algo=dp_pg", "users_per_round=3", "eval_episodes=2", "progress=false", "env.horizon=40", "seed=3"]


def _rows(run_dir):
    path = os.path.join(run_dir, "progress.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _takes(run_dir):
    return [e for e in UserJournal.read(os.path.join(run_dir, JOURNAL_NAME)) if e["event"] == "take"]


def _assert_no_user_twice(run_dir):
    ids = [u for e in _takes(run_dir) for u in e["users"]]
    assert ids and len(ids) == len(set(ids))       # no user id in two rounds, the lost attempts' included


def _kill_after_rows(run_dir, args, rows=2, timeout=180):
    """Start ``train.py`` and SIGKILL it once ``progress.csv`` has ``rows`` rows (before any checkpoint)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args, f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        try:
            if len(_rows(run_dir)) >= rows:
                break
        except (OSError, csv.Error):
            pass
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode


def _never():
    raise AssertionError("Hydra's run must not start")


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_a_secure_run_killed_with_sigkill_before_its_first_checkpoint_resumes_without_reusing_a_user(tmp_path, capsys):
    run = tmp_path / "run"
    args = [*SECURE, "rounds=40", "checkpoint_every=1000"]
    assert _kill_after_rows(run, args) == -signal.SIGKILL
    assert not glob.glob(str(run / "checkpoints" / "ckpt_*.pt"))          # killed before any checkpoint
    logged = len(_rows(run))
    assert logged >= 2
    with pytest.raises(SystemExit) as refused:                               # a new run there is refused ...
        entry(_never, [*args, f"hydra.run.dir={run}"])
    assert refused.value.code == 2 and f"resume={run}" in capsys.readouterr().err   # ... the advice: resume it
    r = run_cli([f"resume={run}"])
    assert r.returncode == 0, r.stderr
    summary = json.load(open(run / "summary.json"))
    _assert_no_user_twice(run)
    assert summary["rounds_done"] == 40 and summary["complete"]
    assert [e["round"] for e in summary["ledger"] if not e.get("lost")] == list(range(40))
    # every release the killed attempt made (at least the rounds it logged) is charged, its users burned
    assert summary["releases_lost"] >= logged and summary["users_burned"] >= 3 * logged
    assert summary["epsilon_spent"] == pytest.approx(5.0)                 # burned users: parallel composition
    rows = _rows(run)
    assert [int(float(x["rollout/round"])) for x in rows] == list(range(40))   # the lost attempt's rows purged
    # the release's user gate survived the crash in the checkpoint: every user taken, the lost attempt's burned
    from dppo.privacy.users import BURNED
    from dppo.training.checkpoint import load_latest_checkpoint

    state, _ = load_latest_checkpoint(str(run / "checkpoints"))
    gate = dict(map(tuple, state["privacy"]["users"]["round_of"]))
    assert set(gate) == {u for e in _takes(run) for u in e["users"]}
    assert sum(r == BURNED for r in gate.values()) == summary["users_burned"]


@pytest.mark.slow
@pytest.mark.parametrize("point,extra", [("after_dump:2", []), ("after_release:1", ["logger=console"])])
def test_a_seeded_run_killed_before_its_first_checkpoint_replays_to_the_uninterrupted_result(tmp_path, point, extra):
    args = ["algo=dp_pg", "privacy.secure_rng=false", "rounds=5", "users_per_round=3", "eval_episodes=2",
            "progress=false", "env.horizon=40", "checkpoint_every=100", "seed=4"]
    full = tmp_path / "full"
    dppo.train([*args, *extra], run_dir=str(full))
    run = tmp_path / point.replace(":", "_")
    env = dict(os.environ, OMP_NUM_THREADS="1", DPPO_FAULT_KILL_AT=point)
    killed = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args, *extra,
                             f"hydra.run.dir={run}"], cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    r = run_cli([f"resume={run}"])
    assert r.returncode == 0, r.stderr
    a, b = json.load(open(full / "summary.json")), json.load(open(run / "summary.json"))
    # the same code on the same inputs from the same initial state: the replay is the same computation
    assert b["ledger"] == a["ledger"] and b["final_return"] == a["final_return"] and b["users_burned"] == 0
    assert b["policy_sha256"] == a["policy_sha256"]


class StopAfter(Callback):
    def __init__(self, last_round):
        self.last_round = last_round

    def on_round_end(self, trainer, round_idx, metrics):
        return round_idx < self.last_round


def test_a_run_whose_checkpoints_are_all_damaged_resumes_from_its_initial_state(tmp_path):
    args = [*SECURE, "rounds=4", "checkpoint_every=1", "privacy.secure_rng=true"]
    dppo.train(args, run_dir=str(tmp_path), callbacks=[StopAfter(1)])
    ckpts = glob.glob(str(tmp_path / "checkpoints" / "ckpt_*.pt"))
    assert ckpts
    for path in ckpts:
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 3])                  # every checkpoint cut short
    done = dppo.train(args, run_dir=str(tmp_path), resume=True)
    _assert_no_user_twice(tmp_path)
    assert done["rounds_done"] == 4 and done["users_burned"] == 6 and done["releases_lost"] == 2
    assert [e["round"] for e in done["ledger"] if not e.get("lost")] == [0, 1, 2, 3]
    assert [int(float(x["rollout/round"])) for x in _rows(tmp_path)] == [0, 1, 2, 3]


def test_temp_files_of_a_write_killed_midway_are_removed_on_resume(tmp_path):
    run = tmp_path / "run"
    args = ["algo=dp_pg", "privacy.secure_rng=false", "rounds=4", "users_per_round=2", "checkpoint_every=1",
            "eval_episodes=1", "progress=false", "env.horizon=30"]
    env = dict(os.environ, OMP_NUM_THREADS="1", DPPO_FAULT_KILL_IN_CHECKPOINT="ckpt_000002.pt")
    killed = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args, f"hydra.run.dir={run}"],
                            cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert glob.glob(str(run / "checkpoints" / "ckpt_000002.pt.tmp.*"))       # the half-written file
    dppo.train(load_run_config(str(run)), str(run), resume=True)
    assert not glob.glob(str(run / "checkpoints" / "*.tmp.*")) and not glob.glob(str(run / "*.tmp*"))


def test_a_pucb_crash_is_never_resumed_above_the_target_without_consent(tmp_path):
    """PUCB's counters span rounds: a crashed attempt's replay is charged as a second copy of them, doubling
    eps. The resume is refused with one line naming the amount; privacy.allow_over_target=true accepts it."""
    run = tmp_path / "pucb"
    args = ["algo=pucb", "env=riverswim", "eps=1", "episodes=60", "algo.episodes_per_round=20", "progress=false",
            "eval_episodes=1", "checkpoint_every=1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", DPPO_FAULT_KILL_AT="after_take:1")
    killed = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args, f"hydra.run.dir={run}"],
                            cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    r = run_cli([f"resume={run}"])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr
    assert "eps spent at 2, above the target eps=1" in lines[0] and "privacy.allow_over_target=true" in lines[0]
    assert not (run / "summary.json").exists() or not json.load(open(run / "summary.json"))["complete"]
    summary = dppo.train(load_run_config(str(run), ["privacy.allow_over_target=true"]), str(run), resume=True)
    assert summary["complete"] and summary["epsilon_spent"] == pytest.approx(2.0)
    assert sum(1 for e in summary["ledger"] if e.get("replay")) == 3


def test_a_charge_under_parallel_composition_is_not_an_overshoot(tmp_path):
    """One-pass secure: the lost attempt's users are burned, disjoint from every other round's, so its release
    is its own parallel group and the run stays at its target: no refusal, no override needed."""
    args = [*SECURE, "rounds=3", "checkpoint_every=1", "privacy.secure_rng=true"]
    part = dppo.train(args, run_dir=str(tmp_path), callbacks=[StopAfter(0)])
    with open(tmp_path / JOURNAL_NAME, "a") as f:
        f.write(json.dumps({"event": "start", "incarnation": 1, "round": 1}) + "\n")
        f.write(json.dumps({"event": "take", "round": 1, "incarnation": 1, "users": [3, 4, 5]}) + "\n")
        f.write(json.dumps({"event": "release", "round": 1, "incarnation": 1,
                            "entry": dict(part["ledger"][-1], round=1)}) + "\n")
    done = dppo.train(args, run_dir=str(tmp_path), resume=True)
    assert done["releases_lost"] == 1 and done["epsilon_spent"] == pytest.approx(5.0)
    # the same lost release under the basic accountant composes with every other one: refused
    args_basic = [*args, "privacy.accountant=basic"]
    d2 = tmp_path / "basic"
    part = dppo.train(args_basic, run_dir=str(d2), callbacks=[StopAfter(0)])
    with open(d2 / JOURNAL_NAME, "a") as f:
        f.write(json.dumps({"event": "take", "round": 1, "incarnation": 1, "users": [3, 4, 5]}) + "\n")
        f.write(json.dumps({"event": "release", "round": 1, "incarnation": 1,
                            "entry": dict(part["ledger"][-1], round=1)}) + "\n")
    with pytest.raises(PrivacyError, match="resume refused"):
        dppo.train(args_basic, run_dir=str(d2), resume=True)
