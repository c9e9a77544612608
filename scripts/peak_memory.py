"""Peak memory of one run in a process of its own: the memory benchmarks' shared helper.

A benchmark script calls itself with ``--child ...``; the child does one run and prints one JSON line with its
results and ``peak_mib`` (``ru_maxrss`` of that process alone); the parent reads it back with ``run_child``.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys


def print_child_result(result: dict) -> None:
    """The child's last line: its results and its own peak resident memory."""
    print(json.dumps({**result, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_child(script: str, args: list[str]) -> dict:
    """Run ``script --child ARGS`` in a fresh process; its JSON line, or ``{"error": <its last stderr line>}``."""
    out = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONWARNINGS="ignore"))
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(lines[-1])
