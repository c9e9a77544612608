"""Which private learner should ``python train.py`` run? Each candidate's *defaults* (no experiment file) on
every env of the suite, side by side.

    python scripts/default_learner.py                       # dp_npg and dp_ppo, seeds 100-102, eps 5
    python scripts/default_learner.py --seeds 100 101 102 --algos dp_npg dp_ppo dp_pg

A newcomer who runs ``python train.py env.id=<their env>`` gets the default learner with its defaults, not a
tuned ``conf/experiment`` file; so the default is chosen on what the defaults do across envs. Per env, a run's
final return is scored between the uniformly random policy (0) and the best non-private result of the suite
for that env (1: ``runs/reference/suite.md``, SB3 or our twin, tuned); the chosen default is the learner with
the best mean score over the envs. Each run goes through ``dppo.train`` in this process (nothing written),
with the suite's env keys only (Pendulum: its env group, a Gaussian policy and its reward range).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

import dppo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "runs", "reference", "suite.md")
# env id -> (the keys the env needs whatever the learner, the uniformly random policy's return)
ENVS = {
    "CartPole-v1": ([], 22.0),
    "Acrobot-v1": (["env.id=Acrobot-v1"], -500.0),
    "Pendulum-v1": (["env=pendulum", "policy=gaussian", "reward_bound=16.3", "eval.greedy=true"], -1200.0),
    "MountainCar-v0": (["env.id=MountainCar-v0"], -200.0),
}


def best_non_private(path: str = SUITE) -> dict[str, float]:
    """Per env section of the suite's table: the best mean final return of a non-private row (no eps)."""
    out: dict[str, float] = {}
    with open(path) as f:
        sections = re.split(r"^## ", f.read(), flags=re.M)[1:]
    for section in sections:
        env = section.splitlines()[0].strip()
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) > 3 and line.startswith("|") and "eps=" not in cells[0] and re.match(r"-?\d", cells[3]):
                out[env] = max(out.get(env, float("-inf")), float(cells[3]))
    return out


def score(ret: float, random: float, best: float) -> float:
    """0 for the random policy, 1 for the best non-private result."""
    return (ret - random) / (best - random)


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102])
    parser.add_argument("--algos", nargs="+", default=["dp_npg", "dp_ppo"])
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--eps", default="5")
    parser.add_argument("--out", help="also write the report (from its heading on) to this Markdown file, e.g. "
                                      "runs/reference/default_learner.md")
    parser.add_argument("extra", nargs="*", help="more train.py overrides for every run (e.g. rounds=2 to try it)")
    args = parser.parse_args(argv)
    best = best_non_private()
    seeds = args.seeds
    table: dict[tuple[str, str], list[float]] = {}
    for env in args.envs:
        keys, _ = ENVS[env]
        for algo in args.algos:
            for seed in seeds:
                t0 = time.perf_counter()
                summary = dppo.train([f"algo={algo}", *keys, f"eps={args.eps}", f"seed={seed}", "progress=false",
                                      *args.extra])
                table.setdefault((env, algo), []).append(summary["final_return"])
                print(f"{env} {algo} seed={seed}: final_return={summary['final_return']:.1f} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    report = [f"Defaults at eps {args.eps}, seeds {' '.join(map(str, seeds))}: final return mean (min); "
              f"score = (mean - random) / (best non-private of the suite - random)", "",
              "| env | random | best non-private | " + " | ".join(args.algos) + " |",
              "|---|---|---|" + "---|" * len(args.algos)]
    scores: dict[str, list[float]] = {a: [] for a in args.algos}
    for env in args.envs:
        random = ENVS[env][1]
        cells = []
        for algo in args.algos:
            rets = table[env, algo]
            s = score(statistics.mean(rets), random, best[env])
            scores[algo].append(s)
            cells.append(f"{statistics.mean(rets):.1f} ({min(rets):.1f}), score {s:.2f}")
        report.append(f"| {env} | {random:.1f} | {best[env]:.1f} | " + " | ".join(cells) + " |")
    mean_scores = {a: statistics.mean(v) for a, v in scores.items()}
    report += ["| mean score | | | " + " | ".join(f"**{mean_scores[a]:.2f}**" for a in args.algos) + " |", "",
               f"default: algo={max(mean_scores, key=mean_scores.get)} (best mean score across the envs)"]
    print("\n" + "\n".join(report))
    if args.out:
        command = " ".join(["python scripts/default_learner.py", *(argv if argv is not None else sys.argv[1:])])
        with open(args.out, "w") as f:
            f.write(f"# Which learner `python train.py` runs\n\n`{command}` (secure noise, one thread)\n\n"
                    + "\n".join(report) + "\n")
    return mean_scores


if __name__ == "__main__":
    main()
