"""Episodes per second of UBEV, PUCB and DP-UBEV (eps = 1, Gaussian square-root counter, pooled, released after
blocks growing 5%) on RiverSwim (H=20) and on a random MDP (S=100, A=5, H=20).

    python scripts/bench_tabular.py                      # default budgets, prints a markdown table
    python scripts/bench_tabular.py --riverswim 100000   # the full 100k-episode RiverSwim target
    python scripts/bench_tabular.py --baseline /path/to/other/checkout --algos dp_ubev --big 0
                                                         # before/after: that checkout's code vs this one,
                                                         # alternating runs in fresh processes, with ratios

Times whole trainer rounds of the real learners (planning + simulation + counter release + exact
regret bookkeeping), single-threaded, and splits one episode's cost into its parts. The machine load
(1-minute load average) is printed with each row, since other jobs share the cores. Results also go
to --json so that reproduce_tabular.py --report can show them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from dppo.algos.dp_ubev import DPUBEV
from dppo.algos.ucb import PUCB, UBEV
from dppo.envs.tabular import random_mdp, riverswim
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant


def _learner(algo: str, mdp, episodes: int):
    eps = None if algo == "ubev" else 1.0
    ctx = PrivacyContext(eps, 1e-5, accountant=make_accountant("zcdp" if algo == "dp_ubev" else "basic"),
                         noise=NoiseSource(0, secure=False))
    cls = {"ubev": UBEV, "pucb": PUCB, "dp_ubev": DPUBEV}[algo]
    return cls(mdp, privacy=ctx, seed=0, episodes=episodes, episodes_per_round=min(1000, episodes))


def _per_call_us(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def bench(algo: str, env_name: str, mdp, episodes: int) -> dict:
    learner = _learner(algo, mdp, episodes)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    for r in range(learner.num_rounds):
        learner.train_round(r)
    wall = time.perf_counter() - t0
    # one episode's parts, measured on the trained learner (no further releases: feed goes to a copy)
    n = max(3, min(200, episodes // 10))
    jit = learner._jitter(1)[0]
    pi = np.zeros((mdp.H, mdp.S), dtype=np.int64)
    plan_us = _per_call_us(lambda: learner._plan(), n)                    # one plan
    learner._greedy_into(jit, pi)
    plans = learner.stats.steps_done / episodes                           # plans per episode (one per release)
    pl = pi.tolist()
    U = learner.mdp.uniforms(n, torch.Generator().manual_seed(0)).tolist()
    it = iter(U)
    sim_us = _per_call_us(lambda: learner.mdp.episode_from_uniforms(pl, next(it)), n)
    states, actions, rewards = learner.mdp.episode_from_uniforms(pl, U[0])
    fresh = _learner(algo, mdp, n)
    fresh.stats.reserve(n)
    feed_us = _per_call_us(lambda: fresh._feed(states, actions, rewards), n)
    return {"algo": algo, "env": env_name, "S": mdp.S, "A": mdp.A, "H": mdp.H, "episodes": episodes,
            "wall_s": wall, "episodes_per_s": episodes / wall, "time_for_100k_s": 1e5 * wall / episodes,
            "plan_us": plan_us, "plans_per_episode": plans, "simulate_us": sim_us, "counter_update_us": feed_us,
            "load_avg_1min": load}


def main() -> None:
    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--riverswim", type=int, default=10000, help="RiverSwim episodes per learner")
    p.add_argument("--big", type=int, default=100, help="episodes on the S=100, A=5, H=20 random MDP")
    p.add_argument("--json", default="runs/tabular_repro/bench.json")
    p.add_argument("--algos", nargs="+", default=["ubev", "pucb", "dp_ubev"], choices=["ubev", "pucb", "dp_ubev"])
    p.add_argument("--baseline", default=None, help="another checkout: time its code and this one side by side")
    p.add_argument("--repeats", type=int, default=2, help="with --baseline: alternating runs per code")
    args = p.parse_args()
    if args.baseline:
        return compare(args)
    rows = []
    p_algos = args.algos
    for algo in p_algos:
        rows.append(bench(algo, "riverswim", riverswim(20), args.riverswim))
        if args.big > 0:
            rows.append(bench(algo, "random_mdp", random_mdp(S=100, A=5, H=20, seed=0), args.big))
    print("| algo | env (S, A, H) | episodes | episodes/s | 100k episodes (s) | plan us | plans per episode | "
          "simulate us | counter update us | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algo'].upper()} | {r['env']} ({r['S']}, {r['A']}, {r['H']}) | {r['episodes']:,} | "
              f"{r['episodes_per_s']:,.1f} | {r['time_for_100k_s']:,.0f} | {r['plan_us']:,.0f} | "
              f"{r['plans_per_episode']:.3g} | {r['simulate_us']:,.0f} | {r['counter_update_us']:,.0f} | "
              f"{r['load_avg_1min']:.1f} |")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)


def compare(args) -> None:
    """Run this script on the baseline checkout's code and on this one, alternating (fresh processes,
    one thread each), and print each measurement and the baseline / this ratio of the medians."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    codes = {"baseline": os.path.abspath(args.baseline), "this": here}
    results = {k: [] for k in codes}
    for rep in range(args.repeats):
        for name, root in codes.items():
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "bench.json")
                env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
                subprocess.run([sys.executable, os.path.abspath(__file__), "--riverswim", str(args.riverswim),
                                "--big", str(args.big), "--algos", *args.algos, "--json", out],
                               env=env, check=True, stdout=subprocess.DEVNULL, cwd=tmp)
                with open(out) as f:
                    results[name].append(json.load(f))
    print(f"| code | run | algo | env | episodes | 100k episodes (s) | plan us | counter update us | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in codes:
        for rep, rows in enumerate(results[name]):
            for r in rows:
                print(f"| {name} | {rep} | {r['algo'].upper()} | {r['env']} | {r['episodes']:,} | "
                      f"{r['time_for_100k_s']:,.1f} | {r['plan_us']:,.0f} | {r['counter_update_us']:,.0f} | "
                      f"{r['load_avg_1min']:.1f} |")
    for i, r in enumerate(results["this"][0]):
        med = {k: float(np.median([rows[i]["time_for_100k_s"] for rows in results[k]])) for k in codes}
        print(f"{r['algo'].upper()} {r['env']}: median 100k-episode time baseline {med['baseline']:.1f} s, "
              f"this {med['this']:.1f} s, speed-up x{med['baseline'] / med['this']:.2f}")


if __name__ == "__main__":
    main()
