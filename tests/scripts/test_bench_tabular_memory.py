"""scripts/bench_tabular_memory.py runs each learner in a process of its own and reports its peak memory."""
import pytest
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_every_row_reports_a_peak_and_a_rate_on_a_small_env():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_tabular_memory.py"),
                          "--env", "FrozenLake-v1", "--episodes", "300", "--horizons", "6"],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "| 6 |" in line]
    assert len(rows) == 4, out.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert re.fullmatch(r"\d+", cells[2]) and 100 < int(cells[2]) < 4000, row      # peak MiB
        assert float(cells[3]) > 0 and cells[4], row                                   # episodes/s, counter
