"""Cumulative regret of UBEV, PUCB (eps in {0.5, 1, 2, 5}) and PUCB's non-private twin (eps=null: PrivQ on
exact counts) on RiverSwim (H=20) and a random MDP (S=10, A=3, H=10): one JSON per run under --out, then
runs/reference/tabular.md (the DP-UBEV section of scripts/reproduce_dp_tabular.py below it is kept) and
tabular.png.

    python scripts/reproduce_tabular.py --T 1000 10000 100000 --seeds 0 1 2 3 4      # run (resumable)
    python scripts/reproduce_tabular.py --report                                     # table + plot only

Each run is a run like any other, through ``dppo.train`` (``algo=ubev|pucb env=riverswim|random_mdp
episodes=T``, seeded noise): one fresh user per episode from the one-pass sampler, PUCB's releases in the
ledger, eps from the basic accountant, and the run's directory under --out (config, journal, checkpoints,
progress.csv, summary.json) beside its JSON; the per-episode regret is read from the run's last checkpoint
(the learner's ``episode_regret``), the rest from its summary. PUCB is parameterized by the
number of episodes T (the counters' capacity and E_eps depend on it), so the regret at T = 1e3, 1e4,
1e5 comes from separate runs of that length. Runs already on disk are skipped, so the grid can be
filled in over several invocations; the report uses whatever runs exist and says how many seeds.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys

import torch
from tqdm.auto import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import QUIET, SEEDED, episode_regret, mean_std, parse_eps, run_config  # noqa: E402

from dppo.training.rundir import write_report  # noqa: E402

DP_SECTION = "<!-- dp_ubev section: scripts/reproduce_dp_tabular.py -->"
# the envs' config: RiverSwim (H = 20) and the random MDP (S = 10, A = 3, H = 10, its own seed 0)
ENVS = {"riverswim": ["env=riverswim", "env.horizon=20"],
        "random_mdp": ["env=random_mdp", "env.S=10", "env.A=3", "env.H=10", "env.seed=0"]}
ENV_LABEL = {"riverswim": "RiverSwim (S=6, A=2, H=20)", "random_mdp": "random MDP (S=10, A=3, H=10)"}


def overrides(env_name: str, algo: str, eps: float | None, seed: int, T: int, bound: str) -> list[str]:
    """One run's config: T episodes of one user each, 1000 a round (one log line and checkpoint step each)."""
    learner = ["algo=ubev"] if algo == "ubev" else ["algo=pucb", f"algo.count_error_bound={bound}"]
    return [*learner, *ENVS[env_name], f"eps={'null' if eps is None else eps}", f"seed={seed}", f"episodes={T}",
            f"algo.episodes_per_round={min(1000, T)}", "eval_every=null", *QUIET, *SEEDED]


def run_one(env_name: str, algo: str, eps: float | None, seed: int, T: int, bound: str, path: str) -> dict:
    """One run in ``path``; returns the curve of cumulative regret at log-spaced episodes and the run's facts."""
    summary = run_config(overrides(env_name, algo, eps, seed, T, bound), path)
    wall = summary["wall_time_s"]
    cum = torch.cumsum(episode_regret(path), 0)
    points = sorted({min(T, int(round(10 ** (k / 10)))) for k in range(0, 10 * int(math.log10(T)) + 1)} | {T})
    return {"env": env_name, "algo": algo, "eps": eps, "seed": seed, "T": T, "count_error_bound": bound,
            "cumulative_regret": float(cum[-1]), "curve_t": points, "curve": [float(cum[t - 1]) for t in points],
            "epsilon_spent": summary["epsilon_spent"], "E": summary["count_error_bound"],
            "optimal_value": summary["optimal_value"], "wall_s": wall,
            "gate_open_fraction": summary.get("gate_open_fraction") if algo == "pucb" else None,
            "users": summary["users_seen"], "episodes_per_s": T / max(wall, 1e-3)}


def _key(env, algo, eps, seed, T, bound):
    if algo == "ubev":
        tag = "ubev"
    elif eps is None:
        tag = "pucb_exact_counts"
    else:
        tag = f"pucb_eps{eps:g}" + ("" if bound == "reference" else f"_{bound}")
    return f"{env}_{tag}_s{seed}_T{T}"


