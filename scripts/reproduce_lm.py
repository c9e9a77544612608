"""Reproduce the LM reference: ``python scripts/reproduce_lm.py`` -> runs/reference/lm.md, lm.json, lm.png.

Per task (``--tasks``: ``addition``, 3-digit addition with per-digit credit, ``+experiment=lm_addition``;
``exact``, unpadded addition where only the exact answer then the end earns 1, ``+experiment=lm_exact``), side
by side on the same tiny model, private prompts (each used once), reward and evaluator (the mean reward of
``env.eval_samples`` sampled completions on each of the 512 held-out *public* prompts, from one fixed public
stream; greedy decoding in a second column):
- the SFT start;
- the best non-private fine-tuning found with our code (``eps=null``) and with TRL's ``GRPOTrainer``
  (``scripts/trl_grpo.py``), each selected on seeds 100-102 over LoRA r = 2 on q, v, LoRA r = 8 on all seven
  projections and full fine-tuning, a few learning rates each (``--tune``; the grid is ``GRID`` below);
- with ``--twins``, the non-private twin of the private config (same adapter and step);
- our private runs (DP-PG in the GRPO form) at eps = 8 and eps = 3, delta = 1e-5;
and the share of the **best** non-private gain kept: (private - SFT) / (best non-private - SFT), the best
being the better of our row and TRL's (mean over seeds), per seed and for the means.

Seeds 0-2 by default (the selection used 100-102). ``--jobs`` runs at a time, each a one-thread subprocess
(``train.py`` or ``scripts/trl_grpo.py``), longest first; finished run directories under ``--work`` are
reused, interrupted dppo runs resumed. TRL rows run when ``trl`` is importable (``pip install trl``, the
``bench`` extra) unless ``--no-trl``; without it the table says so and the share is against our best.
Private runs use seeded noise (``privacy.secure_rng=false``: reproducible, labelled in the table).

``--tune`` runs the selection instead (seeds 100-102, successive halving: every grid point on seed 100,
the best ``--keep`` of each group on 101 and 102) and writes runs/reference/lm_tuning.md / .json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ADAPTERS, ROOT, TASKS  # noqa: E402

sys.path.insert(0, ROOT)

# the other tuned knobs, set explicitly in every run unless a job's extra overrides name them
KNOBS = {"users_per_round": "1024", "rounds": "16", "algo.optimizer": "adam", "++algo.kl_coef": "0.0"}


@dataclass(frozen=True)
class Job:
    """One run: ``impl`` dppo (``train.py``) or trl (``scripts/trl_grpo.py``)."""

    task: str
    impl: str
    adapter: str
    lr: float
    eps: float | None
    seed: int
    extra: tuple = ()        # further config overrides (m x rounds, optimizer, kl_coef)
    trl: tuple = ()          # further trl_grpo.py flags (--scheduler constant)

    @property
    def config(self) -> tuple:
        """Everything but the seed: the row a run belongs to."""
        return (self.task, self.impl, self.adapter, self.lr, self.eps, self.extra, self.trl)

    def name(self) -> str:
        tag = "np" if self.eps is None else f"eps{self.eps:g}"
        extra = "".join("_" + e.replace("algo.", "").replace("+", "").replace("=", "").replace("/", "")
                        for e in self.extra + self.trl).replace("--", "")
        return os.path.join(self.task, f"{self.impl}_{self.adapter}_lr{self.lr:g}_{tag}{extra}_s{self.seed}")

    def overrides(self) -> list[str]:
        ovr = [f"+experiment={TASKS[self.task]['experiment']}", f"seed={self.seed}",
               f"eps={'null' if self.eps is None else self.eps}", *ADAPTERS[self.adapter][0]]
        if self.impl == "dppo":
            ovr += [f"algo.lr={self.lr}", "progress=false", "privacy.secure_rng=false"]
        given = {e.split("=", 1)[0].lstrip("+") for e in self.extra}
        ovr += [f"{k}={v}" for k, v in KNOBS.items() if k.lstrip("+") not in given]
        return ovr + list(self.extra)

    def cost(self) -> float:
        """Relative run time (for longest-first scheduling)."""
        c = 4.0 if self.impl == "trl" else 1.0
        if self.eps is not None and self.adapter.startswith("full"):
            c *= 3.0
        return c

    def describe(self) -> str:
        bits = [ADAPTERS[self.adapter][1], f"lr {self.lr:g}"]
        for e in self.extra:
            k, _, v = e.lstrip("+").partition("=")
            bits.append({"users_per_round": "m", "rounds": "rounds", "algo.optimizer": "",
                         "algo.kl_coef": "kl_coef", "algo.momentum": "momentum"}.get(k, k) + (" " if k != "algo.optimizer" else "") + v)
        bits += [f"{k.lstrip('-').replace('-', '_')} {v}" for k, v in zip(self.trl[0::2], self.trl[1::2])]
        return ", ".join(b.strip() for b in bits)


# --tune: group -> grid points (adapter, lr, extra overrides, trl flags); each group keeps its best --keep
GRID = {
    "addition": {
        ("dppo", None, "lora_r2_qv"): [("lora_r2_qv", lr, (), ()) for lr in (0.01, 0.03)],
        ("dppo", None, "lora_r8_all"): [("lora_r8_all", lr, (), ()) for lr in (0.003, 0.01, 0.03)],
        ("dppo", None, "full"): [("full", lr, (), ()) for lr in (3e-4, 1e-3, 3e-3)],
        ("trl", None, "lora_r2_qv"): [("lora_r2_qv", lr, (), ()) for lr in (0.01, 0.03)],
        ("trl", None, "lora_r8_all"): [("lora_r8_all", lr, (), ()) for lr in (0.003, 0.01)],
        ("trl", None, "full"): [("full", lr, (), ()) for lr in (1e-3, 3e-3)]
                               + [("full", lr, (), ("--scheduler", "constant")) for lr in (5e-4, 1e-3, 2e-3)],
        # private (eps = 8): wider adapters and full fine-tuning, then the other config-level levers around
        # the best of them: more prompts per round and fewer rounds, SGD instead of Adam, a KL anchor (LoRA)
        ("dppo", 8.0, "adapter"): [("lora_r2_qv", 0.01, (), ()), ("lora_r8_all", 0.003, (), ()),
                                   ("lora_r8_all", 0.01, (), ()), ("full_linear", 3e-4, (), ()),
                                   ("full_linear", 1e-3, (), ()), ("full_linear", 2e-3, (), ()),
                                   ("full_linear", 3e-3, (), ())],
        ("dppo", 8.0, "rounds"): [("lora_r8_all", 0.003, (f"users_per_round={m}", f"rounds={16384 // m}"), ())
                                  for m in (2048, 4096)]   # full_linear at m = 4096: ~9 GB of per-user rows
                                 + [("full_linear", 1e-3, ("users_per_round=2048", "rounds=8"), ())],
        ("dppo", 8.0, "optimizer"): [("full_linear", lr, ("algo.optimizer=sgd", "algo.momentum=0.9"), ())
                                     for lr in (0.1, 0.3)],
        ("dppo", 8.0, "kl"): [("lora_r8_all", 0.003, (f"++algo.kl_coef={k}",), ()) for k in (0.02, 0.1)],
    },
    "exact": {
        ("dppo", None, "lora_r2_qv"): [("lora_r2_qv", lr, (), ()) for lr in (0.03, 0.05)],
        ("dppo", None, "lora_r8_all"): [("lora_r8_all", lr, (), ()) for lr in (0.001, 0.003, 0.01)],
        ("dppo", None, "full"): [("full", lr, (), ()) for lr in (5e-4, 1e-3, 2e-3)],
        ("trl", None, "lora_r2_qv"): [("lora_r2_qv", lr, (), ()) for lr in (0.03, 0.05)],
        ("trl", None, "lora_r8_all"): [("lora_r8_all", lr, (), ()) for lr in (0.003, 0.01, 0.02, 0.03)],
        ("trl", None, "full"): [("full", lr, (), ()) for lr in (1e-3, 2e-3)]
                               + [("full", lr, (), ("--scheduler", "constant")) for lr in (5e-4, 1e-3)],
        ("dppo", 8.0, "adapter"): [("lora_r2_qv", 0.03, (), ()), ("lora_r8_all", 0.003, (), ()),
                                   ("lora_r8_all", 0.01, (), ()), ("lora_r8_all", 0.02, (), ()),
                                   ("full_linear", 5e-4, (), ()), ("full_linear", 1e-3, (), ()),
                                   ("full_linear", 2e-3, (), ())],
        ("dppo", 8.0, "rounds"): [("lora_r8_all", 0.01, (f"users_per_round={m}", f"rounds={16384 // m}"), ())
                                  for m in (2048, 4096)],
        ("dppo", 8.0, "optimizer"): [("lora_r8_all", lr, ("algo.optimizer=sgd", "algo.momentum=0.9"), ())
                                     for lr in (0.3, 1.0)],
        ("dppo", 8.0, "kl"): [("lora_r8_all", 0.01, (f"++algo.kl_coef={k}",), ()) for k in (0.02, 0.1)],
    },
}
# Our twin clips each user's gradient to the private rows' C = 1 (the twins differ by the noise only); a
# non-private user need not clip: the best non-private config of ours, clipped and unclipped (C = 1e9: no
# user's norm reaches it), on every tuning seed (``--tune --groups clip``).
for _task in GRID:
    GRID[_task][("dppo", None, "clip")] = [("full", 1e-3, (), ()), ("full", 1e-3, ("max_grad_norm=1e9",), ())]
KEEP = {("dppo", 8.0, "adapter"): 2, ("dppo", None, "clip"): 2}   # groups that keep more than --keep grid points for the other seeds


def run_job(job: Job, work: str) -> tuple[str, int, float]:
    path = os.path.join(work, job.name())
    if job.impl == "dppo":
        from dppo.training.rundir import launch_train

        return launch_train(ROOT, job.overrides(), path)
    os.makedirs(path, exist_ok=True)
    args = [sys.executable, os.path.join(ROOT, "scripts", "trl_grpo.py"), "--out", path, "--lr", str(job.lr),
            *job.trl, *job.overrides()]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.path.abspath(ROOT))
    t0 = time.perf_counter()
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["?"]
        print(f"FAILED {job.name()}: {tail[0]}", file=sys.stderr, flush=True)
    return path, res.returncode, time.perf_counter() - t0


def result(job: Job, work: str) -> dict | None:
    """The finished run's summary (with its eval curve for dppo runs), or None."""
    from dppo.training.rundir import complete

    path = os.path.join(work, job.name())
    if not complete(path):
        return None
    with open(os.path.join(path, "summary.json")) as f:
        s = json.load(f)
    s["curve"] = eval_curve(path) if job.impl == "dppo" else []
    return s


