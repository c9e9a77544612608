"""Pendulum-v1 (continuous actions, Gaussian MLP policy): PG / NPG / REBEL and their DP twins at eps = 5.

    python scripts/reproduce_pendulum.py --jobs 2              # run the grid (resumable), then report
    python scripts/reproduce_pendulum.py --report              # table from the runs on disk

Each cell is ``python train.py +experiment=pendulum_<algo> seed=<seed>`` (configs in conf/experiment/,
hyper-parameters chosen on the tuning seeds named there, reported on seeds 0, 1, 2), ``--jobs`` at a time,
one torch thread each, with seeded noise (``privacy.secure_rng=false``) so the table reproduces.
The report writes ``runs/reference/pendulum.md``: the return of the initial policy and of the final policy
on the same held-out evaluation episodes, the eps spent and the wall time per run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, mean_std  # noqa: E402

from dppo.training.rundir import complete, launch_train, write_report  # noqa: E402
ROWS = [("PG", "pendulum_pg"), ("DP-PG", "pendulum_dp_pg"), ("NPG", "pendulum_npg"),
        ("DP-NPG", "pendulum_dp_npg"), ("REBEL", "pendulum_rebel"), ("DP-REBEL", "pendulum_dp_rebel")]
TUNING_SEEDS = "seed 100 (40-round runs)"  # where conf/experiment/pendulum_*.yaml's values were selected


def run_dir(out: str, exp: str, seed: int) -> str:
    return os.path.join(out, f"{exp}_s{seed}")


def launch(exp: str, seed: int, path: str) -> tuple[str, int, float]:
    # seeded noise: a reproducible reference table
    # eval_every=null: the final evaluation only, as the reference table was made
    return launch_train(ROOT, [f"+experiment={exp}", f"seed={seed}", "progress=false", "eval_every=null",
                               "privacy.secure_rng=false"], path)


def initial_return(path: str) -> float:
    """The untrained policy of the run (same seed, same init) on the run's held-out evaluation episodes."""
    import dppo
    from dppo.build import build
    from dppo.training.logger import Logger

    cfg = dppo.load_run_config(path)
    cfg.progress = False
    return float(build(cfg, None, logger=Logger([])).learner.evaluate(int(cfg.eval_episodes), bool(cfg.eval.greedy)))


def describe(cfg) -> str:
    """The setting of the table, read from a run's saved config (so the text cannot drift from the runs)."""
    import inspect

    from omegaconf import OmegaConf

    from dppo.policies.gaussian import GaussianMLPPolicy

    defaults = {k: v.default for k, v in inspect.signature(GaussianMLPPolicy).parameters.items()}
    key = lambda k: OmegaConf.select(cfg, f"policy.{k}", default=defaults[k])  # noqa: E731 - the class's default
    hidden = list(key("hidden_sizes"))
    body = f"{len(hidden)} x {hidden[0]} {key('activation')}" if hidden else "linear"
    return (f"Gaussian MLP policy ({body}, state-independent log-std, {key('squash')}-squashed to the torque "
            f"Box [-2, 2]); each user runs G rollouts of 200 steps from its own start state (one privacy unit; "
            f"G per row below); rewards clipped to [-{cfg.reward_bound:g}, {cfg.reward_bound:g}] (the native "
            f"range, so no reward is changed); delta = {float(cfg.delta):.0e}")


def group_size(cfg) -> int:
    return int(cfg.group_size)


def report(args) -> str:
    rows, setting = [], None
    for label, exp in ROWS:
        paths = [run_dir(args.out, exp, s) for s in args.seeds if complete(run_dir(args.out, exp, s))]
        if not paths:
            rows.append(f"| {label} | | (not run) ||||||")
            continue
        sums = [json.load(open(os.path.join(p, "summary.json"))) for p in paths]
        cfg = dppo_config(paths[0])
        setting = setting or describe(cfg)
        init = mean_std([initial_return(p) for p in paths])
        fin = mean_std([s["final_return"] for s in sums])
        eps = "-" if sums[0]["eps"] is None else f"{sums[0]['eps']:g}"
        spent = sum(s["epsilon_spent"] for s in sums) / len(sums)
        wall = sum(s["wall_time_s"] for s in sums) / len(sums)
        rows.append(f"| {label} | {eps} | {init[0]:.1f} +- {init[1]:.1f} | {fin[0]:.1f} +- {fin[1]:.1f} | "
                    f"{spent:.3g} | {cfg.rounds} x {cfg.users_per_round} x {group_size(cfg)} | {len(sums)} | {wall:.0f} |")
    lines = ["# Pendulum-v1: continuous actions", "",
             (setting or "Gaussian MLP policy") + "; seeds " + ", ".join(map(str, args.seeds)) + " (hyper-parameters "
             f"chosen on {TUNING_SEEDS} only; the selected values and what was compared are in the comments of "
             "`conf/experiment/pendulum_*.yaml`). Initial / final: mean return of the initial / final stochastic "
             "policy on the same held-out evaluation episodes (mean +- std over seeds); seeded noise "
             "(`privacy.secure_rng=false`) so the table reproduces.", "",
             "| algorithm | eps | initial return | final return | eps spent | rounds x users x G | seeds | wall s/run |",
             "|---|---|---|---|---|---|---|---|", *rows,
             "", "Command: `python scripts/reproduce_pendulum.py --jobs 2` (runs under " + os.path.relpath(args.out, ROOT)
             + "; resumable, so the grid may also run in chunks with `--only`, then `--report`)."]
    return "\n".join(lines) + "\n"


def dppo_config(path: str):
    import dppo

    return dppo.load_run_config(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "pendulum"))
    ap.add_argument("--md", default=os.path.join(ROOT, "runs", "reference", "pendulum.md"))
    ap.add_argument("--jobs", "--workers", dest="jobs", type=int, default=2,
                    help="runs in parallel (one process and one torch thread each)")
    ap.add_argument("--only", nargs="+", metavar="EXPERIMENT")
    ap.add_argument("--report", action="store_true", help="only write the report from the runs on disk")
    args = ap.parse_args()
    if not args.report:
        jobs = [(exp, s, run_dir(args.out, exp, s)) for _, exp in ROWS for s in args.seeds
                if not args.only or exp in args.only]
        todo = [j for j in jobs if not complete(j[2])]
        with ThreadPoolExecutor(args.jobs) as pool, tqdm(total=len(jobs), initial=len(jobs) - len(todo),
                                                             desc="pendulum runs", unit="run") as bar:
            for fut in as_completed([pool.submit(launch, *j) for j in todo]):
                path, rc, wall = fut.result()
                bar.set_postfix_str(f"{os.path.basename(path)} {wall:.0f}s rc={rc}")
                bar.update(1)
    import torch

    torch.set_num_threads(1)
    text = report(args)
    write_report(args.md, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