def _run_and_save(job) -> str:
    out, (T, seed, env, algo, eps, bound) = job
    path = os.path.join(out, _key(env, algo, eps, seed, T, bound) + ".json")
    res = run_one(env, algo, eps, seed, T, bound, path.removesuffix(".json"))
    with open(path + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(path + ".tmp", path)
    return f"{os.path.basename(path)}: regret {res['cumulative_regret']:.1f} eps {res['epsilon_spent']:.3g} " \
           f"{res['episodes_per_s']:.0f} ep/s"


def run_grid(args) -> None:
    os.makedirs(args.out, exist_ok=True)
    configs = ([] if args.no_ubev else [("ubev", None)]) + [("pucb", e) for e in args.eps]
    jobs = [(T, seed, env, algo, eps, args.bound) for T in args.T for seed in args.seeds for env in args.envs
            for algo, eps in configs]
    jobs = [j for j in jobs if not os.path.exists(os.path.join(args.out, _key(j[2], j[3], j[4], j[1], j[0], j[5])
                                                                + ".json"))]
    jobs.sort(key=lambda j: -j[0])                      # long runs first
    bar = tqdm(total=len(jobs), desc="tabular grid", unit="run", dynamic_ncols=True)
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs, initializer=torch.set_num_threads, initargs=(1,)) as pool:
            for line in pool.imap_unordered(_run_and_save, [(args.out, j) for j in jobs]):
                bar.update()
                bar.write(line)
    else:
        for j in jobs:
            bar.write(_run_and_save((args.out, j)))
            bar.update()
    bar.close()


def _mean_std(xs):
    return mean_std(xs, single=float("nan"))


