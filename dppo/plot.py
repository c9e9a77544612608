"""``python -m dppo.plot RUN_DIR... [--out FILE.png]``: learning curves of runs, from their public columns.

Plots the public evaluation return (``eval/return``: the released policy on held-out public episodes, every
``eval_every`` rounds and at the end) against the users' env steps (``global_step``) and, in a second panel,
against the eps spent (``privacy/epsilon``). Each RUN_DIR is a run directory (one with a ``progress.csv``) or
a folder of runs, e.g. a multirun sweep ``runs/multirun/<date>/<time>/`` with one numbered folder per job.
Runs whose configs (``.hydra/config.yaml``) differ only in the seed (and in how they log, checkpoint or how
often they evaluate) form one group, drawn as the mean over its seeds, evaluation by evaluation (matched by
round), with a band from the seeds' minimum to their maximum; groups are labelled by algorithm and eps (and
whatever else tells two of them apart).

Only the step axis and public columns of ``progress.csv`` are read (``READ_COLUMNS``: ``global_step``,
``rollout/round``, ``rollout/episodes``, ``eval/return``, ``privacy/epsilon``; never ``diag/*`` nor
``perf/*``), with the run's config and the ``algo``, ``eps``, ``env_id`` and ``seed`` of its
``summary.json``. The first panel's x axis is ``global_step``: the users' env steps when the run logged
diagnostics (a count of the users' own episode lengths, like ``summary.json``'s ``env_steps.users``: such a
figure is as private as the run's progress.csv), their episodes with ``logger.diagnostics=false``; ``--x
episodes`` draws every run against the users' episodes (cumulative ``rollout/episodes``), public in every run.

Writes a PNG (matplotlib, Agg backend): by default ``<RUN_DIR>/eval.png`` for one run, else ``plot.png`` in
the folder the arguments share; prints its path. Errors (a folder without a run, a run without evaluation
rows): one line, exit 2.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
from dataclasses import dataclass, field

import numpy as np
import yaml

from dppo.errors import ConfigError, DPPOError

STEP, ROUND, RETURN, EPSILON = "global_step", "rollout/round", "eval/return", "privacy/epsilon"
EPISODES = "rollout/episodes"
# the only columns of progress.csv read: the step axis and public ones (never diag/* nor perf/*)
READ_COLUMNS = (STEP, ROUND, RETURN, EPSILON, EPISODES)
# config keys that do not change what a run learns or how its return is measured: runs differing only there
# (and in the seed) are seeds of one group
NOT_GROUPED = ("seed", "resume", "hydra", "progress", "logger", "checkpoint_every", "callbacks", "eval_every",
               "device", "privacy.allow_over_target")
BAND = "min-max over seeds"


@dataclass
class Run:
    """One run's public evaluation rows and what groups and labels it."""

    path: str
    rounds: list[int]
    steps: list[float]
    episodes: list[float]     # the users' episodes up to each evaluation (cumulative rollout/episodes)
    eps: list[float]
    returns: list[float]
    config: dict = field(default_factory=dict)      # flattened .hydra/config.yaml (empty if absent)
    algo: str = "?"
    eps_target: float | None = None
    seed: object = None
    diagnostics: bool = True


@dataclass
class Group:
    """Runs of one config over seeds: per evaluation (matched by round), the mean x values and the return's
    mean, minimum and maximum over the seeds."""

    label: str
    runs: list[Run]
    rounds: list[int]
    steps: np.ndarray
    episodes: np.ndarray
    eps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray

    @property
    def private(self) -> bool:
        return self.runs[0].eps_target is not None


def flatten(d, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists as their JSON text)."""
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


def find_runs(paths: list[str]) -> list[str]:
    """The run directories (those holding a ``progress.csv``) that ``paths`` name or contain, in order."""
    runs = []
    for path in paths:
        if not os.path.isdir(path):
            raise ConfigError(f"{path}: no such directory")
        if os.path.isfile(os.path.join(path, "progress.csv")):
            runs.append(path)
            continue
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in ("checkpoints", ".hydra"))
            if "progress.csv" in files:
                found.append(root)
                dirs[:] = []          # a run holds no other run
        if not found:
            raise ConfigError(f"{path}: no progress.csv (neither a run directory nor a folder of runs)")
        runs += sorted(found, key=_natural)
    seen = set()
    return [r for r in runs if not (os.path.abspath(r) in seen or seen.add(os.path.abspath(r)))]


def _natural(path: str):
    """Sort key: multirun job folders by their number (``2_...`` before ``10_...``)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"[/_]", path)]


