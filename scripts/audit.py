"""Full privacy audit of every mechanism; writes runs/reference/audit.md.

Usage: nice -n 10 python scripts/audit.py [--only NAME ...] [--out runs/reference/audit.md]
(about 20-30 minutes on one thread; ``python -m dppo.audit --fast`` is the quick version).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from dppo.audit.result import MechanismAudit
from dppo.audit.run import markdown, run_suite, suite

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "runs" / "reference" / "audit.md"))
    parser.add_argument("--rows", default=str(ROOT / "runs" / "audit" / "rows.json"),
                        help="every row measured so far (JSON); --only replaces just its mechanisms' rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = run_suite(only=args.only, seed=args.seed,
                     progress=lambda r: print(f"{r.mechanism}: claimed {r.claimed_eps:.4g}, eps_LB {r.eps_lb:.3f} "
                                              f"({r.trials} trials, {r.seconds:.0f} s)", flush=True))
    rows_path = Path(args.rows)
    if args.only and rows_path.exists():
        kept = [MechanismAudit.from_dict(d) for d in json.loads(rows_path.read_text())]
        new = {(r.mechanism, r.claimed_eps) for r in rows}
        rows = [r for r in kept if (r.mechanism, r.claimed_eps) not in new] + rows
        order = [s.name for s in suite()]
        rank = lambda r: next((i for i, n in enumerate(order) if r.mechanism.split(" ")[0] == n), len(order))
        rows.sort(key=lambda r: (rank(r), "float64" in r.mechanism, r.claimed_eps))
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    rows_path.write_text(json.dumps([r.as_dict() for r in rows], indent=1))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    text = markdown(rows, title="Privacy audit (full)")
    text += (f"\nCommand: `python scripts/audit.py` (seed {args.seed}, one thread) at commit {commit}; "
             f"total {time.perf_counter() - started:.0f} s.\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
