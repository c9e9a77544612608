"""The suite's ICU-Sepsis section in one command: the table "ICU-Sepsis, 200,000 patients, seeds 0-9", written row by
row as each (row, seed) finishes, so it is completed across sittings.

    python scripts/reproduce_icu_sepsis.py                        # every row, seeds 0-9: runs what is not stored yet
    python scripts/reproduce_icu_sepsis.py --only q q_masked      # some rows (ids or globs: 'dp_ppo*'); --list names them
    python scripts/reproduce_icu_sepsis.py --only sb3_ppo --seeds 0 1 2
    python scripts/reproduce_icu_sepsis.py --report               # the table and the plot from the stored rows

ICU-Sepsis (``pip install -e ".[icu]"``; ``icu_sepsis:Sepsis/ICU-Sepsis-v2``): 716 states, 25 treatments, one patient
= one user = one episode, reward 1 if the patient survives. Two columns per row:

1. survival of the released policy: its exact expected return on the env's tables at the env's horizon (500 steps;
   ``dppo.envs.icu_sepsis_exact``), mean [min, max] over the seeds;
2. the mean survival of the patients treated while it learned: the mean return of all its training episodes. A raw
   statistic of the private data (the training patients' outcomes), reported as a diagnostic: no private learner
   releases it.

Rows: random, clinicians, optimal (exact; column 2: their own survival, optimal n/a); tabular Q-learning without and
with the env's admissible sets (``scripts/icu_sepsis_reference.py``, a child process per seed); SB3 PPO and
sb3-contrib MaskablePPO with their defaults (an optional extra, never a dependency: ``pip install sb3-contrib``; a
row whose package is missing is skipped with one line), 200,000 episodes each (a callback stops them), the greedy
action per state (MaskablePPO: among the admissible actions) evaluated exactly; dppo's learners through ``python
train.py +experiment=<file> eps=<eps> seed=<seed>`` (a child process; a row whose experiment file does not exist
yet is skipped with one line): the greedy action per state among the admissible actions (argmax of the policy's
logits; a tabular learner: the policy table its learner exposes), evaluated exactly; column 2 from the run's
``progress.csv`` (``diag/return`` weighted by the round's ``rollout/episodes``).

Every (row, seed) runs in a child process whose wall time and peak resident memory (``ru_maxrss`` from ``wait4``)
are recorded: the issue requires every ICU row to stay within 2 GB. Results go to ``runs/reference/icu_sepsis.json``
(per row and seed: both columns, wall, memory, the survival curve against patients) as each finishes, and the table
``icu_sepsis.md`` and the plot ``icu_sepsis.png`` (survival of the policy released so far against patients) are
rewritten after each. A (row, seed) already stored is skipped; ``--rerun`` runs it again. dppo runs live in
``runs/icu_sepsis/<row>_s<seed>/`` (a complete run there is evaluated, not retrained, even with ``--rerun``: delete
the directory to retrain; an interrupted one is resumed). Invocations may run side by side (other rows or seeds):
each result is merged into the JSON under a lock.
"""
from __future__ import annotations

import argparse
import datetime
import fnmatch
import importlib.util
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT  # noqa: E402

PATIENTS = 200_000
CHECKPOINT_EVERY = 10_000       # patients between the exact evaluations of Q-learning's and SB3's curves
ENV_ID = "Sepsis/ICU-Sepsis-v2"
MEMORY_LIMIT_MIB = 2048         # the bound on every ICU row's peak memory
REFERENCE = os.path.join(ROOT, "runs", "reference")
TITLE = "ICU-Sepsis, 200,000 patients, seeds 0-9"
# what every dppo row adds to its experiment file: a greedy evaluation on 2000 held-out episodes every 10 rounds (the
# curve; evaluation only), no progress bar, seeded noise (the table reproduces)
DPPO_EXTRA = ["eval_episodes=2000", "eval_every=10", "eval.greedy=true", "progress=false", "logger.tensorboard=false",
              "privacy.secure_rng=false"]

