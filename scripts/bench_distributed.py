"""Rounds per second on CartPole with 1 and 2 processes (torchrun, gloo, one thread each), per learner
family (``--algos``: DP-PG, DP-NPG with the ssp oracle, DP-REBEL with dp_gd, or any other algo).

Each configuration is the same run (seeded noise, same seed): ``torchrun --nproc_per_node=N train.py
algo=<algo> ...``; rounds/s is ``rounds_done / wall_time_s`` of its summary.json (the training loop,
without process start-up), the start-up is reported apart. It also compares the runs' final policies: the
same ``policy_sha256`` (bit-identical), or else the largest parameter difference relative to the largest
parameter (the multi-process run is the single-process run computed in shards; a CPU whose kernels sum a
smaller batch in another order leaves float32 rounding differences, tests/training/test_distributed.py
allows 1e-5).
Usage: python scripts/bench_distributed.py [--algos dp_pg dp_npg dp_rebel] [--procs 1 2] [--users 40] [--rounds 8]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(n: int, args: list[str], run_dir: str) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={free_port()}",
           "train.py", *args, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{n} processes failed:\n{r.stderr[-2000:]}")
    return json.load(open(os.path.join(run_dir, "summary.json"))), wall


def max_rel_diff(tmp: str, n0: int, n: int) -> float:
    """max |a - b| / max(1, max |a|) over the two runs' final parameters (policy.pt)."""
    import torch

    a, b = (torch.load(os.path.join(tmp, f"n{k}", "policy.pt"), weights_only=True)["policy"] for k in (n0, n))
    return max(float((a[k] - b[k]).abs().max()) / max(1.0, float(a[k].abs().max())) for k in a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--algos", nargs="+", default=["dp_pg"])
    ap.add_argument("--users", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=None, help="rollouts per user (if the learner has group_size)")
    a = ap.parse_args()
    print(f"CartPole, {a.users} users/round, {a.rounds} rounds, seeded noise; cpus on this machine: {os.cpu_count()}")
    for algo in a.algos:
        args = [f"algo={algo}", "privacy.secure_rng=false", f"users_per_round={a.users}", f"rounds={a.rounds}",
                "eval_episodes=0", "progress=false", "checkpoint_every=1000", "logger.tensorboard=false"]
        if a.group_size:
            args.append(f"group_size={a.group_size}")
        print(f"{algo}:")
        base, sha = None, None
        with tempfile.TemporaryDirectory() as tmp:
            for n in a.procs:
                summary, wall = run(n, args, os.path.join(tmp, f"n{n}"))
                rps = summary["rounds_done"] / max(summary["wall_time_s"], 1e-9)
                base = base or rps
                same = "" if sha is None else ("  same policy_sha256" if summary["policy_sha256"] == sha else
                                               f"  policies differ by {max_rel_diff(tmp, a.procs[0], n):.2g} "
                                               f"(relative)")
                sha = sha or summary["policy_sha256"]
                print(f"  {n} process(es): {rps:7.3f} rounds/s  ({rps / base:4.2f}x)   loop {summary['wall_time_s']:6.1f} s, "
                      f"start-up and exit {wall - summary['wall_time_s']:5.1f} s{same}")


if __name__ == "__main__":
    main()