def eval_curve(run_dir: str) -> list[tuple[int, float]]:
    """(rounds done, eval/return) at every evaluation of a dppo run."""
    import csv

    with open(os.path.join(run_dir, "progress.csv"), newline="") as f:
        return [(int(float(r["rollout/round"])) + 1, float(r["eval/return"])) for r in csv.DictReader(f)
                if r.get("eval/return") not in (None, "")]


def run_all(jobs: list[Job], work: str, n_jobs: int, label: str) -> None:
    """Run the unfinished jobs, ``n_jobs`` at a time, longest first; a failed run stops the script at the end."""
    from tqdm.auto import tqdm

    todo = sorted({j for j in jobs if result(j, work) is None}, key=lambda j: -j.cost())
    with ThreadPoolExecutor(max(1, n_jobs)) as pool:
        futures = {pool.submit(run_job, j, work): j for j in todo}
        with tqdm(total=len(set(jobs)), initial=len(set(jobs)) - len(todo), desc=label, unit="run") as bar:
            for fut in as_completed(futures):
                path, rc, wall = fut.result()
                job = futures[fut]
                bar.update(1)
                s = result(job, work) if rc == 0 else None
                if s is not None:
                    bar.write(f"{job.name()}: eval reward {s['final_return']:.4f} (greedy "
                              f"{s['final_greedy_return']:.4f}) in {wall:.0f} s")
    missing = [j.name() for j in jobs if result(j, work) is None]
    if missing:
        sys.exit(f"{len(missing)} run(s) did not finish (first: {missing[0]}); rerun to resume them")