ROWS = [
    {"id": "random", "name": "random (uniform)", "kind": "exact"},
    {"id": "clinicians", "name": "clinicians (the env's policy)", "kind": "exact"},
    {"id": "optimal", "name": "optimal (value iteration)", "kind": "exact"},
    {"id": "q", "name": "tabular Q-learning", "kind": "q", "masked": False},
    {"id": "q_masked", "name": "tabular Q-learning, admissible sets", "kind": "q", "masked": True},
    {"id": "sb3_ppo", "name": "SB3 PPO (defaults)", "kind": "sb3", "masked": False, "package": "stable_baselines3"},
    {"id": "sb3_maskable_ppo", "name": "sb3-contrib MaskablePPO (defaults)", "kind": "sb3", "masked": True,
     "package": "sb3_contrib"},
    {"id": "ppo", "name": "PPO", "kind": "dppo", "experiment": "icu_sepsis_ppo", "eps": None},
    {"id": "dp_ppo_eps5", "name": "DP-PPO eps=5", "kind": "dppo", "experiment": "icu_sepsis_dp_ppo", "eps": 5},
    {"id": "dp_ppo_eps3", "name": "DP-PPO eps=3", "kind": "dppo", "experiment": "icu_sepsis_dp_ppo", "eps": 3},
    {"id": "dp_ppo_eps1", "name": "DP-PPO eps=1", "kind": "dppo", "experiment": "icu_sepsis_dp_ppo", "eps": 1},
    {"id": "dp_npg_eps3", "name": "DP-NPG eps=3", "kind": "dppo", "experiment": "icu_sepsis_dp_npg", "eps": 3},
    {"id": "model", "name": "model-based (non-private)", "kind": "dppo", "experiment": "icu_sepsis_model", "eps": None},
    {"id": "dp_model_eps3", "name": "DP model-based eps=3", "kind": "dppo", "experiment": "icu_sepsis_dp_model",
     "eps": 3},
    {"id": "dp_model_eps1", "name": "DP model-based eps=1", "kind": "dppo", "experiment": "icu_sepsis_dp_model",
     "eps": 1},
]
ROW = {r["id"]: r for r in ROWS}


# ---- the rows' commands --------------------------------------------------------------------------------------
def dppo_overrides(row: dict, seed: int) -> list[str]:
    return [f"+experiment={row['experiment']}", *([] if row["eps"] is None else [f"eps={row['eps']:g}"]),
            f"seed={seed}", *DPPO_EXTRA]


def command(row: dict, seed="<seed>") -> str:
    """The command that makes one seed of ``row`` (what the table prints)."""
    if row["kind"] == "exact":
        return "python scripts/icu_sepsis_reference.py"
    if row["kind"] == "q":
        return f"python scripts/icu_sepsis_reference.py --q-learning{' --masked' if row['masked'] else ''} --seeds {seed}"
    if row["kind"] == "sb3":
        return f"python scripts/reproduce_icu_sepsis.py --only {row['id']} --seeds {seed}"
    return "python train.py " + " ".join(f"seed={seed}" if o == "seed=0" else o for o in dppo_overrides(row, 0))


def unavailable(row: dict) -> str | None:
    """Why ``row`` cannot run here (one line), or None."""
    if importlib.util.find_spec("icu_sepsis") is None:
        return "icu_sepsis is not installed (pip install -e \".[icu]\")"
    if row.get("package") and importlib.util.find_spec(row["package"]) is None:
        return f"{row['package']} is not installed (an optional extra: pip install {row['package'].replace('_', '-')})"
    if row["kind"] == "dppo" and not os.path.isfile(os.path.join(ROOT, "conf", "experiment", f"{row['experiment']}.yaml")):
        return f"conf/experiment/{row['experiment']}.yaml does not exist yet"
    return None


# ---- the store: runs/reference/icu_sepsis.json ------------------------------------------------------------------
def load_store(path: str) -> dict:
    if os.path.isfile(path):
        with open(path) as f:
            store = json.load(f)
    else:
        store = {}
    store.setdefault("title", TITLE)
    store.setdefault("rows", {})
    return store


