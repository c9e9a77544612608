import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_helpers import run_cli  # noqa: E402

torch.set_num_threads(1)

TINY = ["privacy.secure_rng=false", "rounds=3", "users_per_round=3", "eval_episodes=2", "progress=false", "env.horizon=50"]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def tiny():
    return list(TINY)