def report(args) -> None:
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(args.out, "*_T*.json")))]
    runs = [r for r in runs if r["algo"] == "ubev" or r["eps"] is None or r["count_error_bound"] == args.bound]
    if not runs:
        sys.exit(f"no runs under {args.out}")
    Ts = sorted({r["T"] for r in runs})
    lines = ["# Tabular regret: UBEV vs PUCB (eps-JDP)", "",
             "Produced by `python scripts/reproduce_tabular.py` (see docs/tabular.md). Cumulative expected regret "
             "sum_t (rho* - rho^{pi_t}), computed exactly from the true model, mean +- std over the seeds listed; "
             f"PUCB count error bound: `{args.bound}`. Each T is a separate run of T episodes "
             "(PUCB's counters and E_eps depend on T). PUCB's twin is PUCB with `eps=null` (the same learner on exact "
             "counts, E = 0); `PUCB/twin` is the privacy cost, `PUCB/UBEV` the cost against the best non-private "
             "learner of the table (UBEV's bonus is much narrower than PrivQ's).", ""]
    for T in Ts:
        lines += [f"## T = {T:,} episodes", "", "| env | algo | eps | seeds | final regret (mean +- std) | "
                  "PUCB/twin | PUCB/UBEV | E_eps | open gates at T | ep/s |", "|---|---|---|---|---|---|---|---|---|---|"]
        for env in args.envs:
            sel = [r for r in runs if r["T"] == T and r["env"] == env]
            ubev = [r["cumulative_regret"] for r in sel if r["algo"] == "ubev"]
            base = _mean_std(ubev)[0] if ubev else None
            twin = [r["cumulative_regret"] for r in sel if r["algo"] == "pucb" and r["eps"] is None]
            twin = _mean_std(twin)[0] if twin else None
            groups = [("ubev", None)] + sorted({("pucb", r["eps"]) for r in sel if r["algo"] == "pucb"},
                                               key=lambda x: -1 if x[1] is None else x[1])
            for algo, eps in groups:
                rs = [r for r in sel if r["algo"] == algo and r["eps"] == eps]
                if not rs:
                    continue
                m, sd = _mean_std([r["cumulative_regret"] for r in rs])
                ratio = "-" if algo == "ubev" or not base else f"{m / base:.2f}"
                to_twin = "-" if algo == "ubev" or eps is None or not twin else f"**{m / twin:.2f}**"
                E = "-" if algo == "ubev" else f"{rs[0]['E']:.3g}"
                gate = "-" if algo == "ubev" else f"{sum(r.get('gate_open_fraction') or 0 for r in rs) / len(rs):.2f}"
                speed = sum(r["episodes_per_s"] for r in rs) / len(rs)
                seeds = ",".join(str(r["seed"]) for r in rs)
                name = algo.upper() if algo == "ubev" or eps is not None else "PUCB (twin)"
                lines.append(f"| {ENV_LABEL[env]} | {name} | {eps if eps is not None else '-'} | {seeds} | "
                             f"{m:,.1f} +- {sd:,.1f} | {to_twin} | {ratio} | {E} | {gate} | {speed:,.0f} |")
        lines.append("")
    lines += ["## PUCB's regret ratio vs T: to its twin (eps=null) and to UBEV", "",
              "| env | eps | ratio to | " + " | ".join(f"T={T:,}" for T in Ts) + " |", "|---|---|---|" + "---|" * len(Ts)]
    for env in args.envs:
        for eps in sorted({r["eps"] for r in runs if r["algo"] == "pucb" and r["eps"] is not None}):
            for label, base_of in (("twin", lambda r: r["algo"] == "pucb" and r["eps"] is None),
                                   ("UBEV", lambda r: r["algo"] == "ubev")):
                cells = []
                for T in Ts:
                    u = [r["cumulative_regret"] for r in runs if r["env"] == env and r["T"] == T and base_of(r)]
                    p = [r["cumulative_regret"] for r in runs if r["env"] == env and r["T"] == T and r["algo"] == "pucb"
                         and r["eps"] == eps]
                    cells.append(f"{_mean_std(p)[0] / _mean_std(u)[0]:.2f}" if u and p else "n/a")
                lines.append(f"| {ENV_LABEL[env]} | {eps:g} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += _ablation_lines(args)
    lines += _bench_lines(os.path.join(args.out, "bench.json"))
    kept = ""                                   # the DP-UBEV section below (scripts/reproduce_dp_tabular.py)
    if os.path.exists(args.md):
        old = open(args.md).read()
        if DP_SECTION in old:
            kept = "\n" + old[old.index(DP_SECTION):]
    write_report(args.md, "\n".join(lines) + kept)
    _plot(runs, args)


def _plot(runs, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = max(r["T"] for r in runs)
    fig, axes = plt.subplots(1, len(args.envs), figsize=(6 * len(args.envs), 4.5), squeeze=False)
    for ax, env in zip(axes[0], args.envs):
        sel = [r for r in runs if r["env"] == env and r["T"] == T]
        for algo, eps in [("ubev", None)] + sorted({("pucb", r["eps"]) for r in sel if r["algo"] == "pucb"},
                                                   key=lambda x: -1 if x[1] is None else x[1]):
            rs = [r for r in sel if r["algo"] == algo and r["eps"] == eps]
            if not rs:
                continue
            t = rs[0]["curve_t"]
            mean = [sum(r["curve"][i] for r in rs) / len(rs) for i in range(len(t))]
            label = "UBEV" if algo == "ubev" else "PUCB twin (eps=null)" if eps is None else f"PUCB eps={eps:g}"
            ax.loglog(t, [max(v, 1e-3) for v in mean], label=f"{label} ({len(rs)} seeds)",
                      lw=2.5 if algo == "ubev" else 1.2)
        abl = [json.load(open(q)) for q in sorted(glob.glob(os.path.join(args.ablation_out, "*_T*.json")))]
        abl = [r for r in abl if r["env"] == env and r["T"] == T and r["algo"] == "pucb" and r["eps"] is not None]
        for eps in sorted({r["eps"] if r["eps"] is not None else -1.0 for r in abl}):
            rs2 = [r for r in abl if (r["eps"] if r["eps"] is not None else -1.0) == eps]
            t2 = rs2[0]["curve_t"]
            mean2 = [sum(r["curve"][i] for r in rs2) / len(rs2) for i in range(len(t2))]
            label = "PUCB exact counts" if eps < 0 else f"PUCB eps={eps:g}, tree bound"
            ax.loglog(t2, [max(v, 1e-3) for v in mean2], "--", lw=1.5, label=f"{label} ({len(rs2)} seeds)")
        ax.loglog(t, [t_ * rs[0]["optimal_value"] for t_ in t], "k:", lw=0.8, label="rho* x episodes")
        ax.set_title(ENV_LABEL[env])
        ax.set_xlabel("episodes")
        ax.set_ylabel("cumulative regret")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"UBEV vs PUCB, T = {T:,} (PUCB curves for different eps coincide: no count reached 2 E_eps)")
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)