def save_store(store: dict, path: str) -> None:
    """Written whole to a temporary file, then renamed over ``path``: an interrupted write loses nothing stored."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(store, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def record(path: str, row: dict, seed, result: dict) -> dict:
    """Store one (row, seed) in the store at ``path`` under a lock, re-reading it first, so invocations running side
    by side (other rows, other seeds) keep each other's results. Returns the store as written."""
    import fcntl
    import hashlib
    import tempfile

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    key = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    with open(os.path.join(tempfile.gettempdir(), f"icu_sepsis_store_{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        store = load_store(path)
        put(store, row, seed, result)
        save_store(store, path)
    return store


def seed_key(seed) -> str:
    return "exact" if seed is None else str(int(seed))


def is_stored(store: dict, row_id: str, seed) -> bool:
    return seed_key(seed) in store["rows"].get(row_id, {}).get("seeds", {})


def put(store: dict, row: dict, seed, result: dict) -> None:
    """Store ``result`` (survival, train_return, wall_s, peak_mib, curve, ...) as ``row``'s ``seed``."""
    entry = store["rows"].setdefault(row["id"], {})
    entry.update(name=row["name"], kind=row["kind"], command=command(row))
    keep = {k: v for k, v in result.items() if k != "policy"}
    keep["date"] = datetime.date.today().isoformat()
    entry.setdefault("seeds", {})[seed_key(seed)] = keep
    entry["seeds"] = dict(sorted(entry["seeds"].items(), key=lambda kv: (kv[0] != "exact", int(kv[0])
                                                                         if kv[0].isdigit() else 0)))


def todo(store: dict, rows: list[dict], seeds: list[int], rerun: bool = False) -> list[tuple[dict, object]]:
    """The (row, seed) pairs to run: those not stored yet (every one with ``rerun``); exact rows have one seed, None."""
    out = []
    for row in rows:
        for seed in ([None] if row["kind"] == "exact" else seeds):
            if rerun or not is_stored(store, row["id"], seed):
                out.append((row, seed))
    return out


# ---- the table ---------------------------------------------------------------------------------------------------
def seed_list(keys) -> str:
    """'10 (0-9)', '2 (0, 5)', 'exact'."""
    seeds = sorted(int(k) for k in keys if str(k).isdigit())
    if not seeds:
        return "exact" if keys else "-"
    contiguous = seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2
    return f"{len(seeds)} ({f'{seeds[0]}-{seeds[-1]}' if contiguous else ', '.join(map(str, seeds))})"


def stat(values, nd: int = 4) -> str:
    """'mean [min, max]' of the values that are numbers ('v' for one value, 'n/a' for none)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return f"{vals[0]:.{nd}f}"
    return f"{sum(vals) / len(vals):.{nd}f} [{min(vals):.{nd}f}, {max(vals):.{nd}f}]"


def table_lines(store: dict, rows: list[dict] = ROWS) -> list[str]:
    lines = ["| row | seeds | survival of the released policy (exact), mean [min, max] | patients treated while "
             "learning: mean survival, mean [min, max] | wall s/run | peak memory MiB (max) |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        seeds = store["rows"].get(row["id"], {}).get("seeds", {})
        if not seeds:
            lines.append(f"| {row['name']} | 0 | (not run) | | | |")
            continue
        recs = list(seeds.values())
        walls = [r.get("wall_s") for r in recs if r.get("wall_s") is not None]
        mems = [r.get("peak_mib") for r in recs if r.get("peak_mib") is not None]
        lines.append(f"| {row['name']} | {seed_list(seeds)} | {stat(r.get('survival') for r in recs)} | "
                     f"{stat(r.get('train_return') for r in recs)} | "
                     f"{f'{sum(walls) / len(walls):.0f}' if walls else '-'} | {f'{max(mems):.0f}' if mems else '-'} |")
    return lines


def report_text(store: dict) -> str:
    mems = [(row_id, r["peak_mib"]) for row_id, e in store["rows"].items() for r in e.get("seeds", {}).values()
            if r.get("peak_mib") is not None]
    over = sorted({row_id for row_id, m in mems if m > MEMORY_LIMIT_MIB})
    memory = ("no row measured yet" if not mems else
              f"every measured run within {MEMORY_LIMIT_MIB} MiB (max {max(m for _, m in mems):.0f} MiB)" if not over
              else f"**over {MEMORY_LIMIT_MIB} MiB**: {', '.join(over)}")
    lines = [f"# {TITLE}", "",
             f"ICU-Sepsis (`icu_sepsis:{ENV_ID}`, `pip install -e \".[icu]\"`): 716 states, 25 treatments, one patient = "
             "one user = one episode, reward 1 if the patient survives. Each learner treats 200,000 patients (episodes) "
             "and releases a policy.", "",
             "* **Survival of the released policy**: its exact expected return on the env's tables at the env's horizon "
             "(500 steps), from the initial distribution (`dppo.envs.icu_sepsis_exact.survival`): the greedy action per "
             "state (for dppo's neural learners and MaskablePPO among the env's admissible actions, "
             "`tables()[\"admissible\"]`; SB3 PPO over all 25; Q-learning as its variant says), mean [min, max] over the "
             "seeds.",
             "* **Patients treated while learning**: the mean return of all the learner's training episodes (for dppo's "
             "runs: `diag/return` of `progress.csv` weighted by each round's patients). **A raw diagnostic of the private "
             "data** (the training patients' own outcomes, not released by any private learner): it shows what learning "
             "cost the patients it learned from, and it carries no privacy guarantee.",
             "* Rows: random / clinicians (the policy shipped with the env) / optimal (value iteration) are exact "
             "(column 2: their own survival; optimal: n/a). Tabular Q-learning (`scripts/icu_sepsis_reference.py`, not "
             "part of the package): Q0 = 0.5, step size 1 / N(s, a)^0.6, epsilon linear from 1 to 0.05 over the first "
             "30% of the patients, undiscounted, without and with the env's admissible sets (masked exploration and "
             "masked max). SB3 PPO and sb3-contrib MaskablePPO: the libraries' defaults, stopped after 200,000 episodes. "
             "dppo's rows: their `conf/experiment/icu_sepsis_*.yaml` (defaults, e.g. `env.action_mask=auto`), plus a "
             "greedy evaluation on 2000 held-out episodes every 10 rounds (the curve only).",
             "* Settings (Q-learning's and the experiment files') chosen on seeds 100-102; the table's seeds (0-9) were "
             "not used to choose them (SB3: the libraries' defaults, untuned). Noise: seeded "
             "(`privacy.secure_rng=false`) for dppo's private rows, so they reproduce on the machine that made them.",
             f"* Wall: seconds of the child process that made one seed (one thread, `OMP_NUM_THREADS=1`, on a shared "
             f"2-core machine, so it moves with the machine's load; each run's date is in the JSON); peak memory: its peak "
             f"resident memory (`ru_maxrss`), max over seeds. The issue's bound "
             f"is 2 GB per row: {memory}.", "",
             *table_lines(store), "",
             "Command: `python scripts/reproduce_icu_sepsis.py` (every row, seeds 0-9; a (row, seed) already in "
             "`runs/reference/icu_sepsis.json` is skipped, so the table is completed across sittings; `--only ROW ...`, "
             "`--seeds ...`). One seed of each row:", ""]
    lines += [f"* {row['name']}: `{command(row)}`" for row in ROWS]
    lines += ["", "Plot: `runs/reference/icu_sepsis.png`, survival of the policy released so far against patients (Q-learning "
              "and SB3: exact, every 10,000 patients; dppo's rows: their greedy evaluation, `eval/return`, on 2000 held-out "
              "episodes, a sampled estimate whose error is shared by every point of a run's curve, as each evaluation "
              "replays the same public patients: on 2026-12-06 PPO seed 0 ended at 0.7765 there, 0.7953 on 10,000 episodes, 0.7963 "
              "exact).", ""]
    return "\n".join(lines)


def write_report(store: dict, md: str, png: str | None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(md)), exist_ok=True)
    with open(md, "w") as f:
        f.write(report_text(store))
    if png:
        try:
            plot(store, png)
        except Exception as err:  # noqa: BLE001 - the table is written; the plot says why it is not
            print(f"plot not written: {type(err).__name__}: {err}", file=sys.stderr)


def mean_curve(curves: list[list]) -> tuple[list, list, list, list]:
    """(x, mean, min, max) over the curves, each a step function: its last point at or before x."""
    grid = sorted({float(x) for c in curves for x, _ in c})
    mean, low, high = [], [], []
    for g in grid:
        vals = [next((y for x, y in reversed(c) if x <= g), c[0][1]) for c in curves]
        mean.append(sum(vals) / len(vals))
        low.append(min(vals))
        high.append(max(vals))
    return grid, mean, low, high


def plot(store: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 - the patients axis' thousands separators

    fig, ax = plt.subplots(figsize=(9, 5.5))
    k = 0
    for row in ROWS:
        seeds = store["rows"].get(row["id"], {}).get("seeds", {})
        if row["kind"] == "exact":
            rec = seeds.get("exact")
            if rec:
                ax.axhline(rec["survival"], color="gray", linestyle=":" if row["id"] != "optimal" else "--",
                           linewidth=1)
                ax.annotate(f"{row['name']} {rec['survival']:.4f}", (0.99, rec["survival"]),
                            xycoords=("axes fraction", "data"), fontsize=7, ha="right",
                            va="top" if row["id"] == "random" else "bottom", color="dimgray")
            continue
        curves = [r["curve"] for r in seeds.values() if r.get("curve")]
        if not curves:
            continue
        x, mean, low, high = mean_curve(curves)
        color = f"C{k % 10}"
        k += 1
        source = " (sampled eval)" if row["kind"] == "dppo" else ""
        ax.plot(x, mean, color=color, marker="o", markersize=2.5, label=f"{row['name']}{source}, {len(curves)} seeds")
        if len(curves) > 1:
            ax.fill_between(x, low, high, color=color, alpha=0.15, linewidth=0)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("patients (training episodes)")
    ax.set_ylabel("survival of the policy released so far")
    ax.set_title(f"{TITLE}: mean over seeds, band min-max", fontsize=10)
    ax.grid(alpha=0.3)
    if k:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 0.93))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the released policies, evaluated exactly ---------------------------------------------------------------------
def admissible_table():
    import numpy as np

    from dppo.envs.icu_sepsis_exact import tables

    adm = np.asarray(tables()["admissible"], bool)
    return adm | ~adm.any(1, keepdims=True)            # a state without admissible actions (terminal): all of them


def masked_argmax(logits, admissible):
    import numpy as np

    return np.where(admissible, np.asarray(logits, np.float64), -np.inf).argmax(1)


def tabular_policy(saved):
    """The policy table of a tabular / model-based learner (an action per state [S] or probabilities [S, A]).

    Hook: the learner exposes it as ``policy_table()`` (or ``greedy_policy()`` / a ``policy_table`` attribute). A
    learner with none of them raises, naming what to add."""
    import numpy as np

    learner = saved.learner
    for name in ("policy_table", "greedy_policy", "released_policy"):
        got = getattr(learner, name, None)
        if got is not None:
            table = got() if callable(got) else got
            return np.asarray(table.detach().cpu().numpy() if hasattr(table, "detach") else table)
    raise NotImplementedError(f"{type(learner).__name__} exposes no policy table: give it a policy_table() method "
                              f"(an action per state, or [S, A] probabilities) for scripts/reproduce_icu_sepsis.py")


def released_actions(saved, admissible):
    """The released policy of a loaded dppo run: the policy table of a learner that exposes one (``tabular_policy``:
    the model-based and tabular learners, whose ``policy.logits`` may be their behaviour policy), else the greedy
    action per state, argmax of the policy's logits for observation s among the admissible actions."""
    import numpy as np
    import torch

    policy = saved.policy
    S = admissible.shape[0]
    if policy is None or any(hasattr(saved.learner, n) for n in ("policy_table", "greedy_policy", "released_policy")):
        return tabular_policy(saved)[:S]     # a learner with a policy table releases it (not its behaviour logits)
    base = policy.policy if getattr(policy, "masked", False) and hasattr(policy, "policy") else policy
    with torch.no_grad():
        try:
            logits = base.logits(torch.arange(S, dtype=torch.float32)[:, None])   # the state index as observation
        except (RuntimeError, ValueError):
            logits = base.logits(torch.eye(S))                                   # a one-hot observation
    return masked_argmax(np.asarray(logits.cpu().numpy()), admissible)


def dppo_result(path: str) -> dict:
    """Both columns and the curve of a finished dppo run in ``path``."""
    import csv

    import dppo
    from dppo.envs.icu_sepsis_exact import survival

    adm = admissible_table()
    saved = dppo.load(path)
    policy = released_actions(saved, adm)
    with open(os.path.join(path, "progress.csv")) as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(path, "summary.json")) as f:
        summary = json.load(f)
    return {"survival": survival(policy), **progress_columns(rows), "epsilon_spent": summary.get("epsilon_spent"),
            "train_wall_s": summary.get("wall_time_s"), "run_dir": os.path.relpath(path, ROOT),
            "curve_source": "eval/return: greedy, 2000 held-out episodes"}


def progress_columns(rows: list[dict]) -> dict:
    """From a run's ``progress.csv`` rows: ``train_return`` (``diag/return`` weighted by ``rollout/episodes``; None
    without diagnostics), ``patients`` (the users' episodes) and the ``curve`` [[patients so far, eval/return]]."""
    done, num, den, curve = 0.0, 0.0, 0.0, []
    for r in rows:
        n = float(r.get("rollout/episodes") or r.get("rollout/users") or 0.0)
        done += n
        if r.get("diag/return") not in (None, ""):
            num += float(r["diag/return"]) * n
            den += n
        if r.get("eval/return") not in (None, ""):
            curve.append([done, float(r["eval/return"])])
    return {"train_return": num / den if den else None, "patients": int(done), "curve": curve}


# ---- SB3 (a child process per seed) ------------------------------------------------------------------------------
def sb3_child(row: dict, seed: int, patients: int, result: str) -> None:
    """One SB3 run of ``row`` (PPO or MaskablePPO, the libraries' defaults) on ``patients`` episodes; writes the
    result JSON (survival of the greedy policy, the training episodes' mean return, the curve every
    CHECKPOINT_EVERY patients)."""
    import gymnasium as gym
    import icu_sepsis  # noqa: F401 - registers the env
    import numpy as np
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor

    from dppo.envs.icu_sepsis_exact import survival

    torch.set_num_threads(1)
    adm = admissible_table()
    S = adm.shape[0]
    env = Monitor(gym.make(ENV_ID))
    if row["masked"]:
        from sb3_contrib import MaskablePPO as cls
        from sb3_contrib.common.wrappers import ActionMasker

        env = ActionMasker(env, lambda e: adm[int(e.unwrapped._current_state)])
    else:
        from stable_baselines3 import PPO as cls
    model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0)
    t0 = time.perf_counter()

    def greedy() -> np.ndarray:
        with torch.no_grad():
            obs, _ = model.policy.obs_to_tensor(np.arange(S))
            logits = model.policy.get_distribution(obs).distribution.logits.cpu().numpy()
        return masked_argmax(logits, adm) if row["masked"] else logits.argmax(1)

    class Count(BaseCallback):
        def __init__(self):
            super().__init__()
            self.n, self.total, self.curve = 0, 0.0, []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.n += 1
                    self.total += float(info["episode"]["r"])
                    if self.n % 1000 == 0 and self.n % CHECKPOINT_EVERY:
                        print(f"{row['id']} seed {seed}: {self.n:,} patients, {self.num_timesteps:,} steps, "
                              f"{time.perf_counter() - t0:.0f} s", flush=True)
                    if self.n % CHECKPOINT_EVERY == 0 and self.n < patients:
                        self.curve.append([self.n, survival(greedy())])
                        print(f"{row['id']} seed {seed}: {self.n:,} patients, {self.num_timesteps:,} steps, "
                              f"{time.perf_counter() - t0:.0f} s, survival {self.curve[-1][1]:.4f}", flush=True)
            return self.n < patients

    count = Count()
    model.learn(total_timesteps=10 ** 10, callback=count)
    final = survival(greedy())
    out = {"survival": final, "train_return": count.total / max(count.n, 1), "patients": count.n,
           "steps": int(model.num_timesteps), "curve": count.curve + [[count.n, final]],
           "train_wall_s": round(time.perf_counter() - t0, 1)}
    with open(result, "w") as f:
        json.dump(out, f)


