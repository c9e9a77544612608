"""Threads chosen for the work: the default command's training time with ``threads=auto`` (one torch thread for a
small policy), with torch's own default (one thread per core: ``threads=<cores>``) and with ``OMP_NUM_THREADS=1``,
on an idle machine and beside busy processes, side by side in one run.

    python scripts/bench_threads.py [--busy 2] [--args rounds=50]

Each row runs ``python train.py <args>`` in a fresh process and reads the training time the run reports
(``wall_time_s`` of its summary: the rounds, not the imports); "busy" rows run ``--busy`` processes that spin on
the CPU for the whole run. The ratio is each row's time over the idle ``threads=auto`` row's.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def run(args: list[str], env: dict) -> float:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, os.path.join(ROOT, "train.py"), *args, f"hydra.run.dir={d}", "progress=false"]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(d, "summary.json")) as f:
            return float(json.load(f)["wall_time_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=2, help="busy processes beside the busy rows")
    ap.add_argument("--args", nargs="*", default=[], help="train.py arguments (default: the default command)")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    base["PYTHONWARNINGS"] = "ignore"
    rows = [("threads=auto (the default)", [], base),
            (f"torch's default threads (threads={cores})", [f"threads={cores}"], base),
            ("OMP_NUM_THREADS=1", [], {**base, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})]
    print(f"python train.py {' '.join(a.args)} on {cores} cores; training time (wall_time_s)\n")
    print("| threads | idle: s | idle: ratio | beside " + f"{a.busy} busy processes: s | busy: ratio |")
    print("|---|---|---|---|---|")
    results = {}
    for busy in (False, True):
        stop = mp.Event()
        spinners = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(a.busy if busy else 0)]
        for p in spinners:
            p.start()
        time.sleep(0.5 if spinners else 0)
        try:
            for label, extra, env in rows:
                results[label, busy] = run([*a.args, *extra], env)
        finally:
            stop.set()
            for p in spinners:
                p.join()
    ref = results[rows[0][0], False]
    for label, _, _ in rows:
        idle, loaded = results[label, False], results[label, True]
        print(f"| {label} | {idle:.1f} | {idle / ref:.2f}x | {loaded:.1f} | {loaded / ref:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
