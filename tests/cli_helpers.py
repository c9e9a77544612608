"""Helpers for tests that run ``train.py`` in a subprocess (a uniquely named module, not conftest)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(args, cwd=None, timeout=300, **kw):
    """Run `python train.py ARGS` in a subprocess; returns CompletedProcess."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env, **kw)


def one_error_line(capsys, args) -> str:
    """The one stderr line with which the CLI entry refuses ``args`` (exit 2, no traceback, Hydra never started)."""
    import pytest

    from dppo.cli import entry

    def never_called():
        raise AssertionError("Hydra's run must not start for a bad config")

    with pytest.raises(SystemExit) as exc:
        entry(never_called, [*args, "progress=false"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
