"""Run directories: what makes a directory hold a run, refusing to start a new run in one, its config layout.

Layout (the same from the CLI and the Python API): ``.hydra/config.yaml`` (the composed config),
``.hydra/overrides.yaml``, ``checkpoints/``, ``users.journal``, ``summary.json``, ``progress.csv``, TensorBoard
event files, ``policy.pt``. A directory that already holds a run (checkpoints, summary, progress.csv or
event files) is refused for a new run: continue it with ``resume=<dir>`` (or ``dppo.train(cfg, dir,
resume=True)``), which works whatever point the run stopped at. Nothing is reused silently: a new run in an
old directory would overwrite its checkpoints and mix two runs' event files.
"""
from __future__ import annotations

import glob
import os

import yaml
from omegaconf import OmegaConf

from dppo.errors import ConfigError


def holds_run(run_dir: str) -> bool:
    """True if ``run_dir`` has a summary, a checkpoint, a progress.csv or an event file. A user journal alone
    (a crash before the first checkpoint) does not count: a fresh start there burns what it journalled."""
    return (os.path.isfile(os.path.join(run_dir, "summary.json"))
            or os.path.isfile(os.path.join(run_dir, "progress.csv"))
            or bool(glob.glob(os.path.join(run_dir, "checkpoints", "ckpt_*.pt")))
            or bool(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))))


def check_fresh(run_dir: str) -> None:
    """Refuse to start a new run in a directory that holds one (one line, before anything is written)."""
    if run_dir and os.path.isdir(run_dir) and holds_run(run_dir):
        raise ConfigError(f"the run directory {run_dir} already holds a run; continue it with resume={run_dir} "
                          f"(API: dppo.train(cfg, run_dir, resume=True)), whatever point it stopped at; a separate "
                          f"run on the same users, in another directory, would spend their privacy a second time")


def write_layout(run_dir: str, cfg, overrides: list[str] | None = None) -> None:
    """``.hydra/config.yaml`` and ``.hydra/overrides.yaml`` as Hydra writes them, so the CLI can resume it."""
    d = os.path.join(run_dir, ".hydra")
    os.makedirs(d, exist_ok=True)
    OmegaConf.save(cfg, os.path.join(d, "config.yaml"))
    with open(os.path.join(d, "overrides.yaml"), "w") as f:
        yaml.safe_dump(list(overrides or []), f)


def record_extension(run_dir: str, cfg, keys=("rounds", "episodes")) -> None:
    """A resume that raised ``rounds`` / ``episodes`` (an extension the trainer accepted) writes the new value
    into ``.hydra/config.yaml`` (and the override into ``overrides.yaml``), so that the next resume of the
    extended run (after a crash, or to extend it again) starts from what the run now is."""
    d = os.path.join(run_dir, ".hydra")
    path = os.path.join(d, "config.yaml")
    if not os.path.isfile(path):
        return
    saved = OmegaConf.load(path)
    raised = [k for k in keys if OmegaConf.select(cfg, k, default=None) is not None
              and OmegaConf.select(saved, k, default=None) != OmegaConf.select(cfg, k)]
    if not raised:
        return
    for k in raised:
        OmegaConf.update(saved, k, OmegaConf.select(cfg, k), force_add=True)
    OmegaConf.save(saved, path)
    opath = os.path.join(d, "overrides.yaml")
    overrides = []
    if os.path.isfile(opath):
        with open(opath) as f:
            overrides = [o for o in (yaml.safe_load(f) or []) if o.split("=", 1)[0] not in raised]
    with open(opath, "w") as f:
        yaml.safe_dump([*overrides, *(f"{k}={OmegaConf.select(cfg, k)}" for k in raised)], f)


def launch_train(root: str, overrides: list[str], path: str) -> tuple[str, int, float]:
    """Run ``python train.py OVERRIDES hydra.run.dir=PATH`` in a one-thread subprocess, or ``resume=PATH``
    when PATH already holds an interrupted run (a new run may not reuse its directory). Used by the
    reproduction scripts; prints the failure's last line. Returns (path, exit code, seconds)."""
    import subprocess
    import sys
    import time

    train = os.path.join(root, "train.py")
    args = [sys.executable, train, *overrides, f"hydra.run.dir={path}"]
    if holds_run(path):
        args = [sys.executable, train, f"resume={path}", "progress=false"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    res = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["?"]
        print(f"FAILED {os.path.basename(path)}: {tail[0]}", file=sys.stderr, flush=True)
    return path, res.returncode, time.perf_counter() - t0


def complete(path: str) -> bool:
    """Whether the run directory holds a finished run (its summary.json says ``complete``)."""
    import json

    try:
        with open(os.path.join(path, "summary.json")) as f:
            return bool(json.load(f).get("complete"))
    except (OSError, ValueError):
        return False


def write_report(path: str, text: str) -> None:
    """Write a reproduction script's Markdown table to ``path`` (creating its folder) and print it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(text)