def sft_start(task: str) -> tuple[float, float]:
    """The SFT model's own evaluation (sampled, greedy): a LoRA adapter starts at zero, so the initial policy
    of every row is the SFT model."""
    import torch

    from dppo.api import make_config
    from dppo.build import build

    torch.set_num_threads(1)
    cfg = make_config([f"+experiment={TASKS[task]['experiment']}", "eps=null", "progress=false"])
    learner = build(cfg).learner
    return learner.evaluate(cfg.eval_episodes, greedy=False), learner.evaluate(cfg.eval_episodes, greedy=True)


def trl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None


# ---- the reference -------------------------------------------------------------------------------------
def reference_rows(task: str, seeds: list[int], eps_list: list[float], with_trl: bool,
                   twins: bool = True) -> list[tuple[str, list[Job]]]:
    t = TASKS[task]
    rows = []
    adapter, lr, extra = t["best_dppo"]
    rows.append(("best_dppo", [Job(task, "dppo", adapter, lr, None, s, extra) for s in seeds]))
    if with_trl:
        adapter, lr, trl = t["best_trl"]
        rows.append(("best_trl", [Job(task, "trl", adapter, lr, None, s, (), trl) for s in seeds]))
    adapter, lr, extra = t["private"]
    if twins and (adapter, lr, extra) != t["best_dppo"]:
        rows.append(("twin", [Job(task, "dppo", adapter, lr, None, s, extra) for s in seeds]))
    for eps in eps_list:
        rows.append((f"eps{eps:g}", [Job(task, "dppo", adapter, lr, eps, s, extra) for s in seeds]))
    return rows


