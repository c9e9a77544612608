"""Peak memory and episodes/s of the tabular learners at the size of a real problem: UBEV, PUCB and DP-UBEV on
ICU-Sepsis (S = 717 with its terminal states, A = 25) at H = 20 and 50.

Each row is its own process (peak resident memory, ``ru_maxrss``, of that process alone) running ``dppo.train``
for ``--episodes`` patients (one user each). The statistics are pooled over h (the MDP is time-homogeneous)
and released / re-planned after growing blocks of episodes; the per-step layout of UBEV is shown refused
before anything is allocated, with the memory it would need.

    python scripts/bench_tabular_memory.py                      # pip install -e ".[icu]"
    python scripts/bench_tabular_memory.py --episodes 5000 --horizons 20
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_child_result, run_child  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POOLED = ["algo.pool_steps=true", "algo.pool_cap=1", "algo.block_growth=1.05"]
ROWS = {   # name: overrides (the private rows at eps 3)
    "UBEV, per step (the paper's layout)": ["algo=ubev", "algo.max_memory_gb=1.25"],
    "UBEV, pooled, blocks": ["algo=ubev", *POOLED, "algo.max_memory_gb=1.25"],
    "PUCB eps 3, pooled, blocks (Laplace tree)": ["algo=pucb", "eps=3", *POOLED, "algo.max_memory_gb=1.4"],
    "DP-UBEV eps 3 (defaults: pooled, blocks)": ["algo=dp_ubev", "eps=3", "algo.max_memory_gb=1.25"],
}


def child(env_id: str, name: str, horizon: int, episodes: int) -> dict:
    sys.path.insert(0, ROOT)
    import dppo

    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        summary = dppo.train([f"env.id={env_id}", *ROWS[name], f"env.horizon={horizon}", f"episodes={episodes}",
                              "progress=false", "eval_episodes=200", "seed=100"], run_dir=os.path.join(d, "r"))
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "episodes_per_s": episodes / seconds, "counter": summary.get("counter"),
            "final_return": summary.get("final_return")}


def run_row(env_id: str, name: str, horizon: int, episodes: int) -> dict:
    return run_child(__file__, [name, "--env", env_id, "--horizon", str(horizon), "--episodes", str(episodes)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="icu_sepsis:Sepsis/ICU-Sepsis-v2")
    ap.add_argument("--child")
    ap.add_argument("--horizon", type=int, default=20)
    ap.add_argument("--horizons", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--episodes", type=int, default=20000)
    args = ap.parse_args()
    if args.child:
        print_child_result(child(args.env, args.child, args.horizon, args.episodes))
        return
    print(f"{args.env}: {args.episodes:,} episodes, peak resident memory of one process\n")
    print("| learner | H | peak MiB | episodes/s | counter | return (200 episodes) |")
    print("|---|---|---|---|---|---|")
    for horizon in args.horizons:
        for name in ROWS:
            r = run_row(args.env, name, horizon, args.episodes)
            if "error" in r:
                print(f"| {name} | {horizon} | refused: {r['error'].split('Error: ', 1)[-1]} | | | |", flush=True)
            else:
                print(f"| {name} | {horizon} | {r['peak_mib']:.0f} | {r['episodes_per_s']:.0f} | "
                      f"{r['counter']} | {r['final_return']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
