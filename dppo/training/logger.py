"""One logger for every learner: ``record(key, value)`` then ``dump(step)`` to pluggable outputs."""
from __future__ import annotations

import csv
import math
import os
import sys


class Output:
    """A sink for dumped metrics."""

    def write(self, metrics: dict[str, float], step: int) -> None: ...

    def write_hparams(self, hparams: dict) -> None: ...

    def write_text(self, key: str, text: str, step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardOutput(Output):
    """TensorBoard event files in ``log_dir``; hyper-parameters as a markdown text table."""

    def __init__(self, log_dir: str, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir, purge_step=purge_step)

    def write(self, metrics, step):
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def write_hparams(self, hparams):
        rows = "\n".join(f"|{k}|{v}|" for k, v in hparams.items())
        self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + rows, 0)

    def write_text(self, key, text, step):
        self.writer.add_text(key, text, step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class CSVOutput(Output):
    """``progress.csv`` with one row per dump; new keys extend the header."""

    def __init__(self, path: str):
        self.path = path
        self.keys: list[str] = []
        self.rows: list[dict] = []
        if os.path.exists(path):
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                self.keys = list(reader.fieldnames or [])
                self.rows = list(reader)

    def write(self, metrics, step):
        row = {"step": step, **metrics}
        self.rows = [r for r in self.rows if int(float(r.get("step", -1))) < step] + [row]
        new = [k for k in row if k not in self.keys]
        self.keys += new
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

    def write(self, metrics, step):
        if step % self.every == 0:
            parts = [f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float))]
            print(f"[{step}] " + " ".join(parts), file=self.stream, flush=True)


DIAG_PREFIX = "diag/"
TIMING_PREFIX = "perf/"  # wall-clock rates depend on this round's episode / completion lengths


class Logger:
    """Collects values with ``record`` and writes them all at ``dump(step)``; algorithms never create writers.

    Keys under ``diag/`` are raw statistics of this round's users (not covered by the privacy guarantee);
    with ``diagnostics=False`` they are dropped here, before any output (TensorBoard, CSV, console, the
    progress bar) sees them, and so are the ``perf/*`` timings (users/s, tokens/s), which depend on
    the lengths of this round's episodes or completions.
    """

    def __init__(self, outputs: list[Output] | None = None, diagnostics: bool = True):
        self.outputs = list(outputs or [])
        self.diagnostics = bool(diagnostics)
        self.values: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def record(self, key: str, value) -> None:
        if not self.diagnostics and key.startswith((DIAG_PREFIX, TIMING_PREFIX)):
            return
        v = float(value)
        self.values[key] = v

    def record_many(self, metrics: dict) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) or hasattr(v, "item"):
                self.record(k, v)

    def dump(self, step: int) -> None:
        clean = {k: v for k, v in self.values.items() if math.isfinite(v)}
        for out in self.outputs:
            out.write(clean, step)
        self.last = dict(self.values)
        self.values = {}

    def log_hparams(self, hparams: dict) -> None:
        for out in self.outputs:
            out.write_hparams(hparams)

    def text(self, key: str, text: str, step: int) -> None:
        """A text record (e.g. completions of public prompts) written at once to the outputs that take text."""
        for out in self.outputs:
            out.write_text(key, text, step)

    def close(self) -> None:
        for out in self.outputs:
            out.close()


def make_logger(run_dir: str | None, tensorboard: bool = True, csv: bool = True, console: bool = False,
                console_every: int = 10, purge_step: int | None = None, diagnostics: bool = True) -> Logger:
    """The standard logger of a run directory: TensorBoard + CSV (+ console)."""
    outputs: list[Output] = []
    if run_dir is not None:
        if tensorboard:
            outputs.append(TensorBoardOutput(run_dir, purge_step=purge_step))
        if csv:
            outputs.append(CSVOutput(os.path.join(run_dir, "progress.csv")))
    if console:
        outputs.append(ConsoleOutput(console_every))
    return Logger(outputs, diagnostics=diagnostics)
