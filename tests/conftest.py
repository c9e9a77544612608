import pytest
import torch

from tests.cli_helpers import run_cli

torch.set_num_threads(1)

TINY = ["privacy.secure_rng=false", "rounds=3", "users_per_round=3", "eval_episodes=2", "progress=false", "env.horizon=50"]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def tiny():
    return list(TINY)
