import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)


def run_cli(args, cwd=None, timeout=300, **kw):
    """Run `python train.py ARGS` in a subprocess; returns CompletedProcess."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env, **kw)


@pytest.fixture
def cli():
    return run_cli


TINY = ["rounds=3", "users_per_round=3", "eval_episodes=2", "progress=false", "env.horizon=50"]


@pytest.fixture
def tiny():
    return list(TINY)
