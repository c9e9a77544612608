"""The round loop: a learner, a privacy context, a logger and callbacks; checkpoint/resume; summary."""
from __future__ import annotations

import math
import os
import time

from dppo.errors import BudgetExhausted, DataError, DPPOError
from dppo.training.callbacks import Callback, CallbackList, LoggingCallback, ProgressBarCallback
from dppo.training.checkpoint import (atomic_write_json, check_fingerprint, load_latest_checkpoint, rng_state,
                                      save_checkpoint, set_rng_state)
from dppo.training.runlock import RunLock


class CheckpointCallback(Callback):
    """Saves a checkpoint every ``every`` rounds (and the trainer saves one at the end)."""

    def __init__(self, every: int = 10):
        self.every = max(1, int(every))

    def on_round_end(self, trainer, round_idx, metrics):
        if (round_idx + 1) % self.every == 0:
            trainer.save_checkpoint()
        return True


class Trainer:
    """Runs ``learner.train_round`` for each round, with logging, checkpoints, callbacks and summary.json."""

    def __init__(self, learner, privacy, logger, *, sampler=None, callbacks=(), run_dir: str | None = None,
                 checkpoint_every: int = 10, eval_episodes: int = 20, eval_greedy: bool = False,
                 progress: bool = True, meta: dict | None = None, fingerprint: str = ""):
        self.learner, self.privacy, self.logger, self.sampler = learner, privacy, logger, sampler
        self.run_dir = run_dir
        self.eval_episodes, self.eval_greedy = int(eval_episodes), bool(eval_greedy)
        self.meta = dict(meta or {})
        self.fingerprint = fingerprint
        builtin = [LoggingCallback(), ProgressBarCallback(progress)]
        if run_dir is not None:
            builtin.append(CheckpointCallback(checkpoint_every))
        self.callbacks = CallbackList(builtin + list(callbacks))
        self.start_round = 0
        self.round = 0
        self.best_round_return = -math.inf
        self.wall_time_prev = 0.0
        self.stop_reason = None
        self._t_start = time.perf_counter()

    # ---- state -----------------------------------------------------------------------------
    @property
    def ckpt_dir(self) -> str | None:
        return None if self.run_dir is None else os.path.join(self.run_dir, "checkpoints")

    def state_dict(self) -> dict:
        return {"format": "dppo-ckpt-1", "round": self.round, "fingerprint": self.fingerprint,
                "learner": self.learner.state_dict(), "privacy": self.privacy.state_dict(),
                "sampler": None if self.sampler is None else self.sampler.state_dict(),
                "rng": rng_state(), "best_round_return": self.best_round_return,
                "wall_time_s": self.wall_time()}

    def load_state_dict(self, state: dict) -> None:
        check_fingerprint(state["fingerprint"], self.fingerprint)
        self.learner.load_state_dict(state["learner"])
        self.privacy.load_state_dict(state["privacy"])
        if self.sampler is not None and state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.round = self.start_round = int(state["round"])
        self.best_round_return = float(state["best_round_return"])
        self.wall_time_prev = float(state["wall_time_s"])

    def save_checkpoint(self) -> str | None:
        if self.ckpt_dir is None:
            return None
        try:
            path = save_checkpoint(self.ckpt_dir, self.round, self.state_dict())
            export = getattr(self.learner, "export_artifacts", None)  # e.g. a LoRA adapter in peft's layout
            if export is not None:
                export(self.run_dir, self.round)
            self.write_summary()
        except OSError as err:
            raise DPPOError(f"cannot write a checkpoint in {self.ckpt_dir}: {err.strerror or err}; "
                            f"free space or fix permissions, then resume") from None
        self.callbacks.on_checkpoint(self, path)
        return path

    def try_resume(self) -> bool:
        """Load the newest good checkpoint of ``run_dir``; False if there is none."""
        if self.ckpt_dir is None:
            return False
        state, _ = load_latest_checkpoint(self.ckpt_dir)
        if state is None:
            return False
        self.load_state_dict(state)
        return True

    # ---- loop ------------------------------------------------------------------------------
    def wall_time(self) -> float:
        return self.wall_time_prev + time.perf_counter() - self._t_start

    def fit(self) -> dict:
        """Train until ``learner.num_rounds`` rounds are done, a callback stops, or the budget runs out."""
        lock = RunLock(self.run_dir) if self.run_dir else None
        try:
            if lock:
                lock.acquire()
            return self._fit()
        finally:
            if lock:
                lock.release()
            self.logger.close()

    def _fit(self) -> dict:
        self._t_start = time.perf_counter()
        self.callbacks.on_train_start(self)
        while self.round < self.learner.num_rounds:
            r = self.round
            self.callbacks.on_round_start(self, r)
            try:
                metrics = dict(self.learner.train_round(r))
            except BudgetExhausted as err:
                self.stop_reason = str(err)
                break
            except DataError:
                # Nothing of the failed round was released; its users stay marked as used. The
                # checkpoint lets `resume=` retry round r with fresh users.
                self.save_checkpoint()
                raise
            self.round = r + 1
            metrics.setdefault("privacy/epsilon", self.privacy.spent()[0])
            if "rollout/return" in metrics:
                self.best_round_return = max(self.best_round_return, metrics["rollout/return"])
            if not self.callbacks.on_round_end(self, r, metrics):
                self.stop_reason = f"stopped by a callback after round {r}"
                break
        self.save_checkpoint()
        summary = self.write_summary(final=True)
        self.callbacks.on_train_end(self)
        return summary

    def write_summary(self, final: bool = False) -> dict:
        eps_spent, delta_spent = self.privacy.spent()
        summary = {**self.meta, "eps": self.privacy.eps, "delta": self.privacy.delta,
                   "epsilon_spent": eps_spent, "delta_spent": delta_spent, "accountant": self.privacy.accountant.name,
                   "rounds_done": self.round,
                   "users_seen": None if self.sampler is None else len(self.sampler.used),
                   "final_return": None, "best_round_return": _finite(self.best_round_return),
                   "wall_time_s": round(self.wall_time(), 3), "stop_reason": self.stop_reason,
                   "complete": final, **self.learner.summary(),
                   "ledger": self.privacy.ledger.entries}
        if final and self.eval_episodes > 0:
            summary["final_return"] = float(self.learner.evaluate(self.eval_episodes, self.eval_greedy))
        if self.run_dir is not None:
            atomic_write_json(os.path.join(self.run_dir, "summary.json"), summary)
        self.summary = summary
        return summary


def _finite(x: float):
    return x if math.isfinite(x) else None