def read_public_rows(path: str) -> list[dict]:
    """The rows of ``progress.csv`` reduced to ``READ_COLUMNS`` (the others are never looked at)."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None) or []
        index = {name: i for i, name in enumerate(header) if name in READ_COLUMNS}
        rows = []
        for line in reader:
            rows.append({name: line[i] for name, i in index.items() if i < len(line) and line[i] != ""})
    return rows


def load_run(path: str) -> Run:
    """A run's evaluation rows (``eval/return`` present) with its step, round and eps, and its config."""
    every = read_public_rows(os.path.join(path, "progress.csv"))
    done = np.cumsum([float(r.get(EPISODES, 0.0)) for r in every]).tolist()
    episodes = [n for n, r in zip(done, every) if RETURN in r]
    rows = [r for r in every if RETURN in r]
    if not rows:
        raise ConfigError(f"{path}: no eval/return rows in progress.csv (a run with eval_episodes=0, or one "
                          f"stopped before its first evaluation)")
    config, summary = {}, {}
    cfg_path = os.path.join(path, ".hydra", "config.yaml")
    if os.path.isfile(cfg_path):
        with open(cfg_path) as f:
            config = yaml.safe_load(f) or {}
    sum_path = os.path.join(path, "summary.json")
    if os.path.isfile(sum_path):
        with open(sum_path) as f:
            summary = json.load(f)
    summary = {k: summary.get(k) for k in ("algo", "eps", "env_id", "seed")}   # nothing else of it is used
    flat = {k: v for k, v in flatten(config).items()
            if not any(k == n or k.startswith(n + ".") for n in NOT_GROUPED)}
    if not flat:    # no saved config: group by what summary.json says
        flat = {k: v for k, v in summary.items() if k != "seed" and v is not None} or {"run": path}
    algo = summary.get("algo") or _algo_name(config)
    eps = config.get("eps", summary.get("eps")) if config else summary.get("eps")
    diagnostics = bool(((config.get("logger") or {}).get("diagnostics", True)) if config else True)
    return Run(path=path, rounds=[int(float(r.get(ROUND, i))) for i, r in enumerate(rows)],
               steps=[float(r.get(STEP, "nan")) for r in rows], episodes=episodes,
               eps=[float(r.get(EPSILON, "nan")) for r in rows], returns=[float(r[RETURN]) for r in rows],
               config=flat, algo=str(algo),
               eps_target=None if eps is None else float(eps),
               seed=config.get("seed", summary.get("seed")), diagnostics=diagnostics)


def _algo_name(config: dict) -> str:
    algo = config.get("algo") or {}
    return str(algo.get("name") or str(algo.get("_target_", "?")).rsplit(".", 1)[-1])


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by config apart from the seed, in order of first appearance; each group's curve over the
    rounds evaluated in every one of its runs."""
    keyed: dict[str, list[Run]] = {}
    for run in runs:
        keyed.setdefault(json.dumps(run.config, sort_keys=True, default=str), []).append(run)
    labels = _labels([members[0] for members in keyed.values()])
    groups = []
    for label, members in zip(labels, keyed.values()):
        common = sorted(set.intersection(*(set(r.rounds) for r in members)))
        if not common:
            raise ConfigError(f"{members[0].path} and {members[1].path}: the seeds of one config share no "
                              f"evaluated round")
        ret = _table(members, "returns", common)
        seeds = len(members)
        mean = {attr: _table(members, attr, common).mean(0) for attr in ("steps", "episodes", "eps")}
        groups.append(Group(label=f"{label} ({seeds} seed{'s' if seeds > 1 else ''})", runs=members,
                            rounds=common, **mean, mean=ret.mean(0), low=ret.min(0), high=ret.max(0)))
    return groups


def _table(runs: list[Run], attr: str, rounds: list[int]) -> np.ndarray:
    """``[runs, rounds]``: each run's ``attr`` (returns, steps, episodes, eps) at its evaluation of each round."""
    return np.array([[getattr(r, attr)[r.rounds.index(rd)] for rd in rounds] for r in runs], dtype=np.float64)


def _labels(heads: list[Run]) -> list[str]:
    """``algo eps=E`` (or ``non-private``) per group, plus the config keys that tell apart groups that would
    otherwise share a label (at most three, then ``...``)."""
    base = [f"{r.algo} " + (f"eps={r.eps_target:g}" if r.eps_target is not None else "non-private") for r in heads]
    out = []
    for i, r in enumerate(heads):
        same = [h for j, h in enumerate(heads) if base[j] == base[i]]
        if len(same) == 1:
            out.append(base[i])
            continue
        keys = sorted(k for k in set().union(*(h.config for h in same))
                      if len({json.dumps(h.config.get(k), default=str) for h in same}) > 1)
        extra = [f"{k.removeprefix('env.').removeprefix('algo.')}={r.config.get(k)}" for k in keys[:3]]
        out.append(" ".join([base[i], *extra] + (["..."] if len(keys) > 3 else [])))
    return out


