"""CLI glue: pre-flight validation (one-line errors, exit 2) before Hydra creates a run directory."""
from __future__ import annotations

import os
import sys

from dppo.errors import DPPOError

FLAGS_WITH_VALUE = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn", "-cd")


def fail(err: BaseException) -> None:
    """Print one line to stderr and exit 2 (no traceback); under torchrun only rank 0 prints it."""
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if not isinstance(err, DPPOError):
        msg = _hydra_message(err)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"dppo: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def _hydra_message(err: BaseException) -> str:
    text = " ".join(str(err).split())
    for marker in ("full_key:", "object_type="):
        text = text.split(marker)[0].strip()
    return f"bad config: {text}" if text else f"bad config ({type(err).__name__})"


def overrides_of(args: list[str]) -> list[str] | None:
    """The key=value overrides, or None when Hydra flags (multirun, --help, ...) make us defer to Hydra."""
    if any(a.startswith("-") for a in args):
        return None
    return list(args)


def precheck(args: list[str]) -> str | None:
    """Compose and validate the config and build env + policy; return the resume dir if one is given."""
    overrides = overrides_of(args)
    if overrides is None:
        return None
    resume = next((a.split("=", 1)[1] for a in overrides if a.startswith("resume=")), None)
    if resume and resume not in ("null", "None", ""):
        from dppo.api import load_run_config

        load_run_config(resume, [a for a in overrides if not a.startswith("resume=")])
        return resume
    from dppo.build import build
    from dppo.config import compose
    from dppo.training.rundir import check_fresh

    run_dir = next((a.split("=", 1)[1] for a in overrides if a.startswith("hydra.run.dir=")), None)
    if run_dir:
        check_fresh(run_dir)  # before Hydra writes its .hydra/ into a directory that holds another run
    build(compose(overrides))  # a dry build: every object, no run directory, nothing written
    return None


def run_from_hydra(cfg, run_dir: str, multirun: bool = False) -> None:
    from dppo.api import _train

    try:
        summary = _train(cfg, run_dir, write_config=False)  # Hydra has written .hydra/ already
    except DPPOError as err:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"dppo: error: {str(err).splitlines()[0]}", file=sys.stderr, flush=True)
        if multirun:
            return
        sys.exit(2)
    _report(summary, run_dir)


def resume_run(run_dir: str, overrides: list[str]) -> None:
    from dppo.api import load_run_config, train

    cfg = load_run_config(run_dir, overrides)
    summary = train(cfg, run_dir, resume=True)
    _report(summary, run_dir)


def _report(summary: dict, run_dir: str) -> None:
    if int(os.environ.get("RANK", "0")) > 0:  # torchrun: rank 0 reports for the run
        return
    if summary.get("stop_reason"):
        print(f"dppo: {summary['stop_reason']}", file=sys.stderr)
    if summary.get("eps") is None:
        spent = "non-private"
    else:
        spent = f"eps_spent={summary['epsilon_spent']:.4g} delta_spent={summary['delta_spent']:.3g}"
    final = summary["final_return"]
    final = f"{final:.6g}" if isinstance(final, float) else final
    print(f"done: {summary['algo']} on {summary['env_id']} final_return={final} {spent} "
          f"rounds={summary['rounds_done']} -> {run_dir}/summary.json")


def entry(hydra_main, args: list[str]) -> None:
    """What ``python train.py ARGS`` does: pre-flight (or resume), then Hydra's run for ``args``."""
    if int(os.environ.get("RANK", "0")) > 0:  # torchrun rank > 0: Hydra must not write into rank 0's run dir
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled"]
    try:
        resume = precheck(args)
        if resume:
            resume_run(resume, [a for a in args if not a.startswith("resume=")])
            return
    except Exception as err:  # noqa: BLE001 - every user-facing failure is one line
        fail(err)
    hydra_main()