def _bench_lines(path: str) -> list[str]:
    """The table written by scripts/bench_tabular.py, if it was run."""
    if not os.path.exists(path):
        return []
    rows = json.load(open(path))
    out = ["## Speed (scripts/bench_tabular.py, one thread, shared 2-core machine)", "",
           "| algo | env (S, A, H) | episodes timed | episodes/s | time for 100k episodes (s) | plan us | "
           "plans per episode | simulate us | counter update us | load avg |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['algo'].upper()} | {r['env']} ({r['S']}, {r['A']}, {r['H']}) | {r['episodes']:,} | "
                   f"{r['episodes_per_s']:,.1f} | {r['time_for_100k_s']:,.0f} | {r['plan_us']:,.0f} | "
                   f"{r.get('plans_per_episode', 1):.3g} | {r['simulate_us']:,.0f} | {r['counter_update_us']:,.0f} | "
                   f"{r['load_avg_1min']:.1f} |")
    return out + [""]


def _ablation_lines(args) -> list[str]:
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(args.ablation_out, "*_T*.json")))]
    if not runs:
        return []
    runs = [r for r in runs if r["eps"] is not None]            # the twin (exact counts) is in the tables above
    if not runs:
        return []
    out = ["## Ablation: PUCB with the tree mechanism's own error bound", "",
           "Same learners and seeds; `tree` = `count_error_bound=tree` (Chernoff bound of the tree counter, "
           "union over all streams and episodes, also valid w.p. 1 - beta').", "",
           "| T | env | PUCB variant | seeds | final regret (mean +- std) | E | open gates at T |",
           "|---|---|---|---|---|---|---|"]
    groups = sorted({(r["T"], r["env"], r["eps"] if r["eps"] is not None else -1.0, r["count_error_bound"])
                     for r in runs if r["algo"] == "pucb"})
    for T, env, eps, bound in groups:
        rs = [r for r in runs if r["algo"] == "pucb" and r["T"] == T and r["env"] == env
              and (r["eps"] if r["eps"] is not None else -1.0) == eps and r["count_error_bound"] == bound]
        m, sd = _mean_std([r["cumulative_regret"] for r in rs])
        label = "exact counts" if eps < 0 else f"eps={eps:g}, {bound} bound"
        gate = sum(r["gate_open_fraction"] for r in rs) / len(rs)
        out.append(f"| {T:,} | {ENV_LABEL[env]} | {label} | {','.join(str(r['seed']) for r in rs)} | "
                   f"{m:,.1f} +- {sd:,.1f} | {rs[0]['E']:.3g} | {gate:.2f} |")
    return out + [""]


def main() -> None:
    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--eps", type=parse_eps, nargs="+", default=[None, 0.5, 1.0, 2.0, 5.0],
                   help="PUCB eps values; 'none' = PUCB's twin on exact counts (E_eps = 0)")
    p.add_argument("--no-ubev", action="store_true", help="skip the UBEV runs (ablations)")
    p.add_argument("--ablation-out", default="runs/tabular_repro_ablation",
                   help="runs listed in an extra ablation table of the report (if the folder exists)")
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--bound", default="reference", choices=["reference", "tree"])
    p.add_argument("--out", default="runs/tabular_repro")
    p.add_argument("--md", default="runs/reference/tabular.md")
    p.add_argument("--png", default="runs/reference/tabular.png")
    p.add_argument("--report", action="store_true", help="only write the table and plot from existing runs")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (one thread each)")
    args = p.parse_args()
    if not args.report:
        run_grid(args)
    if args.report or not args.no_ubev:
        report(args)


if __name__ == "__main__":
    main()