def reference(args) -> None:
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with_trl = trl_available() and not args.no_trl
    plan = {task: reference_rows(task, args.seeds, args.eps, with_trl, args.twins) for task in args.tasks}
    jobs = [j for rows in plan.values() for _, js in rows for j in js]
    sft = {}
    for task in args.tasks:
        sft[task] = sft_start(task)
        print(f"{task}: SFT start eval reward {sft[task][0]:.4f} (greedy {sft[task][1]:.4f})", flush=True)
    reused = any(result(j, args.work) is not None for j in jobs)
    run_all(jobs, args.work, args.jobs, "lm runs")
    minutes = (time.perf_counter() - t0) / 60
    lines, summary = [], {"seeds": args.seeds, "minutes": minutes, "jobs": args.jobs, "trl": with_trl, "tasks": {}}
    lines += [f"# Private RL fine-tuning of tiny LMs against the best non-private fine-tuning, seeds "
              f"{', '.join(map(str, args.seeds))}", "",
              f"`python scripts/reproduce_lm.py --jobs {args.jobs}`: {len(set(jobs))} runs, "
              f"{sum(result(j, args.work)['wall_time_s'] for j in set(jobs)) / 60:.0f} min of run time (each run's "
              f"own, one torch thread; {args.jobs} at a time on {os.cpu_count()} cores; this invocation "
              f"{minutes:.1f} min{', finished runs reused' if reused else ''})"
              + ("" if with_trl else "; TRL not installed: its rows are missing") + ".", "",
              "Each task: the tiny model (`scripts/build_tiny_lm.py`, SFT on public problems), 16,384 private prompts "
              "(users) each used once (1024 per round x 16 rounds unless stated), G = 8 completions per prompt, "
              "the same reward and evaluator for every row: the mean reward of 16 sampled completions on each of "
              "512 held-out public prompts (one fixed public stream; greedy decoding in the last column). "
              "Non-private rows: the best of a tuning on seeds 100-102 (`--tune`, runs/reference/lm_tuning.md); "
              "TRL 1.16 `GRPOTrainer` with its recommended settings (DAPO token-normalized loss, group-std "
              "rewards, global grad-norm clip 1.0, linear lr decay, beta 0), scored by our evaluator. Private "
              "rows: DP-PG in the GRPO form, per-user (per-prompt) clip C = 1, analytic Gaussian noise, "
              "parallel composition over rounds, delta = 1e-5, seeded noise (privacy.secure_rng=false: "
              "reproducible; the guarantee does not hold against anyone who knows the seed). **Share** = "
              "(private - SFT) / (best non-private - SFT), the best non-private being the better mean of our "
              "row and TRL's; per seed against that row's same seed.", ""]
    for task in args.tasks:
        lines += task_table(task, plan[task], sft[task], args, summary)
    lines += [f"Per-run wall clock (each run's own, one thread): " + ", ".join(
        f"{k} {v:.0f} s" for k, v in wall_by_kind(jobs, args.work).items()) + "."]
    from dppo.training.rundir import write_report

    write_report(os.path.join(args.out, f"{args.name}.md"), "\n".join(lines) + "\n")
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(args, plan, sft)


def wall_by_kind(jobs: list[Job], work: str) -> dict:
    kinds: dict[str, list[float]] = {}
    for j in jobs:
        kind = "TRL" if j.impl == "trl" else ("ours non-private" if j.eps is None else "ours private")
        kinds.setdefault(f"{kind} ({j.task})", []).append(result(j, work)["wall_time_s"])
    return {k: float(np.mean(v)) for k, v in kinds.items()}