# ---- running the pairs ---------------------------------------------------------------------------------------------
def exact_result(row_id: str) -> dict:
    from dppo.envs import icu_sepsis_exact as ex

    if row_id == "optimal":
        return {"survival": ex.optimal()[0], "train_return": None}
    v = ex.survival(ex.uniform() if row_id == "random" else ex.clinicians())
    return {"survival": v, "train_return": v}


class Job:
    """One (row, seed) in a child process: its command line, where its log and result go, and how it is read back."""

    def __init__(self, row: dict, seed: int, args):
        self.row, self.seed, self.args = row, seed, args
        tag = f"{row['id']}_s{seed}"
        self.log = os.path.join(args.runs, "logs", f"{tag}.log")
        self.result = os.path.join(args.runs, "results", f"{tag}.json")
        self.run_dir = os.path.join(args.runs, tag)
        py = sys.executable
        if row["kind"] == "q":
            self.argv = [py, os.path.join(ROOT, "scripts", "icu_sepsis_reference.py"), "--q-learning", "--seeds",
                         str(seed), "--patients", str(args.patients), "--result", self.result,
                         *(["--masked"] if row["masked"] else [])]
        elif row["kind"] == "sb3":
            self.argv = [py, os.path.abspath(__file__), "--child", row["id"], "--seeds", str(seed), "--patients",
                         str(args.patients), "--result", self.result]
        else:
            from dppo.training.rundir import complete, holds_run

            overrides = dppo_overrides(self.row, seed) + list(args.dppo_extra or [])
            if complete(self.run_dir):
                self.argv = None                       # trained already: evaluate only
            elif holds_run(self.run_dir):
                self.argv = [py, os.path.join(ROOT, "train.py"), f"resume={self.run_dir}", "progress=false"]
            else:
                self.argv = [py, os.path.join(ROOT, "train.py"), *overrides, f"hydra.run.dir={self.run_dir}"]

    def start(self):
        os.makedirs(os.path.dirname(self.log), exist_ok=True)
        os.makedirs(os.path.dirname(self.result), exist_ok=True)
        if os.path.isfile(self.result):
            os.remove(self.result)
        self.t0 = time.perf_counter()
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self.proc.pid

    def finish(self, status: int, rusage) -> dict | None:
        """The stored result of the finished child (None if it failed: one line says why)."""
        wall = time.perf_counter() - self.t0
        code = os.waitstatus_to_exitcode(status)
        self.proc.returncode = code
        peak = rusage.ru_maxrss / 1024 if rusage is not None else None
        if code != 0:
            with open(self.log) as f:
                tail = [line.strip() for line in f if line.strip()][-1:] or ["?"]
            print(f"FAILED {self.row['id']} seed {self.seed} (exit {code}): {tail[0]}  [log: {self.log}]", flush=True)
            return None
        return self.read(wall, peak)

    def read(self, wall: float | None, peak: float | None) -> dict:
        if self.row["kind"] == "dppo":
            res = dppo_result(self.run_dir)
            if wall is None:     # trained in an earlier sitting: its own wall time, memory unknown
                wall = res.get("train_wall_s")
        else:
            with open(self.result) as f:
                res = json.load(f)
            res = res[0] if isinstance(res, list) else res
        res.update(wall_s=None if wall is None else round(wall, 1), peak_mib=None if peak is None else round(peak, 1))
        return res


