"""One logger for every learner: ``record(key, value)`` then ``dump(step)`` to pluggable outputs.

The step of every dump is ``global_step``: the cumulative number of environment steps (as in CleanRL and SB3),
or, with ``logger.diagnostics=false``, the cumulative number of episodes (env steps would reveal the users'
episode lengths). The round index is logged as the scalar ``rollout/round``. Keys ``diag/*`` are raw statistics
of the round's users; they are dropped when ``diagnostics=false``.

Outputs are created lazily: nothing is written to the run directory (no event file) until the first dump, so
a resume that has nothing left to do leaves the run untouched. ``log_hparams(hparams)`` at the start only
remembers the resolved hyper-parameters; ``log_hparams(hparams, metrics)`` at the end of a session writes them
with the final metrics (TensorBoard's HParams tab, a text table, W&B config/summary).
"""
from __future__ import annotations

import contextlib
import csv
import importlib.util
import math
import os
import sys
import types

from dppo.errors import ConfigError

STEP_COLUMN = "global_step"
DIAG_PREFIX = "diag/"
TIMING_PREFIX = "perf/"  # wall-clock rates depend on this round's episode / completion lengths


def hparam_value(v):
    """A value the HParams plugin accepts (bool, int, float, str); None -> 'null', lists -> their text."""
    if v is None:
        return "null"
    if isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def deterministic_plugin_data(*summaries):
    """The HParams summaries with their plugin data serialized deterministically: the session's hyper-parameters
    are a protobuf map, which ``SerializeToString()`` writes in the order of protobuf's hash table (seeded per
    process, so two runs of the same config would write different bytes); ``deterministic=True`` writes its
    entries sorted by key."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    for summary in summaries:
        for value in summary.value:
            data = value.metadata.plugin_data
            data.content = HParamsPluginData.FromString(data.content).SerializeToString(deterministic=True)
    return summaries


class Output:
    """A sink for dumped metrics."""

    def open(self) -> None:
        """Create the output's files now (else at the first write)."""

    def write(self, metrics: dict[str, float], step: int) -> None: ...

    def write_hparams(self, hparams: dict, metrics: dict | None = None, step: int = 0) -> None: ...

    def purge_after(self, step: int) -> None:
        """Forget what an interrupted session logged after ``step`` (the resumed checkpoint's step)."""

    def write_text(self, key: str, text: str, step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardOutput(Output):
    """TensorBoard event files in ``log_dir`` (writer opened at the first write); HParams + a text table.

    ``public_clock``: every event's ``wall_time`` is the round index (``rollout/round`` of the dump, the last
    one for the end-of-session records) instead of the time of day, whose differences between rounds would
    reveal how long each round's users took (``logger.diagnostics=false`` sets it). The file itself then
    carries no clock, host or process either (``public_file_clock``).
    """

    def __init__(self, log_dir: str, purge_step: int | None = None, public_clock: bool = False):
        self.log_dir, self.purge_step, self.public_clock = log_dir, purge_step, bool(public_clock)
        self.writer = None
        self.tick = 0.0

    def _writer(self):
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            with public_file_clock(self.log_dir, self.tick) if self.public_clock else contextlib.nullcontext():
                self.writer = SummaryWriter(log_dir=self.log_dir, purge_step=self.purge_step)
        return self.writer

    def open(self):
        self._writer()

    def _walltime(self, metrics=None):
        if not self.public_clock:
            return None
        if metrics and "rollout/round" in metrics:
            self.tick = float(metrics["rollout/round"])
        return self.tick

    def purge_after(self, step):
        if self.writer is None:
            self.purge_step = int(step) + 1

    def write(self, metrics, step):
        wall = self._walltime(metrics)
        w = self._writer()
        for k, v in metrics.items():
            w.add_scalar(k, v, step, walltime=wall)
        w.flush()

    def write_hparams(self, hparams, metrics=None, step=0):
        """HParams plugin data (experiment, session start/end) for the resolved values; the final metrics'
        values are the run's own scalars with those tags (``eval/return``, ``privacy/epsilon``)."""
        if metrics is None:  # start of a session: nothing is written yet
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        w = self._writer()
        hp = {k: hparam_value(v) for k, v in hparams.items()}
        final = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        exp, ssi, sei = deterministic_plugin_data(*hparams_summary(hp, final))
        wall = self._walltime()
        for s in (exp, ssi, sei):
            w.file_writer.add_summary(s, walltime=wall)
        rows = "\n".join(f"|{k}|{v}|" for k, v in hp.items())
        w.add_text("hyperparameters", "|param|value|\n|-|-|\n" + rows, step, walltime=wall)
        w.flush()

    def write_text(self, key, text, step):
        w = self._writer()
        w.add_text(key, text, step, walltime=self._walltime())
        w.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()


@contextlib.contextmanager
def public_file_clock(log_dir: str, tick: float):
    """While a SummaryWriter is made: its events file is named ``events.out.tfevents.<round>.dppo.<n>.0``
    (``round``, ten digits: the round the session starts at; ``n``: how many events files ``log_dir`` held
    before, i.e. the session's index) instead of TensorBoard's ``<time>.<host>.<pid>.<uid>``, and the records
    written on opening (the file-version record, a resume's purge records) carry ``wall_time = round``."""
    from tensorboard.summary.writer import event_file_writer as efw
    from torch.utils.tensorboard import writer as tw

    n = len([f for f in os.listdir(log_dir) if "tfevents" in f]) if os.path.isdir(log_dir) else 0
    clock = types.SimpleNamespace(time=lambda: float(tick))
    shims = {efw: {"time": clock, "socket": types.SimpleNamespace(gethostname=lambda: "dppo"),
                   "os": types.SimpleNamespace(path=os.path, getpid=lambda: n),
                   "_global_uid": types.SimpleNamespace(get=lambda: 0)},
             tw: {"time": clock}}
    saved = {(m, k): getattr(m, k) for m, names in shims.items() for k in names}
    for m, names in shims.items():
        for k, v in names.items():
            setattr(m, k, v)
    try:
        yield
    finally:
        for (m, k), v in saved.items():
            setattr(m, k, v)


class CSVOutput(Output):
    """``progress.csv`` with one row per step (a second dump at the same step fills the same row)."""

    def __init__(self, path: str):
        self.path = path
        self.keys: list[str] = []
        self.rows: list[dict] = []
        if os.path.exists(path):
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                self.keys = list(reader.fieldnames or [])
                self.rows = list(reader)

    def purge_after(self, step):
        self.rows = [r for r in self.rows if float(r.get(STEP_COLUMN) or -1) <= step]

    def write(self, metrics, step):
        if self.rows and float(self.rows[-1].get(STEP_COLUMN) or -1) == step:
            self.rows[-1].update(metrics)
            row = self.rows[-1]
        else:
            row = {STEP_COLUMN: step, **metrics}
            self.rows.append(row)
        self.keys += [k for k in row if k not in self.keys]
        with open(self.path + ".tmp", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.keys)
            w.writeheader()
            w.writerows(self.rows)
        os.replace(self.path + ".tmp", self.path)


class ConsoleOutput(Output):
    """Prints a compact line every ``every`` dumps (the progress bar shows the rest)."""

    def __init__(self, every: int = 10, stream=None):
        self.every = max(1, int(every))
        self.stream = stream or sys.stdout
        self.dumps = 0

    def write(self, metrics, step):
        if self.dumps % self.every == 0:
            parts = [f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float))]
            print(f"[{step}] " + " ".join(parts), file=self.stream, flush=True)
        self.dumps += 1


