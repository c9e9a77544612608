"""CLI glue: ``python train.py ARGS`` on the one configuration path; bad input is one line on stderr, exit 2,
before a run directory is made."""
from __future__ import annotations

import os
import sys

from dppo.errors import DPPOError

FLAGS_WITH_VALUE = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn", "-cd")


def fail(err: BaseException) -> None:
    """Print one line to stderr and exit 2 (no traceback); under torchrun only rank 0 prints it."""
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if not isinstance(err, DPPOError):
        from dppo.config import hydra_message

        msg = hydra_message(err)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"dppo: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def interrupted(line: str) -> None:
    """Ctrl-C: one line (how far the run got, how to continue it), no traceback, exit 130 (the shell's code for
    SIGINT)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"\n{line}", file=sys.stderr, flush=True)
    sys.exit(130)


def overrides_of(args: list[str]) -> list[str] | None:
    """The key=value overrides, or None when Hydra flags (multirun, --help, ...) make us defer to Hydra."""
    if any(a.startswith("-") for a in args):
        return None
    return list(args)


def run(overrides: list[str]) -> None:
    """One run from the command line, on the one configuration path: compose once (``compose_run``, which
    also resolves Hydra's ``hydra.run.dir``), then ``dppo.api.start`` validates and builds every object once,
    in order, before the run directory is created, and writes the run layout; then the loop. A bad config is
    one line and exit 2, with no run directory made."""
    from dppo.config import compose_run

    def prepare():
        cfg, run_dir = compose_run(overrides)
        return cfg, run_dir, dict(overrides=overrides)

    _start_and_finish(prepare)


def _start_and_finish(prepare) -> None:
    """``prepare() -> (cfg, run_dir, start's keyword arguments)``; any failure before the loop, and a
    DPPOError inside it, is one line and exit 2."""
    from dppo.api import finish, start

    try:
        cfg, run_dir, kwargs = prepare()
        trainer, dist = start(cfg, run_dir, **kwargs)
    except KeyboardInterrupt:
        interrupted("dppo: interrupted before round 0: no user was drawn")
    except Exception as err:  # noqa: BLE001 - every user-facing failure before the run is one line
        fail(err)
    trainer.announce = True
    try:
        summary = finish(trainer, dist)
    except KeyboardInterrupt:
        interrupted(trainer.interrupted_line())
    except DPPOError as err:
        fail(err)
    if trainer.nothing_to_do is None:    # a resume of a finished run said so in its one line
        _report(summary, run_dir)


def run_from_hydra(cfg, run_dir: str, multirun: bool = False) -> None:
    """One job of a Hydra multirun (``-m``; Hydra composed ``cfg`` and wrote ``.hydra/``): build once, run."""
    from dppo.api import finish, start

    try:
        trainer, dist = start(cfg, run_dir, write_config=False)
        _record_run_shape(run_dir, cfg)
        trainer.announce = not multirun
        summary = finish(trainer, dist)
    except KeyboardInterrupt:
        interrupted(f"dppo: interrupted; continue a job with: python train.py resume={run_dir}")
    except DPPOError as err:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"dppo: error: {str(err).splitlines()[0]}", file=sys.stderr, flush=True)
        if multirun:
            return
        sys.exit(2)
    _report(summary, run_dir)


def _record_run_shape(run_dir: str, cfg) -> None:
    """Hydra wrote the job's ``.hydra/config.yaml`` before the build filled in the run shape it left null (the
    learner's ``default_run_shape``): write the values used, so the run's config says what it ran."""
    from omegaconf import OmegaConf

    from dppo.config import RUN_SHAPE

    path = os.path.join(run_dir, ".hydra", "config.yaml")
    if int(os.environ.get("RANK", "0")) > 0 or not os.path.isfile(path):
        return
    saved = OmegaConf.load(path)
    missing = [k for k in RUN_SHAPE if k in saved and saved[k] is None]
    if missing:
        for k in missing:
            saved[k] = cfg[k]
        OmegaConf.save(saved, path)


def resume_run(run_dir: str, overrides: list[str]) -> None:
    """``resume=<dir>``: the run's saved config with the overrides a resume may change, built once."""
    from dppo.api import load_run_config

    _start_and_finish(lambda: (load_run_config(run_dir, overrides), run_dir, dict(resume=True)))


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
    # the training time where the summary holds it (diagnostics on: timing reveals episode lengths)
    took = f" in {summary['wall_time_s']:.1f} s" if isinstance(summary.get("wall_time_s"), (int, float)) else ""
    print(f"done: {summary['algo']} on {summary['env_id']} final_return={final} {spent} "
          f"rounds={summary['rounds_done']}{took} -> {run_dir}/summary.json")


def entry(hydra_main, args: list[str]) -> None:
    """What ``python train.py ARGS`` does: a run (or a resume) on the one configuration path; Hydra's own
    machinery (``hydra_main``) only for what only it does (``-m`` sweeps, ``--help``, ``--cfg``, ...)."""
    from dppo.config import normalize_override

    sys.argv[1:] = [normalize_override(a) for a in sys.argv[1:]]  # Hydra reads the same overrides as compose()
    if int(os.environ.get("RANK", "0")) > 0:  # torchrun rank > 0: Hydra must not write into rank 0's run dir
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled"]
    overrides = overrides_of(args)
    if overrides is None:
        hydra_main()
        return
    resume = next((a.split("=", 1)[1] for a in overrides if a.startswith("resume=")), None)
    if resume and resume not in ("null", "None", ""):
        resume_run(resume, [a for a in overrides if not a.startswith("resume=")])
    else:
        run(overrides)