def run_pairs(pairs: list[tuple[dict, object]], store: dict, args) -> None:
    """Run ``pairs`` (at most ``args.jobs`` children at a time), storing and reporting each as it finishes."""
    def done(row, seed, res):
        if res is None:
            return
        store.update(record(args.json, row, seed, res))
        write_report(store, args.md, args.png)
        tr = res.get("train_return")
        wall = res.get("wall_s")
        mem = res.get("peak_mib")
        print(f"stored {row['id']}{'' if seed is None else f' seed {seed}'}: survival {res['survival']:.4f}, training "
              f"patients {'n/a' if tr is None else f'{tr:.4f}'}{'' if wall is None else f', {wall:.0f} s'}"
              f"{'' if mem is None else f', peak {mem:.0f} MiB'}", flush=True)

    queue, running = [], {}
    for row, seed in pairs:
        if row["kind"] == "exact":
            done(row, seed, exact_result(row["id"]))
            continue
        job = Job(row, seed, args)
        if job.argv is None:
            done(row, seed, job.read(None, None))
            continue
        queue.append(job)
    while queue or running:
        while queue and len(running) < args.jobs:
            job = queue.pop(0)
            print(f"running {job.row['id']} seed {job.seed}: {' '.join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in job.argv[1:])}",
                  flush=True)
            running[job.start()] = job
        pid, status, rusage = os.wait4(-1, 0)
        job = running.pop(pid, None)
        if job is None:
            continue
        try:
            res = job.finish(status, rusage)
        except Exception as err:  # noqa: BLE001 - one failed pair is reported, the others go on
            print(f"FAILED {job.row['id']} seed {job.seed}: {type(err).__name__}: {err}", flush=True)
            res = None
        done(job.row, job.seed, res)