class WandbOutput(Output):
    """Weights & Biases (``logger=wandb``): ``wandb`` is imported, and the run started, at the first write.

    Scalars are logged with ``global_step`` as their step metric; the resolved hyper-parameters go to the
    run's config, the final metrics to its summary. ``mode`` is W&B's (online | offline | disabled).
    """

    def __init__(self, run_dir: str | None, project: str = "dppo", mode: str | None = None,
                 entity: str | None = None, group: str | None = None):
        self.run_dir, self.project, self.mode, self.entity, self.group = run_dir, project, mode, entity, group
        self.hparams: dict = {}
        self.run = None

    def _run(self):
        if self.run is None:
            import wandb

            name = os.path.basename(os.path.normpath(self.run_dir)) if self.run_dir else None
            self.run = wandb.init(project=self.project, entity=self.entity, group=self.group, name=name,
                                  dir=self.run_dir, mode=self.mode, config=dict(self.hparams), reinit=True)
            self.run.define_metric(STEP_COLUMN)
            self.run.define_metric("*", step_metric=STEP_COLUMN)
        return self.run

    def write(self, metrics, step):
        self._run().log({**metrics, STEP_COLUMN: step})

    def write_hparams(self, hparams, metrics=None, step=0):
        self.hparams = {k: hparam_value(v) for k, v in hparams.items()}
        if metrics is None:
            return
        run = self._run()
        run.config.update(self.hparams, allow_val_change=True)
        run.summary.update({k: v for k, v in metrics.items() if v is not None})

    def close(self):
        if self.run is not None:
            self.run.finish()
            self.run = None


