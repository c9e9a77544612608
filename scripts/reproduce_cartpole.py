"""The paper's CartPole table ([PO] appendix; REFERENCE.md Sec. 1) through the project's CLI.

    nice -n 10 python scripts/reproduce_cartpole.py              # run the grid (resumable), then report
    python scripts/reproduce_cartpole.py --report                # table + plot from the runs on disk

Each cell is ``python train.py +experiment=cartpole_<algo> eps=<eps> seed=<seed>`` (CartPole-v1,
2x64 MLP, 100 rounds x 10 users, delta=1e-5), run by a pool of ``--jobs`` processes (one torch
thread each; default one per CPU core) through the Python API, longest cells first
(``--subprocess``: one ``train.py`` process per cell). Runs whose ``summary.json`` is complete are skipped. The report writes
``runs/reference/cartpole.md`` (mean final return, std over seeds, best-round mean; the paper's numbers
side by side) and ``runs/reference/cartpole.png`` (mean +- std return per round, one panel per family).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, SEEDED_NOTE, default_jobs, load_run, mean_std, train_in_process, worker_init  # noqa: E402

from dppo.training.rundir import complete, launch_train, write_report  # noqa: E402
# (family, experiment, eps, paper mean final, paper std, paper best-epoch mean)
ROWS = [
    ("PG", "cartpole_pg", None, 334.37, 25.25, 361.70),
    ("PG", "cartpole_dp_pg", 5.0, 190.34, 52.91, 199.17),
    ("PG", "cartpole_dp_pg", 3.0, 143.87, 22.88, 187.17),
    ("NPG", "cartpole_npg", None, 492.90, 10.04, 500.00),
    ("NPG", "cartpole_dp_npg", 5.0, 478.73, 28.05, 494.70),
    ("NPG", "cartpole_dp_npg", 3.0, 400.87, 65.37, 410.43),
    ("REBEL", "cartpole_rebel", None, None, None, None),
    ("REBEL", "cartpole_dp_rebel", 5.0, None, None, None),
    ("REBEL", "cartpole_dp_rebel", 3.0, None, None, None),
]
COST = {"cartpole_npg": 3.0, "cartpole_dp_npg": 3.0, "cartpole_rebel": 2.0, "cartpole_dp_rebel": 2.0}  # rough
# paper-protocol rows (G <= 2: one episode per user, or REBEL's pair), run with --paper-protocol
PAPER_ROWS = [
    ("PG", "cartpole_pg@G1", None, 334.37, 25.25, 361.70),       # the paper's rows again: its protocol is G = 1
    ("PG", "cartpole_dp_pg@G1", 5.0, 190.34, 52.91, 199.17),
    ("NPG", "cartpole_npg@G1", None, 492.90, 10.04, 500.00),
    ("NPG", "cartpole_dp_npg@G1", 5.0, 478.73, 28.05, 494.70),
    ("REBEL", "cartpole_rebel@G2", None, None, None, None),
    ("REBEL", "cartpole_dp_rebel@G2", 5.0, None, None, None),
]
PROTOCOL = {"G1": ["group_size=1", "algo.advantage=to_go"], "G2": ["group_size=2"]}
LABEL = {"cartpole_pg": "PG", "cartpole_dp_pg": "DP-PG", "cartpole_npg": "NPG", "cartpole_dp_npg": "DP-NPG",
         "cartpole_rebel": "REBEL", "cartpole_dp_rebel": "DP-REBEL"}


def run_dir(out: str, exp: str, eps, seed: int) -> str:
    return os.path.join(out, f"{exp.replace('@', '_')}_eps{'none' if eps is None else f'{eps:g}'}_s{seed}")


def label(exp: str) -> str:
    base, _, proto = exp.partition("@")
    return LABEL[base] + (f" ({proto}, paper protocol)" if proto else "")


def overrides(exp: str, eps, seed: int) -> list[str]:
    base, _, proto = exp.partition("@")
    return [f"+experiment={base}", *PROTOCOL.get(proto, []), f"seed={seed}", f"eps={'null' if eps is None else eps}",
            "progress=false",
            "logger.tensorboard=false",
            "eval_every=null",               # the final evaluation only, as the reference table was made
            "privacy.secure_rng=false"]      # seeded noise: the reference table must be reproducible


def launch(exp: str, eps, seed: int, path: str) -> tuple[str, int, float]:
    return launch_train(ROOT, overrides(exp, eps, seed), path)


def run_grid(args) -> float:
    jobs = [(exp, eps, s, run_dir(args.out, exp, eps, s)) for _, exp, eps, *_ in rows(args) for s in args.seeds
            if not args.only or exp in args.only]
    todo = [j for j in jobs if not complete(j[3])]
    # longest first, so the pool drains evenly (the G <= 2 rows collect ~8x fewer episodes)
    todo.sort(key=lambda j: -COST.get(j[0].partition("@")[0], 1.0) * (0.2 if "@" in j[0] else 1.0))
    t0 = time.perf_counter()
    pool = (ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"),
                                initializer=worker_init) if not args.subprocess else ThreadPoolExecutor(args.workers))
    with pool, tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="cartpole runs", unit="run") as bar:
        futures = [pool.submit(launch, *j) if args.subprocess else
                   pool.submit(train_in_process, overrides(*j[:3]), j[3]) for j in todo]
        for fut in as_completed(futures):
            path, rc, wall = fut.result()
            bar.set_postfix_str(f"{os.path.basename(path)} {wall:.0f}s rc={rc}")
            bar.update(1)
    return time.perf_counter() - t0


def rows(args):
    return ROWS + (PAPER_ROWS if args.paper_protocol else [])


def report(args, grid_wall: float | None) -> None:
    lines = ["# CartPole-v1: the paper's table reproduced", "",
             "Protocol ([PO] appendix): CartPole-v1, 2x64 tanh MLP, 100 rounds x 10 fresh users, delta = 1e-5; "
             "each user runs G rollouts from its own start state (one privacy unit: the same clip, sensitivity and "
             "eps for every G; G = 1 / REBEL's G = 2 rows are the paper's protocol), seeds " + ", ".join(map(str, args.seeds)) + ". Final return: 20 evaluation "
             "episodes on held-out reset seeds after the last round. Best-round mean: max over rounds of the "
             "seed-mean training return. eps: spent, from the accountant (parallel composition over one-pass rounds). "
             + SEEDED_NOTE,
             "", "| algorithm | eps | G | env steps / round | mean final return | std | best-round mean | paper mean | "
                 "paper std | paper best | eps spent | seeds | wall s/run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    curves = {}
    for fam, exp, eps, p_mean, p_std, p_best in rows(args):
        runs = [load_run(run_dir(args.out, exp, eps, s)) for s in args.seeds if complete(run_dir(args.out, exp, eps, s))]
        if not runs:
            lines.append(f"| {label(exp)} | {'-' if eps is None else f'{eps:g}'} | | | (not run) |||||||||")
            continue
        finals = [r[0]["final_return"] for r in runs]
        T = min(len(r[1]) for r in runs)
        per_round = [sum(r[1][t] for r in runs) / len(runs) for t in range(T)]
        curves[(fam, exp, eps)] = [[r[1][t] for r in runs] for t in range(T)]
        m, sd = mean_std(finals)
        spent = max(r[0]["epsilon_spent"] for r in runs)
        wall = sum(r[0]["wall_time_s"] for r in runs) / len(runs)
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        steps = [r[0]["env_steps_per_round"] for r in runs if r[0]["env_steps_per_round"] is not None]
        steps = f"{sum(steps) / len(steps):,.0f}" if steps else "-"
        lines.append(f"| {label(exp)} | {'-' if eps is None else f'{eps:g}'} | {runs[0][0]['group_size']} | {steps} | "
                     f"{m:.2f} | {sd:.2f} | {max(per_round):.2f} | "
                     f"{fmt(p_mean)} | {fmt(p_std)} | {fmt(p_best)} | {spent:.3g} | {len(runs)} | {wall:.0f} |")
    if grid_wall is not None:
        lines += ["", f"Grid wall time on this machine: {grid_wall / 60:.1f} min ({args.workers} run(s) at a time, "
                      f"one torch thread each)."]
    total = sum(load_run(run_dir(args.out, exp, eps, s))[0]["wall_time_s"] for _, exp, eps, *_ in rows(args) for s in args.seeds
                if complete(run_dir(args.out, exp, eps, s)))
    lines += ["", f"Sum of the runs' own wall times: {total / 60:.1f} min (divided by the runs at a time, when each has a free core)."]
    lines += ["", "Configs: `conf/experiment/cartpole_<algo>.yaml`; one cell: "
                  "`python train.py +experiment=cartpole_dp_npg eps=5 seed=0`.", ""]
    write_report(args.md, "\n".join(lines))
    plot(curves, args.png)


def plot(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = ["PG", "NPG", "REBEL"]
    colors = {None: "black", 5.0: "tab:blue", 3.0: "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, fam in zip(axes, fams):
        for (f, exp, eps), per_round in curves.items():
            if f != fam:
                continue
            ms = [mean_std(v) for v in per_round]
            x = list(range(1, len(ms) + 1))
            mean = [a for a, _ in ms]
            ax.plot(x, mean, color=colors[eps], label=f"{label(exp)}" + ("" if eps is None else f" eps={eps:g}"))
            ax.fill_between(x, [a - b for a, b in ms], [a + b for a, b in ms], color=colors[eps], alpha=0.2)
        ax.set_title(fam)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    axes[0].set_ylabel("training return (mean +- std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", "--workers", type=int, default=None, dest="workers",
                    help="runs at a time, one torch thread each (default: one per CPU core, at most 8)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "cartpole"))
    ap.add_argument("--md", default=os.path.join(ROOT, "runs", "reference", "cartpole.md"))
    ap.add_argument("--png", default=os.path.join(ROOT, "runs", "reference", "cartpole.png"))
    ap.add_argument("--only", nargs="+", help="run only these experiments (e.g. cartpole_dp_npg)")
    ap.add_argument("--report", action="store_true", help="only write the table and plot from runs on disk")
    ap.add_argument("--subprocess", action="store_true",
                    help="one `python train.py` subprocess per cell (default: a pool of worker processes, one thread "
                         "each, running cells through the Python API)")
    ap.add_argument("--paper-protocol", action="store_true", help="also the G <= 2 rows (one episode per user)")
    args = ap.parse_args()
    args.workers = args.workers or default_jobs()
    wall = None if args.report else run_grid(args)
    report(args, wall)


if __name__ == "__main__":
    main()
