"""Fault injection for the crash tests: ``DPPO_FAULT_KILL_AT=<point>:<round>`` SIGKILLs the process there.

Points: ``after_take`` (a round's users are journalled, nothing collected yet), ``after_release`` (a
round's release is made, nothing logged yet), ``after_dump`` (a round's metrics are in TensorBoard /
progress.csv, its checkpoint not written). ``DPPO_FAULT_KILL_IN_CHECKPOINT`` (``checkpoint.py``) kills
halfway through a checkpoint write. Unset in normal runs: then each call is one dictionary lookup.
"""
from __future__ import annotations

import os
import signal

FAULT_AT_ENV = "DPPO_FAULT_KILL_AT"


def maybe_kill(point: str, round_idx: int) -> None:
    """SIGKILL this process if ``DPPO_FAULT_KILL_AT`` names ``point`` at ``round_idx``."""
    spec = os.environ.get(FAULT_AT_ENV)
    if spec and spec == f"{point}:{int(round_idx)}":
        os.kill(os.getpid(), signal.SIGKILL)