class Logger:
    """Collects values with ``record`` and writes them all at ``dump(step)``; algorithms never create writers.

    Keys under ``diag/`` are raw statistics of this round's users (not covered by the privacy guarantee);
    with ``diagnostics=False`` they are dropped here, before any output (TensorBoard, CSV, console, the
    progress bar) sees them, and so are the ``perf/*`` timings (users/s, tokens/s), which depend on
    the lengths of this round's episodes or completions.

    The trainer and its callbacks read this interface directly (``diagnostics``, ``record_many``, ``dump``,
    ``log_hparams``, ``purge_after``, ``open``, ``close``), so a logger passed to ``dppo.train(logger=...)`` is a
    ``Logger``: what varies is its outputs (subclasses of ``Output``).

    Args:
        outputs: the sinks.
        diagnostics: keep ``diag/*`` and ``perf/*`` keys; false drops them.
    """

    def __init__(self, outputs: list[Output] | None = None, diagnostics: bool = True):
        self.outputs = list(outputs or [])
        self.diagnostics = bool(diagnostics)
        self.values: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.texts: list[tuple[str, str]] = []
        self.last_step = 0

    def record(self, key: str, value) -> None:
        if not self.diagnostics and key.startswith((DIAG_PREFIX, TIMING_PREFIX)):
            return
        self.values[key] = float(value)

    def record_many(self, metrics: dict) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) or hasattr(v, "item"):
                self.record(k, v)

    def dump(self, step: int) -> None:
        clean = {k: v for k, v in self.values.items() if math.isfinite(v)}
        if clean:
            for out in self.outputs:
                out.write(clean, int(step))
        self.write_texts(int(step))
        self.last = dict(self.values)
        self.values = {}
        self.last_step = int(step)

    def write_texts(self, step: int) -> None:
        for key, text in self.texts:
            for out in self.outputs:
                out.write_text(key, text, step)
        self.texts = []

    def log_hparams(self, hparams: dict, metrics: dict | None = None, step: int = 0) -> None:
        """Resolved hyper-parameters; with ``metrics`` (end of a session) they are written with those results."""
        for out in self.outputs:
            out.write_hparams(hparams, metrics, int(step))

    def purge_after(self, step: int) -> None:
        for out in self.outputs:
            out.purge_after(int(step))

    def open(self) -> None:
        """Create every output's files now (a session with rounds to run, without diagnostics)."""
        for out in self.outputs:
            out.open()

    def text(self, key: str, text: str, round_idx: int | None = None) -> None:
        """A text record (e.g. completions of public prompts), recorded like a value: written with the next
        ``dump``, at its step (``global_step``, the axis of every metric of the round), to the outputs that
        take text. ``round_idx``, the round it belongs to, heads the text."""
        head = "" if round_idx is None else f"round {int(round_idx)}\n\n"
        self.texts.append((key, head + text))

    def close(self) -> None:
        if self.texts:  # recorded after the last dump: written at its step
            self.write_texts(self.last_step)
        for out in self.outputs:
            out.close()


def make_logger(run_dir: str | None, tensorboard: bool = True, csv: bool = True, console: bool = False,
                console_every: int = 10, purge_step: int | None = None, diagnostics: bool = True,
                wandb: bool = False, wandb_project: str = "dppo", wandb_mode: str | None = None,
                wandb_entity: str | None = None, wandb_group: str | None = None) -> Logger:
    """The standard logger of a run directory: TensorBoard + CSV (+ console, + W&B)."""
    outputs: list[Output] = []
    if run_dir is not None:
        if tensorboard:
            outputs.append(TensorBoardOutput(run_dir, purge_step=purge_step, public_clock=not diagnostics))
        if csv:
            outputs.append(CSVOutput(os.path.join(run_dir, "progress.csv")))
    if console:
        outputs.append(ConsoleOutput(console_every))
    if wandb:
        if "wandb" not in sys.modules and importlib.util.find_spec("wandb") is None:
            raise ConfigError("logger=wandb needs the wandb package (pip install wandb), or use logger=default")
    if wandb and run_dir is not None:
        outputs.append(WandbOutput(run_dir, wandb_project, wandb_mode, wandb_entity, wandb_group))
    return Logger(outputs, diagnostics=diagnostics)