def parse_seeds(items: list[str]) -> list[int]:
    """'0-9' or '0 1 2' (or both)."""
    out = []
    for item in items:
        for part in str(item).split(","):
            if "-" in part.strip("-") and not part.startswith("-"):
                a, b = part.split("-")
                out += list(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
    return out


def select(patterns: list[str] | None) -> list[dict]:
    if not patterns:
        return list(ROWS)
    rows = [r for r in ROWS if any(fnmatch.fnmatch(r["id"], p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatch(r["id"], p) for r in ROWS)]
    if unknown:
        raise SystemExit(f"unknown row(s) {unknown}; the rows: {', '.join(ROW)}")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="ROW", help="these rows only (ids or globs; --list names them)")
    ap.add_argument("--seeds", nargs="+", default=["0-9"], help="seeds: '0-9' or '0 1 2' (default 0-9)")
    ap.add_argument("--jobs", type=int, default=1, help="children at a time (one thread each)")
    ap.add_argument("--rerun", action="store_true", help="run the selected (row, seed) pairs even if stored")
    ap.add_argument("--report", action="store_true", help="only rewrite the table and the plot from the store")
    ap.add_argument("--list", action="store_true", help="print the rows (id: name, command) and exit")
    ap.add_argument("--patients", type=int, default=PATIENTS, help=argparse.SUPPRESS)   # tests: smaller runs
    ap.add_argument("--dppo-extra", nargs="*", help=argparse.SUPPRESS)                   # tests: smaller dppo runs
    ap.add_argument("--json", default=os.path.join(REFERENCE, "icu_sepsis.json"))
    ap.add_argument("--md", default=os.path.join(REFERENCE, "icu_sepsis.md"))
    ap.add_argument("--png", default=os.path.join(REFERENCE, "icu_sepsis.png"))
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs", "icu_sepsis"), help="dppo run dirs, logs, results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if args.child:
        sb3_child(ROW[args.child], seeds[0], args.patients, args.result)
        return
    if args.list:
        for row in ROWS:
            print(f"{row['id']}: {row['name']}  ({command(row)})")
        return
    store = load_store(args.json)
    if not args.report:
        rows = []
        for row in select(args.only):
            why = unavailable(row)
            if why:
                print(f"{row['id']}: skipped ({why})", flush=True)
            else:
                rows.append(row)
        pairs = todo(store, rows, seeds, args.rerun)
        skipped = sum(1 for row in rows for s in ([None] if row["kind"] == "exact" else seeds)) - len(pairs)
        if skipped:
            print(f"{skipped} (row, seed) pairs already stored in {os.path.relpath(args.json, ROOT)}: skipped", flush=True)
        run_pairs(pairs, store, args)
    write_report(store, args.md, args.png)
    print(f"table: {os.path.relpath(args.md, ROOT)}", flush=True)


if __name__ == "__main__":
    main()
