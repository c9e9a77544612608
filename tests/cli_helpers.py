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
