"""What the scripts share: the one module a script of ``scripts/`` may import from this folder.

A script imports only public names from here, never another script (``tests/scripts/test_script_imports.py``),
and this module imports no script. Everything a run needs goes through ``dppo.train`` (``train_in_process``,
``launch_train`` in ``dppo.training.rundir``); what is read back from a finished run directory is read here
(``load_run``, ``learner_state``, ``progress_rows``).

Contents: the sentence of seeded tables (``SEEDED_NOTE``), mean and std over seeds (``mean_std``), the
``--eps`` parser (``parse_eps``), worker processes with one torch thread (``worker_init``, ``default_jobs``),
one config run in this process (``run_config``, ``train_in_process``), a run directory read back (``load_run``,
``progress_rows``, ``learner_state``, ``episode_regret``), DP-GFA's ContextBits table (``GFA_TABLE``,
``gfa_overrides``, ``plateau_episode``), the memory benchmarks' child process (``run_child``,
``print_child_result``), and the language-model tasks and adapters (``TASKS``, ``ADAPTERS``) that
``reproduce_lm.py`` runs and ``bench_lm.py`` times.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the sentence every seeded reference table carries
SEEDED_NOTE = ("Noise: seeded (`privacy.secure_rng=false`), so the table reproduces on the machine that made it (another "
               "CPU may round a few float bits differently, and a run then drifts away from the table's); what the "
               "plain command gives with the default secure noise, over other seeds: `runs/reference/secure_spread.md` "
               "(`python scripts/secure_spread.py`).")

# the overrides every reproduction run sets: no console progress bar, and seeded noise so the table reproduces
QUIET = ("progress=false", "logger.tensorboard=false")
SEEDED = ("privacy.secure_rng=false",)


def seed_list(text: str) -> list[int]:
    """``0-9`` or ``100,101,102`` (or a mix: ``0-2,5``)."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def mean_std(xs, single: float = 0.0) -> tuple[float, float]:
    """(mean, sample std) of ``xs``; the std of a single value is ``single`` (0.0, or nan where a table shows it)."""
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else single)


def parse_eps(text: str) -> float | None:
    """An ``--eps`` value: a number, or ``none`` / ``null`` for the non-private twin."""
    return None if text.lower() in ("none", "null") else float(text)


def worker_init() -> None:
    """A pool worker: one torch (and BLAS) thread, warnings off (the runs' own console lines stay)."""
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


def default_jobs(cap: int = 8) -> int:
    """Runs at a time: one per CPU core this process may use, at most ``cap``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, cap)


def run_config(overrides: list[str], path: str, *, callbacks=(), quiet: bool = True) -> dict:
    """One run in this process through ``dppo.train``, with the same config checks and outputs as ``train.py``
    (``.hydra/``, journal, checkpoints, ``progress.csv``, ``summary.json``; ``train.py resume=`` works); an
    incomplete earlier attempt in ``path`` is removed first. ``quiet``: the run's console lines (the seeded-noise
    warning, ...) are dropped. Returns the summary; a failure raises."""
    import dppo

    if os.path.isdir(path):
        shutil.rmtree(path)
    with open(os.devnull, "w") as devnull, \
            (contextlib.redirect_stderr(devnull) if quiet else contextlib.nullcontext()):
        return dppo.train(list(overrides), run_dir=path, callbacks=list(callbacks))


def train_in_process(overrides: list[str], path: str, quiet: bool = True) -> tuple[str, int, float]:
    """``run_config`` for a pool worker, without a Python/torch start-up per run: a failure is printed in one
    line and returned as exit code 1, so a grid goes on. Returns (path, exit code, seconds)."""
    t0 = time.perf_counter()
    try:
        run_config(overrides, path, quiet=quiet)
        rc = 0
    except Exception as err:  # noqa: BLE001 - one failed run is reported, the grid goes on
        print(f"FAILED {os.path.basename(path)}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        rc = 1
    return path, rc, time.perf_counter() - t0


def progress_rows(path: str) -> list[dict]:
    """The rows of a run's ``progress.csv`` (one per logged round), as strings."""
    with open(os.path.join(path, "progress.csv")) as f:
        return list(csv.DictReader(f))


def load_run(path: str) -> tuple[dict, list[float]]:
    """A finished run's ``summary.json`` (plus ``env_steps_per_round`` and ``group_size`` from its log) and its
    training-return curve, one value per round."""
    with open(os.path.join(path, "summary.json")) as f:
        summary = json.load(f)
    table = progress_rows(path)
    curve = [float(r["diag/return"] if "diag/return" in r else r["rollout/return"]) for r in table]
    steps = [float(r["diag/env_steps"]) for r in table if r.get("diag/env_steps")]
    group = [float(r["rollout/episodes"]) / float(r["rollout/users"]) for r in table if r.get("rollout/episodes")]
    summary["env_steps_per_round"] = sum(steps) / len(steps) if steps else None
    summary["group_size"] = round(group[0]) if group else 1
    return summary, curve


def learner_state(path: str) -> dict:
    """The learner's state in the newest checkpoint of a finished run (its buffers and ``_extra_state``): where
    a table reads what the run computed episode by episode (the tabular learners' ``episode_regret``, GFA's
    ``regret``), which the per-round log only sums."""
    from dppo.training.checkpoint import load_latest_checkpoint

    state, _ = load_latest_checkpoint(os.path.join(path, "checkpoints"))
    if state is None:
        raise FileNotFoundError(f"{path}: no checkpoint to read the learner's state from")
    return state["learner"]


