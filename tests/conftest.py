import pytest

try:
    import torch
except ImportError:   # pytest run by a Python without the project installed: say how to install, in one line
    raise pytest.UsageError('the tests need the project installed in this Python: pip install torch==2.13.0 && '
                            'pip install -e ".[dev,lm]" (README, Install)') from None

from tests.cli_helpers import run_cli

torch.set_num_threads(1)

TINY = ["privacy.secure_rng=false", "rounds=3", "users_per_round=3", "eval_episodes=2", "progress=false", "env.horizon=50"]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def tiny():
    return list(TINY)
