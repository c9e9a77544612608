"""Callbacks around the round loop (SB3-style); logging, progress and checkpoints are callbacks too."""
from __future__ import annotations

import time


class Callback:
    """Hooks called by the trainer; ``on_round_end`` returning False stops the run cleanly."""

    def on_train_start(self, trainer) -> None: ...

    def on_round_start(self, trainer, round_idx: int) -> None: ...

    def on_round_end(self, trainer, round_idx: int, metrics: dict) -> bool | None:
        return True

    def on_checkpoint(self, trainer, path: str) -> None: ...

    def on_train_end(self, trainer) -> None: ...


class CallbackList(Callback):
    """Runs several callbacks in order; the run stops if any ``on_round_end`` returns False."""

    def __init__(self, callbacks=()):
        self.callbacks = list(callbacks)

    def on_train_start(self, trainer):
        for c in self.callbacks:
            c.on_train_start(trainer)

    def on_round_start(self, trainer, round_idx):
        for c in self.callbacks:
            c.on_round_start(trainer, round_idx)

    def on_round_end(self, trainer, round_idx, metrics):
        results = [c.on_round_end(trainer, round_idx, metrics) for c in self.callbacks]
        return all(r is not False for r in results)

    def on_checkpoint(self, trainer, path):
        for c in self.callbacks:
            c.on_checkpoint(trainer, path)

    def on_train_end(self, trainer):
        for c in self.callbacks:
            c.on_train_end(trainer)


class EvalCallback(Callback):
    """Adds ``eval/return`` (held-out public episodes, the released policy) every ``every`` rounds.

    The last round is left to the trainer's final evaluation (``final_return``), logged at the same step.
    """

    def __init__(self, every: int | None, episodes: int, greedy: bool = False):
        self.every, self.episodes, self.greedy = every, int(episodes), bool(greedy)

    def on_round_end(self, trainer, round_idx, metrics):
        last = round_idx + 1 >= trainer.learner.num_rounds
        if self.every and self.episodes > 0 and (round_idx + 1) % self.every == 0 and not last:
            metrics["eval/return"] = float(trainer.learner.evaluate(self.episodes, self.greedy))
        return True


class LoggingCallback(Callback):
    """Sends each round's metrics plus ``rollout/round`` and ``perf/users_per_s`` to the logger at
    ``global_step`` (``dppo.training.steps``); at the end of a session that ran rounds, the final ``eval/return``
    and the resolved hyper-parameters with the final metrics (TensorBoard HParams)."""

    def on_round_start(self, trainer, round_idx):
        self._t0 = time.perf_counter()

    def on_round_end(self, trainer, round_idx, metrics):
        dt = max(time.perf_counter() - getattr(self, "_t0", time.perf_counter()), 1e-9)
        users = metrics.get("rollout/users", None)
        if users is not None and "perf/users_per_s" not in metrics:
            metrics["perf/users_per_s"] = users / dt
        metrics["rollout/round"] = round_idx
        trainer.logger.record_many(metrics)
        trainer.logger.dump(global_step(trainer))
        return True

    def on_train_end(self, trainer):
        if trainer.round <= trainer.start_round:  # nothing ran in this session: write nothing
            return
        summary = getattr(trainer, "summary", {}) or {}
        final = {"eval/return": summary.get("final_return"), "privacy/epsilon": summary.get("epsilon_spent"),
                 "privacy/delta": summary.get("delta_spent")}
        step = global_step(trainer)
        if final["eval/return"] is not None:
            trainer.logger.record("eval/return", final["eval/return"])
        trainer.logger.dump(step)
        trainer.logger.log_hparams(getattr(trainer, "hparams", {}) or {}, final, step)


def global_step(trainer) -> int:
    return trainer.steps.global_step(getattr(trainer.logger, "diagnostics", True))


class ProgressBarCallback(Callback):
    """A tqdm bar with the latest return and the eps spent so far."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.bar = None

    def on_train_start(self, trainer):
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=trainer.learner.num_rounds, initial=trainer.start_round,
                            desc=trainer.meta.get("algo", trainer.learner.name), unit="round", dynamic_ncols=True)

    def on_round_end(self, trainer, round_idx, metrics):
        if self.bar is not None:
            post = {}
            if "rollout/return" in metrics:
                post["return"] = f"{metrics['rollout/return']:.1f}"
            if "regret/cumulative" in metrics:
                post["regret"] = f"{metrics['regret/cumulative']:.4g}"
            post["eps"] = f"{metrics.get('privacy/epsilon', 0.0):.3g}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)
        return True

    def on_train_end(self, trainer):
        if self.bar is not None:
            self.bar.close()


class StopAtReturn(Callback):
    """Example user callback: stop once ``rollout/return`` reaches ``threshold``."""

    def __init__(self, threshold: float):
        self.threshold = float(threshold)

    def on_round_end(self, trainer, round_idx, metrics):
        return metrics.get("rollout/return", float("-inf")) < self.threshold
