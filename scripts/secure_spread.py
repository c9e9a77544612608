"""What the plain command gives: one row of each results table rerun with the default secure noise.

    python scripts/secure_spread.py                 # every row below, writes runs/reference/secure_spread.md
    python scripts/secure_spread.py --only pendulum --jobs 2
    python scripts/secure_spread.py --fresh         # rerun every cell (cells done are kept in runs/secure_spread/)

The reference tables are made with seeded noise (``privacy.secure_rng=false``) so that they reproduce bit
for bit. A user who types the README's command gets the default, unpredictable noise (the OS CSPRNG) and
another draw of it at every run, so for each table this script reruns one row both ways: with seeded noise
on the table's seeds (the table's own runs, which also checks that the table still reproduces) and with
secure noise on seeds 0-9 (0-4 where a run takes a minute). It reports the secure runs' mean, std, min and
max, and whether the table's seeded mean lies inside the secure runs' range: a table number the plain
command cannot reach within that spread is a defect. Nothing here is tuned; the seeds are the tables'.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import QUIET, ROOT, episode_regret, gfa_overrides, plateau_episode, worker_init  # noqa: E402


@dataclass(frozen=True)
class Row:
    name: str            # the table (docs/results.md section)
    command: str         # the command a user types for one run
    overrides: tuple     # what the command sets
    table_seeds: tuple   # the seeds the reference table used (seeded noise)
    secure_seeds: tuple  # the seeds rerun with secure noise
    reference: str       # the reference file holding the table
    table_row: str       # the row's first cell there
    table_col: str       # the column holding the row's mean


ROWS = [
    Row("cartpole", "python train.py +experiment=cartpole_dp_npg eps=5",
        ("+experiment=cartpole_dp_npg", "eps=5"), (0, 1, 2), tuple(range(10)), "runs/reference/cartpole.md",
        "DP-NPG", "mean final return"),
    Row("acrobot", "python train.py +experiment=acrobot_dp_npg",
        ("+experiment=acrobot_dp_npg",), (0, 1, 2), tuple(range(10)), "runs/reference/acrobot.md",
        "DP-NPG", "mean final return"),
    Row("pendulum", "python train.py +experiment=pendulum_dp_npg eps=5",
        ("+experiment=pendulum_dp_npg", "eps=5"), (0, 1, 2), tuple(range(5)), "runs/reference/pendulum.md",
        "DP-NPG", "final return"),
]
GFA = Row("gfa (private eps=5, advanced; easy)", "python scripts/reproduce_gfa.py",
          (), tuple(range(20)), tuple(range(20, 40)), "runs/reference/gfa.md",
          "private eps=5, advanced (paper's accounting)", "easy: plateau")


def final_return(overrides: tuple, seed: int, secure: bool) -> float:
    """One run through the Python API, as ``train.py`` with these overrides would do it."""
    import dppo

    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
        summary = dppo.train([*overrides, f"seed={seed}", f"privacy.secure_rng={str(secure).lower()}", *QUIET],
                             run_dir=os.path.join(tmp, "run"))
    return float(summary["final_return"])


def gfa_plateau(seed: int, secure: bool) -> float:
    """The GFA table's "private eps=5, advanced (paper's accounting)" row, easy variant: the plateau
    episode of one seed (the table's main column), from a run through ``dppo.train`` like the table's."""
    import dppo

    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
        dppo.train(gfa_overrides("easy", 5.0, "advanced", seed, secure=secure), run_dir=os.path.join(tmp, "run"))
        return float(plateau_episode(episode_regret(os.path.join(tmp, "run"))))


def _cell(job):
    row, seed, secure = job
    t0 = time.perf_counter()
    value = gfa_plateau(seed, secure) if row.name.startswith("gfa") else final_return(row.overrides, seed, secure)
    return row.name, seed, secure, value, time.perf_counter() - t0


def table_value(row: Row) -> float | None:
    """The row's mean as its reference table reports it (the first number of its cell), None if absent."""
    path = os.path.join(ROOT, row.reference)
    if not os.path.exists(path):
        return None
    header = None
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if row.table_col in cells:
            header = cells
        elif header and len(cells) == len(header) and cells[0] == row.table_row:
            match = re.search(r"-?[0-9][0-9,]*\.?[0-9]*", cells[header.index(row.table_col)])
            return float(match.group().replace(",", "")) if match else None
    return None


def summarize(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def report(rows, results, wall: float) -> str:
    lines = ["# What the plain command gives: seeded tables against secure noise", "",
             "Written by `python scripts/secure_spread.py`. Every results table is made with seeded noise",
             "(`privacy.secure_rng=false`, bit-for-bit reproducible). The plain command uses the default secure",
             "noise (OS CSPRNG), a new draw every run: for one row of each table, the seeded runs on the table's",
             "seeds next to secure-noise runs on other seeds. GFA's value is the plateau episode (lower is better),",
             "the others' the final return of the stochastic policy on held-out episodes.", "",
             "The table's own number was made on the machine that wrote it; the seeded runs here repeat its seeds",
             "on this machine (equal where the CPU rounds the same way). A table number outside the secure runs'",
             "range is one the plain command cannot be expected to give.", "",
             "| table | command | the table's mean | seeded here: seeds, mean | secure: seeds, mean +- std | secure min .. max | table's mean inside the secure range |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        seeded = summarize([v for (n, _, s), v in results.items() if n == row.name and not s])
        secure = summarize([v for (n, _, s), v in results.items() if n == row.name and s])
        table = table_value(row)
        inside = "-" if table is None else ("yes" if secure["min"] <= table <= secure["max"] else "**no**")
        lines.append(f"| {row.name} | `{row.command}` | {'-' if table is None else f'{table:g}'} | "
                     f"{row.table_seeds[0]}-{row.table_seeds[-1]}: "
                     f"{seeded['mean']:.1f} | {row.secure_seeds[0]}-{row.secure_seeds[-1]}: {secure['mean']:.1f} +- "
                     f"{secure['std']:.1f} | {secure['min']:.1f} .. {secure['max']:.1f} | {inside} |")
    lines += ["", "Per seed:", ""]
    for (name, seed, secure), value in sorted(results.items()):
        lines.append(f"- {name} seed {seed} {'secure' if secure else 'seeded'}: {value:.2f}")
    lines += ["", f"Wall clock of this invocation: {wall / 60:.1f} min (cells found in the cache file are not rerun)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="table names (cartpole acrobot pendulum gfa)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/reference/secure_spread.md"))
    ap.add_argument("--cells", default=os.path.join(ROOT, "runs/secure_spread/cells.json"),
                    help="finished cells, so an interrupted run resumes (delete it, or --fresh, after a code change)")
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    rows = [r for r in [*ROWS, GFA] if not args.only or r.name.split()[0] in args.only]
    done = {} if args.fresh or not os.path.exists(args.cells) else json.load(open(args.cells))
    key = lambda name, seed, secure: f"{name}|{seed}|{'secure' if secure else 'seeded'}"  # noqa: E731
    jobs = [(r, s, False) for r in rows for s in r.table_seeds] + [(r, s, True) for r in rows for s in r.secure_seeds]
    todo = [j for j in jobs if key(j[0].name, j[1], j[2]) not in done]
    t0 = time.perf_counter()
    os.makedirs(os.path.dirname(args.cells), exist_ok=True)
    with ProcessPoolExecutor(args.jobs, initializer=worker_init) as pool:
        for name, seed, secure, value, wall in pool.map(_cell, todo):
            done[key(name, seed, secure)] = value
            with open(args.cells, "w") as f:
                json.dump(done, f, indent=1)
            print(f"{name} seed {seed} {'secure' if secure else 'seeded'}: {value:.2f} ({wall:.0f} s)", flush=True)
    results = {(r.name, s, sec): done[key(r.name, s, sec)] for r, s, sec in jobs}
    text = report(rows, results, time.perf_counter() - t0)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