def prepare(paths: list[str], x: str = "steps") -> list[Group]:
    """What the figure draws: the runs ``paths`` name or contain, loaded and grouped (``x``: the axis the
    figure will use, ``steps`` or ``episodes``)."""
    runs = [load_run(p) for p in find_runs(paths)]
    if x == "steps" and len({r.diagnostics for r in runs}) > 1:
        raise ConfigError("some runs logged with logger.diagnostics=false (global_step = users' episodes) and some "
                          "with it on (users' env steps): plot them separately, or all with --x episodes")
    return group_runs(runs)


def default_out(paths: list[str], runs: int) -> str:
    """``<run>/eval.png`` for one run directory, else ``plot.png`` in the folder the arguments share."""
    if runs == 1 and len(paths) == 1:
        return os.path.join(paths[0], "eval.png")
    return os.path.join(os.path.commonpath([os.path.abspath(p) for p in paths]), "plot.png")


def draw(groups: list[Group], out: str, x: str = "steps") -> str:
    """The two-panel figure into ``out`` (PNG); the first panel against ``x``: ``steps`` (``global_step``) or
    ``episodes`` (the users' episodes, public in every run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x == "episodes":
        xlabel = "users' episodes (cumulative rollout/episodes)"
    elif groups[0].runs[0].diagnostics:
        xlabel = "users' env steps (global_step)"
    else:
        xlabel = "users' episodes (global_step)"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, g in enumerate(groups):
        color = f"C{k % 10}"
        many = len(g.runs) > 1
        xs = g.episodes if x == "episodes" else g.steps
        left.plot(xs, g.mean, color=color, marker="o", markersize=3, label=g.label)
        if many:
            left.fill_between(xs, g.low, g.high, color=color, alpha=0.2, linewidth=0)
        if g.private and np.isfinite(g.eps).all():
            right.plot(g.eps, g.mean, color=color, marker="o", markersize=3, label=g.label)
            if many:
                right.fill_between(g.eps, g.low, g.high, color=color, alpha=0.2, linewidth=0)
            # the final evaluation, with its spread over the seeds: the privacy-utility point of the group
            right.errorbar(g.eps[-1:], g.mean[-1:], yerr=[g.mean[-1:] - g.low[-1:], g.high[-1:] - g.mean[-1:]],
                           color=color, marker="s", markersize=6, capsize=3, linestyle="none")
    left.set_xlabel(xlabel)
    right.set_xlabel("eps spent (privacy/epsilon)")
    for ax in (left, right):
        ax.set_ylabel("eval/return (held-out public episodes)")
        ax.grid(alpha=0.3)
    left.legend(fontsize=8, loc="best")
    if not any(g.private for g in groups):
        right.text(0.5, 0.5, "non-private runs: no eps spent", ha="center", va="center", transform=right.transAxes)
    else:
        notes = ["squares: final evaluation"]
        if not all(g.private for g in groups):
            notes.append("private runs only")
        if any(g.private and np.ptp(g.eps) == 0 for g in groups):
            notes.append("vertical: eps all spent in round 1 (one-pass users, parallel composition)")
        right.set_title("\n".join(notes), fontsize=8)
    fig.suptitle(f"public evaluation return: mean over seeds, shaded {BAND}", fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dppo.plot",
                                description="Plot the public evaluation return of runs against the users' env steps "
                                            "and the eps spent; runs of one config over seeds: mean, min-max band.")
    p.add_argument("paths", metavar="RUN_DIR", nargs="+", help="run directories, or folders of runs (a multirun sweep)")
    p.add_argument("--out", metavar="FILE.png", default=None,
                   help="where to write the figure (default: RUN_DIR/eval.png for one run, else plot.png in the "
                        "folder the arguments share)")
    p.add_argument("--x", choices=("steps", "episodes"), default="steps",
                   help="the first panel's axis: steps (global_step: the users' env steps, or their episodes for "
                        "runs with logger.diagnostics=false) or episodes (the users' episodes, public in every run)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.out is not None and not args.out.lower().endswith(".png"):
            raise ConfigError(f"--out must name a .png file, got {args.out}")
        groups = prepare(args.paths, args.x)
        out = args.out or default_out(args.paths, sum(len(g.runs) for g in groups))
        draw(groups, out, args.x)
    except DPPOError as err:
        print(f"dppo: error: {str(err).splitlines()[0]}", file=sys.stderr, flush=True)
        return 2
    except (OSError, ValueError, yaml.YAMLError, json.JSONDecodeError) as err:
        print(f"dppo: error: {' '.join(str(err).split()) or type(err).__name__}", file=sys.stderr, flush=True)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
