"""Ctrl-C and resume, as a user sees them: a run says where it writes as it starts; Ctrl-C is one line naming the
round and the command that continues it, exit 130, no traceback; the resume says where it continues and what the
lost attempt cost (its users burned, its releases charged), and the numbers are the journal's."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from dppo.training.journal import JOURNAL_NAME, UserJournal
from tests.cli_helpers import ROOT

ARGS = ["algo=dp_pg", "rounds=400", "users_per_round=4", "group_size=2", "env.horizon=40", "progress=false",
        "checkpoint_every=1000"]


def _rows(run) -> int:
    try:
        with open(run / "progress.csv") as f:
            return max(0, len(f.read().splitlines()) - 1)
    except OSError:
        return 0


def _interrupt(args, run, rounds: int = 2):
    """Start ``python train.py ARGS``, wait for its start line and ``rounds`` more logged rounds, send SIGINT."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = p.stderr.readline()
    while first.startswith("dppo: warning"):   # seeded noise's warning comes first
        first = p.stderr.readline()
    target, t0 = _rows(run) + rounds, time.time()
    while _rows(run) < target and p.poll() is None and time.time() - t0 < 120:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    return p.returncode, first.strip(), [ln for ln in err.splitlines() if ln.strip()]


def test_ctrl_c_is_one_line_with_the_resume_command_and_the_resume_says_what_it_burned(tmp_path):
    run = tmp_path / "run"
    code, first, lines = _interrupt([*ARGS, f"hydra.run.dir={run}"], run)
    assert first == f"dppo: dp_pg on CartPole-v1, eps=5, 400 rounds -> {run} (Ctrl-C is safe: resume={run} continues)"
    assert code == 130 and len(lines) == 1 and "Traceback" not in "".join(lines), lines
    assert lines[0].startswith("dppo: interrupted in round ")
    assert lines[0].endswith(f"continue with: python train.py resume={run} (the interrupted round's users are "
                             f"burned and any release it made is charged)")
    events = UserJournal.read(str(run / JOURNAL_NAME))
    burned = len({u for e in events if e["event"] == "take" for u in e["users"]})
    released = sum(1 for e in events if e["event"] == "release")
    assert burned and released
    code, first, lines = _interrupt([f"resume={run}", "progress=false"], run, rounds=1)
    assert first == (f"dppo: resuming {run} at round 0 of 400; the lost attempt's {burned} user(s) burned (never "
                     f"drawn again) and {released} release(s) charged; eps spent 5 of 5")
    assert code == 130 and len(lines) == 1 and lines[0].startswith("dppo: interrupted in round ")


def test_a_seeded_resume_says_it_replays_the_same_users(tmp_path):
    run = tmp_path / "run"
    code, _, _ = _interrupt([*ARGS, "privacy.secure_rng=false", f"hydra.run.dir={run}"], run)
    assert code == 130
    code, first, _ = _interrupt([f"resume={run}", "progress=false"], run, rounds=0)
    assert first.startswith(f"dppo: resuming {run} at round 0 of 400; ")
    assert "lost round(s) replayed on the same users (seeded noise or no privacy: the replay is bit-identical)" in first