# ---- DP-GFA's ContextBits table (reproduce_gfa.py makes it, secure_spread.py reruns one row) -------------
# the table's settings: K episodes (one user each), B = round(batch_const K^(3/5)), eta, the class (|F|, scales)
GFA_TABLE = {"episodes": 500, "batch_const": 1.5, "eta": 50.0, "scales": (0.5, 0.75, 1.0), "class_size": 243,
             "delta": 1e-5}


def gfa_overrides(variant: str, eps: float | None, composition: str, seed: int, *, batch_size: int | None = None,
                  secure: bool = False, budget_decay: float = 0.0, sensitivity: str = "class", **table) -> list[str]:
    """The config of one run of the GFA table (``algo=gfa_outcome env=context_bits``): the table's settings
    (``GFA_TABLE``, any of them replaced by ``table``), the row's eps, composition, batch size, budget split and
    sensitivity. Seeded noise (``privacy.secure_rng=false``) unless ``secure``."""
    t = {**GFA_TABLE, **table}
    return ["algo=gfa_outcome", "env=context_bits", f"env.variant={variant}", f"seed={seed}",
            f"eps={'null' if eps is None else eps}", f"delta={t['delta']}", f"privacy.accountant={composition}",
            f"episodes={t['episodes']}", f"batch_size={'null' if batch_size is None else batch_size}",
            f"algo.batch_const={t['batch_const']}", f"algo.eta={t['eta']}", f"algo.class_size={t['class_size']}",
            "algo.class_scales=[" + ",".join(str(float(c)) for c in t["scales"]) + "]",
            f"algo.budget_decay={budget_decay}", f"algo.sensitivity={sensitivity}", *QUIET, "eval_every=null",
            f"privacy.secure_rng={str(bool(secure)).lower()}"]


def episode_regret(path: str):
    """The exact expected regret of every episode of a finished GFA or tabular run (float64 tensor), from the
    learner's state in its last checkpoint: GFA's ``regret`` list, a tabular learner's ``episode_regret``."""
    import torch

    state = learner_state(path)
    if "episode_regret" in state:
        return state["episode_regret"].to(torch.float64)
    return torch.tensor(state["_extra_state"]["regret"], dtype=torch.float64)


def plateau_episode(regret, frac: float = 0.95) -> int:
    """First (1-indexed) episode whose cumulative regret reaches ``frac`` of the final cumulative regret."""
    import torch

    cum = regret.cumsum(0)
    if cum[-1] <= 0:
        return 1
    return int(torch.nonzero(cum >= frac * cum[-1])[0]) + 1


# ---- the memory benchmarks: one run per process ------------------------------------------------------------
def print_child_result(result: dict) -> None:
    """A child's last line: its results and its own peak resident memory (``ru_maxrss`` of that process)."""
    import resource

    print(json.dumps({**result, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_child(script: str, args: list[str]) -> dict:
    """Run ``script --child ARGS`` in a fresh process; its JSON line, or ``{"error": <its last stderr line>}``."""
    out = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONWARNINGS="ignore"))
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(lines[-1])


# ---- the language-model tasks (reproduce_lm.py runs them, bench_lm.py times them) ------------------------
ALL7 = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
NORMS = ("model.model.embed_tokens,model.model.layers.0.input_layernorm,model.model.layers.0.post_attention_layernorm,"
         "model.model.layers.1.input_layernorm,model.model.layers.1.post_attention_layernorm,model.model.norm")
ADAPTERS = {  # name -> (overrides, description); each sets the whole policy side, whatever the experiment's yaml says
    "lora_r2_qv": (["policy.lora={r:2,alpha:4,dropout:0.0,target_modules:[q_proj,v_proj]}", "++policy.freeze=[]"],
                   "LoRA r = 2 on q, v"),
    "lora_r8_all": ([f"policy.lora={{r:8,alpha:16,dropout:0.0,target_modules:{ALL7}}}", "++policy.freeze=[]"],
                    "LoRA r = 8 on all 7 projections"),
    "full": (["policy.lora=null", "++policy.freeze=[]"], "full fine-tuning"),
    # every nn.Linear weight (embeddings and norms frozen): the full fine-tuning per-user gradients support
    "full_linear": (["policy.lora=null", f"++policy.freeze=[{NORMS}]"], "full fine-tuning of the linear layers"),
}
# The selected configs (``reproduce_lm.py --tune`` on seeds 100-102; docs/lm.md has every trial). best_*: the best
# non-private fine-tuning of each implementation; private: the config of the private rows (its own selection at
# eps = 8).
TASKS = {
    "addition": {"experiment": "lm_addition", "title": "3-digit addition, per-digit reward",
                 "best_dppo": ("full", 1e-3, ()), "best_trl": ("full", 1e-3, ("--scheduler", "constant")),
                 "private": ("full_linear", 2e-3, ())},
    "exact": {"experiment": "lm_exact", "title": "exact answers (unpadded addition, the answer then the end)",
              "best_dppo": ("full", 1e-3, ("max_grad_norm=1e9",)), "best_trl": ("lora_r8_all", 0.01, ()),
              "private": ("lora_r8_all", 0.01, ("++algo.kl_coef=0.02",))},
}
