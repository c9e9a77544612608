"""The six policy-optimization algorithms on Acrobot-v1 with their env-agnostic defaults.

    nice -n 10 python scripts/reproduce_acrobot.py              # run the grid (resumable), then report
    python scripts/reproduce_acrobot.py --report                # table from the runs on disk

Each cell is ``python train.py +experiment=acrobot_<algo> seed=<seed>`` (Acrobot-v1, 2x64 MLP, 100 rounds
x 10 users, delta=1e-5, private rows at eps=5; ``conf/experiment/acrobot_*.yaml``: the algorithms'
defaults, nothing tuned), run by a pool of ``--jobs`` worker processes (one torch thread each) as in
``reproduce_cartpole.py``. The report writes ``runs/reference/acrobot.md``: mean final return per row
and, for each private row, the fraction of its non-private twin's improvement over the uniformly
random policy it recovers, (R_private - R_random) / (R_twin - R_random); R_random is the random
policy's mean return on the same held-out evaluation episodes (public reset seeds of each run seed).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import QUIET, ROOT, SEEDED, SEEDED_NOTE, load_run, mean_std, train_in_process, worker_init  # noqa: E402

from dppo.training.rundir import complete, write_report  # noqa: E402
EPS = 5.0
# (label, experiment, eps, non-private twin's experiment)
ROWS = [
    ("PG", "acrobot_pg", None, None),
    ("DP-PG", "acrobot_dp_pg", EPS, "acrobot_pg"),
    ("NPG", "acrobot_npg", None, None),
    ("DP-NPG", "acrobot_dp_npg", EPS, "acrobot_npg"),
    ("REBEL", "acrobot_rebel", None, None),
    ("DP-REBEL", "acrobot_dp_rebel", EPS, "acrobot_rebel"),
]
TARGET = 0.8  # every private row recovers >= 80% of its twin's improvement over the random policy


def run_dir(out: str, exp: str, eps, seed: int) -> str:
    return os.path.join(out, f"{exp}_eps{'none' if eps is None else f'{eps:g}'}_s{seed}")


def overrides(exp: str, eps, seed: int) -> list[str]:
    """One cell: the experiment, the seed and eps; the final evaluation only, as the reference table was made."""
    return [f"+experiment={exp}", f"seed={seed}", f"eps={'null' if eps is None else eps}", *QUIET,
            "eval_every=null", *SEEDED]


def random_policy_return(seed: int, episodes: int) -> float:
    """Mean return of the uniformly random policy on the evaluation episodes of run seed ``seed`` (the
    public "eval" reset seeds and sampling stream the learners' ``evaluate`` uses)."""
    import torch

    from dppo.envs.rollout import RolloutEngine
    from dppo.data import streams
    from dppo.envs.gym_env import GymEnvFactory

    env = GymEnvFactory("Acrobot-v1")

    class Uniform:
        def logits(self, obs):
            return torch.zeros(obs.shape[0], env.action_space.n)

    gen = streams.public_generator(seed, "eval", 0)
    uniforms = torch.rand((episodes, env.horizon), generator=gen, dtype=torch.float64)
    batch = RolloutEngine(env).run(Uniform(), streams.public_reset_seeds(seed, "eval", 0, episodes), uniforms,
                                   reward_bound=None)
    return float(batch.returns.mean())


def run_grid(args) -> float:
    jobs = [(exp, eps, s, run_dir(args.out, exp, eps, s)) for _, exp, eps, _ in ROWS for s in args.seeds]
    todo = [j for j in jobs if not complete(j[3])]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=worker_init) as pool:
        for fut in as_completed([pool.submit(train_in_process, overrides(*j[:3]), j[3]) for j in todo]):
            path, rc, wall = fut.result()
            print(f"{os.path.basename(path)}: {wall:.0f} s rc={rc}", flush=True)
    return time.perf_counter() - t0


def report(args, grid_wall: float | None) -> None:
    rand = [random_policy_return(s, 20) for s in args.seeds]
    r_rand = sum(rand) / len(rand)
    finals = {}
    lines = ["# Acrobot-v1: the six algorithms with their default settings", "",
             "Protocol: Acrobot-v1 (reward -1 a step until the tip swings above the bar, horizon 500), 2x64 tanh MLP, "
             "100 rounds x 10 fresh users, each user G rollouts from its own start state (one privacy unit), "
             f"delta = 1e-5, private rows at eps = {EPS:g}; seeds " + ", ".join(map(str, args.seeds)) + ". Settings: "
             "`conf/algo/<algo>.yaml` unchanged (`conf/experiment/acrobot_<algo>.yaml` only sets the env and the "
             "protocol). Final return: 20 evaluation episodes on held-out reset seeds after the last round. "
             f"Random policy (uniform actions, the same evaluation episodes): {r_rand:.2f} "
             f"(per seed {', '.join(f'{r:.1f}' for r in rand)}). Recovered: (R_private - R_random) / (R_twin - R_random), "
             f"target >= {TARGET:.0%}.", "",
             "| algorithm | eps | G | env steps / round | mean final return | std | per seed | recovered | eps spent | wall s/run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for lab, exp, eps, twin in ROWS:
        runs = [load_run(run_dir(args.out, exp, eps, s)) for s in args.seeds if complete(run_dir(args.out, exp, eps, s))]
        if not runs:
            lines.append(f"| {lab} | {'-' if eps is None else f'{eps:g}'} | | | (not run) ||||||")
            continue
        f = [r[0]["final_return"] for r in runs]
        m, sd = mean_std(f)
        finals[exp] = m
        rec = "-"
        if twin in finals and finals[twin] > r_rand:
            rec = f"{(m - r_rand) / (finals[twin] - r_rand):.0%}"
        steps = [r[0]["env_steps_per_round"] for r in runs if r[0]["env_steps_per_round"] is not None]
        steps = f"{sum(steps) / len(steps):,.0f}" if steps else "-"
        wall = sum(r[0]["wall_time_s"] for r in runs) / len(runs)
        lines.append(f"| {lab} | {'-' if eps is None else f'{eps:g}'} | {runs[0][0]['group_size']} | {steps} | {m:.2f} | "
                     f"{sd:.2f} | {' / '.join(f'{x:.1f}' for x in f)} | {rec} | "
                     f"{max(r[0]['epsilon_spent'] for r in runs):.3g} | {wall:.0f} |")
    if grid_wall is not None:
        lines += ["", f"Grid wall time: {grid_wall / 60:.1f} min ({args.jobs} run(s) at a time, one torch thread each)."]
    lines += ["", "One cell: `python train.py +experiment=acrobot_dp_npg seed=0`; the grid: "
                  "`python scripts/reproduce_acrobot.py`. " + SEEDED_NOTE, ""]
    write_report(args.md, "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", "--workers", type=int, default=2, dest="jobs", help="runs at a time (default 2)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "acrobot"))
    ap.add_argument("--md", default=os.path.join(ROOT, "runs", "reference", "acrobot.md"))
    ap.add_argument("--report", action="store_true", help="only write the table from the runs on disk")
    args = ap.parse_args()
    wall = None if args.report else run_grid(args)
    report(args, wall)


if __name__ == "__main__":
    main()