ROW_NAMES = {"best_dppo": "best non-private, ours", "best_trl": "best non-private, TRL GRPO",
             "twin": "non-private twin of the private config"}


def task_table(task: str, rows, sft, args, summary) -> list[str]:
    stats = {}
    for key, js in rows:
        res = [result(j, args.work) for j in js]
        stats[key] = {"jobs": js, "eval": np.array([r["final_return"] for r in res]),
                      "greedy": np.array([r["final_greedy_return"] for r in res]),
                      "trainable": res[0].get("trainable_parameters")}
    np_keys = [k for k in ("best_dppo", "best_trl") if k in stats]
    best = max(np_keys, key=lambda k: stats[k]["eval"].mean())
    gain = stats[best]["eval"] - sft[0]
    out = [f"## {task}: {TASKS[task]['title']} (`+experiment={TASKS[task]['experiment']}`)", "",
           "| row | config | trainable | eval reward (mean +- std) | gain over SFT | share of the best gain | "
           "per seed | greedy |", "|---|---|---|---|---|---|---|---|",
           f"| SFT start | - | - | {sft[0]:.4f} | - | - | - | {sft[1]:.4f} |"]
    task_sum = {"sft": sft[0], "sft_greedy": sft[1], "best": best, "rows": {}}
    for key, _ in rows:
        s = stats[key]
        v = s["eval"]
        share_mean = (v.mean() - sft[0]) / (gain.mean())
        per_seed = (v - sft[0]) / gain
        name = ROW_NAMES.get(key) or f"DP-PG eps = {key[3:]}"
        bold = "**" if key.startswith("eps") else ""
        out.append(f"| {name} | {s['jobs'][0].describe()} | {s['trainable']:,} | {v.mean():.4f} +- {v.std():.4f} | "
                   f"{v.mean() - sft[0]:+.4f} | {bold}{share_mean:.2f}{bold}"
                   f"{' (best)' if key == best else ''} | {', '.join(f'{x:.2f}' for x in per_seed)} | "
                   f"{s['greedy'].mean():.4f} |")
        task_sum["rows"][key] = {"config": s["jobs"][0].describe(), "eval": v.tolist(), "greedy": s["greedy"].tolist(),
                                 "share_of_best": float(share_mean), "share_per_seed": per_seed.tolist()}
    if "twin" in stats:
        twin_gain = stats["twin"]["eval"].mean() - sft[0]
        kept = {k: (stats[k]["eval"].mean() - sft[0]) / twin_gain for k in stats if k.startswith("eps")}
        out += ["", "Against the private config's own non-private twin (the same adapter and step, a narrower "
                "baseline, for reference only): " + ", ".join(f"eps = {k[3:]} keeps {v:.2f}" for k, v in kept.items())
                + " of its gain."]
    out.append("")
    summary["tasks"][task] = task_sum
    return out


