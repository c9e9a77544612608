"""Torch's CPU threads chosen for the work: ``threads=auto`` (the default) runs a small policy on one thread.

Torch starts one intra-op thread per core. For the policies of the control benchmarks (a few thousand to a few
hundred thousand parameters, batches of a few thousand rows) each operation is far too small to split: the
threads only synchronise, and on a machine where other work is running every synchronisation waits for a core
(measured by ``scripts/bench_threads.py``: ``python train.py`` on two busy cores took minutes with torch's default
threads and seconds on one). So ``auto`` takes one thread for a policy below ``AUTO_PARAMETERS`` parameters and
torch's own count above it (a language model), and an explicit ``OMP_NUM_THREADS`` in the environment is the
user's choice and wins over ``auto``. ``threads=N`` asks for N. The count is set for the training loop only
(``Trainer.fit``) and the caller's count is restored after it.
"""
from __future__ import annotations

import contextlib
import os

import torch

from dppo.errors import ConfigError

# parameters (trainable and frozen) from which ``auto`` keeps torch's default threads
AUTO_PARAMETERS = 2_000_000


def check_threads(value) -> None:
    """``threads`` is ``auto`` or an int >= 1."""
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"threads must be auto or an int >= 1 (torch's CPU threads), got {value!r}")


def choose_threads(value, *modules) -> int | None:
    """The thread count for the work (None: leave torch's as it is). ``value``: ``auto`` or an int; ``modules``:
    the run's networks (policy, critic), whose parameters size the work."""
    check_threads(value)
    if value != "auto":
        return int(value)
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    params = sum(p.numel() for m in modules if isinstance(m, torch.nn.Module) for p in m.parameters())
    return 1 if params < AUTO_PARAMETERS else None


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run the block on ``n`` intra-op threads (None: as they are), restoring the previous count after it."""
    if n is None or n == torch.get_num_threads():
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(previous)
