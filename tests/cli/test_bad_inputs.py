"""Bad inputs that used to misbehave (issue 20), run as a user runs them: one line on stderr, exit code 2, no
traceback and no run directory, before round 0; and the resume forms that used to fail."""
import os
import socket
import subprocess
import sys

import pytest

from tests.cli_helpers import ROOT, run_cli


def _one_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def test_a_population_too_small_is_refused_before_round_0_without_a_run_directory(tmp_path):
    run = tmp_path / "run"
    line = _one_line(run_cli(["algo=dp_npg", "env=bandit", "users_per_round=500", "rounds=5", "progress=false",
                              f"hydra.run.dir={run}"]))
    assert "needs 2500 more users" in line and not run.exists()


def test_a_text_file_as_init_from_names_the_file_not_a_number(tmp_path):
    bad = tmp_path / "notes.pt"
    bad.write_text("these are not weights\n")
    line = _one_line(run_cli([f"policy.init_from={bad}", "progress=false", f"hydra.run.dir={tmp_path / 'run'}"]))
    assert f"policy.init_from={bad} is not a file torch.load(weights_only=True) can read" in line
    assert not (tmp_path / "run").exists()


def test_resume_accepts_its_own_run_dir_and_refuses_another(tmp_path, capsys):
    import dppo
    from dppo.cli import entry

    run = tmp_path / "run"
    args = ["algo=dp_pg", "rounds=2", "users_per_round=2", "group_size=2", "eval_episodes=1", "progress=false",
            "env.horizon=20", "checkpoint_every=1"]
    dppo.train(args, run_dir=str(run))
    never = lambda: (_ for _ in ()).throw(AssertionError("a resume never starts Hydra's run"))  # noqa: E731
    entry(never, [f"resume={run}", f"hydra.run.dir={run}", "rounds=3"])     # its own directory: continues
    assert "rounds=3" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        entry(never, [f"resume={run}", f"hydra.run.dir={tmp_path / 'elsewhere'}"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and "drop hydra.run.dir" in lines[0]
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.slow
def test_torchrun_with_a_single_process_learner_prints_one_line_from_rank_0(tmp_path):
    """Every rank refuses in pre-flight and exits 2; only rank 0 prints the line. (torchrun then adds its own
    report of failed workers, which dppo cannot suppress from inside them.)"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
                        "train.py", "algo=ubev", "env=riverswim", "episodes=100", "progress=false",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("dppo: error:")]
    assert r.returncode != 0 and len(ours) == 1 and "UBEV runs in one process" in ours[0]
    assert "exitcode  : 2" in r.stderr and not (tmp_path / "run").exists()