def plot(args, plan, sft) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.tasks), figsize=(6 * len(args.tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], args.tasks):
        for key, js in plan[task]:
            res = [result(j, args.work) for j in js]
            label = ROW_NAMES.get(key) or f"eps = {key[3:]}"
            if js[0].impl == "trl":
                v = np.array([r["final_return"] for r in res])
                ax.errorbar([16], [v.mean()], yerr=[[v.mean() - v.min()], [v.max() - v.mean()]], fmt="*", ms=12,
                            label=label)
                continue
            x = [0] + [c[0] for c in res[0]["curve"]]
            y = np.array([[sft[task][0]] + [v for _, v in r["curve"]] for r in res])
            ax.plot(x, y.mean(0), marker="o", label=label)
            ax.fill_between(x, y.min(0), y.max(0), alpha=0.15)
        ax.axhline(sft[task][0], color="gray", ls="--", label="SFT start")
        ax.set_xlabel("round")
        ax.set_ylabel("mean reward, held-out public prompts")
        ax.set_title(f"{task} (seeds {', '.join(map(str, args.seeds))})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, f"{args.name}.png"), dpi=120)


# ---- the selection (--tune) ----------------------------------------------------------------------------
def tune(args) -> None:
    t0 = time.perf_counter()
    with_trl = trl_available() and not args.no_trl
    first, rest = args.seeds[0], args.seeds[1:]
    groups = {(task, *g): pts for task in args.tasks for g, pts in GRID[task].items()
              if (with_trl or g[0] != "trl") and (args.groups is None or g[2] in args.groups)}

    def jobs_of(group, pt, seeds):
        task, impl, eps, _ = group
        adapter, lr, extra, trl = pt
        return [Job(task, impl, adapter, lr, eps, s, tuple(extra), tuple(trl)) for s in seeds]

    stage1 = [j for g, pts in groups.items() for pt in pts for j in jobs_of(g, pt, [first])]
    run_all(stage1, args.work, args.jobs, f"tune, seed {first}")
    keep = {}
    for g, pts in groups.items():
        scored = sorted(pts, key=lambda pt: -result(jobs_of(g, pt, [first])[0], args.work)["final_return"])
        keep[g] = scored[: KEEP.get(g[1:], args.keep)]
    stage2 = [j for g, pts in keep.items() for pt in pts for j in jobs_of(g, pt, rest)]
    run_all(stage2, args.work, args.jobs, f"tune, seeds {rest}")
    lines = [f"# LM tuning (seeds {', '.join(map(str, args.seeds))}): every grid point on seed {first}, the best "
             f"{args.keep} of each group (2 of the private adapters) on the others", "",
             f"`python scripts/reproduce_lm.py --tune{' --groups ' + ' '.join(args.groups) if args.groups else ''}`: "
             f"{len(set(stage1 + stage2))} runs, "
             f"{sum(result(j, args.work)['wall_time_s'] for j in set(stage1 + stage2)) / 60:.0f} min of run time "
             f"(each run's own, one thread; this invocation {(time.perf_counter() - t0) / 60:.1f} min, finished runs "
             f"reused). Eval reward: 16 samples on each of 512 public prompts; non-private unless eps is given. "
             f"Private runs: seeded noise (privacy.secure_rng=false: reproducible; the guarantee does not hold "
             f"against anyone who knows the seed).", ""]
    data = []
    for task in args.tasks:
        sft = sft_start(task)[0]
        lines += [f"## {task} (SFT start {sft:.4f})", "",
                  "| implementation | eps | config | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean |",
                  "|---|---|---|" + "---|" * (len(args.seeds) + 1)]
        for g, pts in groups.items():
            if g[0] != task:
                continue
            for pt in pts:
                vals = [result(j, args.work) for j in jobs_of(g, pt, args.seeds)]
                vals = [None if v is None else v["final_return"] for v in vals]
                done = [v for v in vals if v is not None]
                mean = f"{np.mean(done):.4f}" if len(done) == len(vals) else "-"
                j = jobs_of(g, pt, [first])[0]
                lines.append(f"| {'TRL GRPO' if j.impl == 'trl' else 'ours'} | {'-' if j.eps is None else f'{j.eps:g}'} "
                             f"| {j.describe()} | " + " | ".join("-" if v is None else f"{v:.4f}" for v in vals)
                             + f" | {mean} |")
                data.append({"task": task, "impl": j.impl, "eps": j.eps, "config": j.describe(), "values": vals})
        lines.append("")
    from dppo.training.rundir import write_report

    write_report(os.path.join(args.out, f"{args.name}_tuning.md"), "\n".join(lines) + "\n")
    with open(os.path.join(args.out, f"{args.name}_tuning.json"), "w") as f:
        json.dump(data, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--tune: 100 101 102)")
    ap.add_argument("--eps", type=float, nargs="+", default=[8.0, 3.0])
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one torch thread each)")
    ap.add_argument("--no-trl", action="store_true", help="skip the TRL rows even when trl is installed")
    ap.add_argument("--twins", action="store_true", help="also the non-private twin of each private config")
    ap.add_argument("--tune", action="store_true", help="run the selection grid (GRID) instead of the reference")
    ap.add_argument("--groups", nargs="+", help="--tune: only these grid groups (e.g. clip, full, adapter)")
    ap.add_argument("--keep", type=int, default=1, help="--tune: grid points per group kept for the other seeds")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "reference"))
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "lm_reproduce"))
    ap.add_argument("--name", default="lm")
    args = ap.parse_args()
    if args.seeds is None:
        args.seeds = [100, 101, 102] if args.tune else [0, 1, 2]
    os.makedirs(args.out, exist_ok=True)
    (tune if args.tune else reference)(args)


if __name__ == "__main__":
    main()
