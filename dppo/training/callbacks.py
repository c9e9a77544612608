"""Callbacks around the round loop (SB3-style); logging, progress and checkpoints are callbacks too."""
from __future__ import annotations

import time

from dppo.training.faults import maybe_kill

DIAG_PREFIX = "diag/"
# What a user callback of a private run may see: released or public quantities only (an allow-list, so a key a
# learner adds later is withheld until it is classified): the accountant's figures, public evaluations, the
# public counts of a round, norms of released updates, functions of released statistics and the public model.
RELEASED_PREFIXES = ("privacy/", "eval/", "losses/", "regret/", "counters/", "gfa/")
RELEASED_KEYS = ("rollout/users", "rollout/episodes", "rollout/round")


class Callback:
    """Hooks called by the trainer; ``on_round_end`` returning False stops the run cleanly.

    Rule for private runs: a callback decides only from *released* quantities - the released update and
    policy, the ledger and ``privacy/*`` budget figures, the round index, and evaluations on public /
    held-out episodes (``eval/return``, ``learner.evaluate``). Anything it decides (stopping, which
    policy is released) is then post-processing and costs no privacy. Raw statistics of this round's
    users (``diag/*``: return, clip fractions, ...) are not released, and neither are timings (``perf/*``:
    users/s depends on the round's episode lengths); a decision on them would be an unaccounted release. So
    in a private run the trainer hands user callbacks only the allow-listed keys of ``metrics``
    (``RELEASED_PREFIXES``, ``RELEASED_KEYS``; ``ReleasedMetricsCallback``); a callback must not read the
    learner's raw state through ``trainer`` either.
    """

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


AUTO_EVALUATIONS = 10   # eval_every=auto: about this many evaluations per run (the final one included)


def eval_interval(every, num_rounds: int) -> int | None:
    """Rounds between two evaluations for ``eval_every``: an int as given; ``auto`` ``max(1, num_rounds //
    AUTO_EVALUATIONS)`` (a run of R >= 10 rounds is evaluated between 10 and 19 times, the final evaluation
    included; a shorter one after every round); None (or 0): at the end only."""
    if every is None or every == 0:
        return None
    if isinstance(every, str):
        if every != "auto":
            raise ValueError(f"eval_every must be an int >= 1, auto or null, got {every!r}")
        return max(1, int(num_rounds) // AUTO_EVALUATIONS)
    return int(every)


class EvalCallback(Callback):
    """Adds ``eval/return`` (held-out public episodes, the released policy) every ``every`` rounds
    (``eval_interval``: an int, or ``auto``).

    The last round is left to the trainer's final evaluation (``final_return``), logged at the same step.
    Every evaluation runs the same public episodes (public seeds and sampling stream, never a user's), which
    nothing else draws from: the users' episodes, the releases and so the trained policy are the same with
    or without intermediate evaluations.
    """

    def __init__(self, every: int | str | None, episodes: int, greedy: bool = False):
        self.every, self.episodes, self.greedy = every, int(episodes), bool(greedy)

    def on_round_end(self, trainer, round_idx, metrics):
        num_rounds = trainer.learner.num_rounds
        every = eval_interval(self.every, num_rounds)
        last = round_idx + 1 >= num_rounds
        if every and self.episodes > 0 and (round_idx + 1) % every == 0 and not last:
            metrics["eval/return"] = float(trainer.learner.evaluate(self.episodes, self.greedy))
        return True


class LoggingCallback(Callback):
    """Sends each round's metrics plus ``rollout/round`` and ``perf/users_per_s`` to the logger (which drops
    ``diag/*`` keys when ``logger.diagnostics=false``) at ``global_step`` (``dppo.training.steps``); at the end
    of a session that ran rounds, the final ``eval/return`` and the resolved hyper-parameters with the final
    metrics (TensorBoard HParams). Without diagnostics the outputs are opened when a session with rounds to
    run starts (their files then carry its start time, not the end of its first round)."""

    def __init__(self):
        self._t0 = time.perf_counter()   # the current round's start (``on_round_start``)

    def on_train_start(self, trainer):
        if not trainer.logger.diagnostics and trainer.round < trainer.learner.num_rounds:
            trainer.logger.open()

    def on_round_start(self, trainer, round_idx):
        self._t0 = time.perf_counter()

    def on_round_end(self, trainer, round_idx, metrics):
        dt = max(time.perf_counter() - self._t0, 1e-9)
        users = metrics.get("rollout/users", None)
        # timing depends on this round's episode lengths: a diagnostic, logged only with diagnostics on
        if users is not None and "perf/users_per_s" not in metrics and trainer.logger.diagnostics:
            metrics["perf/users_per_s"] = users / dt
        metrics["rollout/round"] = round_idx
        trainer.logger.record_many(metrics)
        trainer.logger.dump(global_step(trainer))
        maybe_kill("after_dump", round_idx)
        return True

    def on_train_end(self, trainer):
        if trainer.round <= trainer.start_round:  # nothing ran in this session: write nothing
            return
        summary = trainer.summary or {}
        final = {"eval/return": summary.get("final_return"), "privacy/epsilon": summary.get("epsilon_spent"),
                 "privacy/delta": summary.get("delta_spent")}
        step = global_step(trainer)
        if final["eval/return"] is not None:
            trainer.logger.record("eval/return", final["eval/return"])
        trainer.logger.dump(step)
        trainer.logger.log_hparams(trainer.hparams, final, step)


def global_step(trainer) -> int:
    return trainer.steps.global_step(trainer.logger.diagnostics)


class ReleasedMetricsCallback(Callback):
    """Wraps a user callback of a private run: it sees only the allow-listed released / public keys of the
    round's metrics (no ``diag/*`` raw statistics, no ``perf/*`` timings), so its decisions use released
    quantities only."""

    def __init__(self, inner: Callback):
        self.inner = inner

    def on_train_start(self, trainer):
        self.inner.on_train_start(trainer)

    def on_round_start(self, trainer, round_idx):
        self.inner.on_round_start(trainer, round_idx)

    def on_round_end(self, trainer, round_idx, metrics):
        return self.inner.on_round_end(trainer, round_idx, released_only(metrics))

    def on_checkpoint(self, trainer, path):
        self.inner.on_checkpoint(trainer, path)

    def on_train_end(self, trainer):
        self.inner.on_train_end(trainer)


def released_only(metrics: dict) -> dict:
    """The allow-listed released / public metrics (``RELEASED_PREFIXES``, ``RELEASED_KEYS``)."""
    return {k: v for k, v in metrics.items() if k.startswith(RELEASED_PREFIXES) or k in RELEASED_KEYS}


class ProgressBarCallback(Callback):
    """A tqdm bar with the eps spent so far and the latest public ``eval/return`` (held-out episodes of the
    released policy; ``eval_every``), never a statistic of the users' own (clipped) episodes; at the end, the
    final policy's ``final_return`` (the number ``summary.json`` reports), labelled as such. Without
    diagnostics the bar shows no timing either (no elapsed time, no s/round: round times depend on the
    users' episode lengths). Returns are shown to 4 significant digits (``RETURN_FORMAT``)."""

    NO_TIMING = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{postfix}"
    RETURN_FORMAT = "{:.4g}"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.bar = None
        self.last_eval = None

    def on_train_start(self, trainer):
        if self.enabled:
            from tqdm.auto import tqdm

            timing = trainer.logger.diagnostics
            self.bar = tqdm(total=trainer.learner.num_rounds, initial=trainer.start_round,
                            desc=trainer.meta.get("algo", trainer.learner.name), unit="round", dynamic_ncols=True,
                            **({} if timing else {"bar_format": self.NO_TIMING}))

    def on_round_end(self, trainer, round_idx, metrics):
        if self.bar is not None:
            post = {}
            if "eval/return" in metrics:
                self.last_eval = metrics["eval/return"]
            if self.last_eval is not None:   # public: held-out episodes of the released policy
                post["eval_return"] = self.RETURN_FORMAT.format(self.last_eval)
            if "regret/cumulative" in metrics:
                post["regret"] = f"{metrics['regret/cumulative']:.4g}"
            eps = metrics.get("privacy/epsilon")
            post["eps"] = f"{eps or 0.0:.3g}" if trainer.privacy.private else "non-private"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)
        return True

    def on_train_end(self, trainer):
        if self.bar is not None:
            # the bar ends on the number the run reports: the final policy's return (after the last round, tail-
            # averaged or selected: ``eval.select``), which the last periodic evaluation preceded
            final = (trainer.summary or {}).get("final_return")
            if final is not None and trainer.round > trainer.start_round:
                post = {"final_return": self.RETURN_FORMAT.format(final)}
                if trainer.privacy.private:
                    post["eps"] = f"{trainer.privacy.spent()[0]:.3g}"
                self.bar.set_postfix(post, refresh=True)
            self.bar.close()


class StopAtReturn(Callback):
    """Stop once the public evaluation return ``eval/return`` reaches ``threshold``.

    The decision uses only released quantities (the Callback rule): every ``every`` rounds the current
    (released) policy is evaluated on ``episodes`` held-out episodes (``learner.evaluate``: simulator
    episodes with seeds no training user has), never on this round's users' returns. If the round's
    metrics already carry ``eval/return`` that value is used.
    """

    def __init__(self, threshold: float, episodes: int = 10, every: int = 1, greedy: bool = False):
        self.threshold = float(threshold)
        self.episodes, self.every, self.greedy = int(episodes), max(1, int(every)), bool(greedy)
        self.last_eval = None

    def on_round_end(self, trainer, round_idx, metrics):
        value = metrics.get("eval/return")
        if value is None:
            if (round_idx + 1) % self.every:
                return True
            value = float(trainer.learner.evaluate(self.episodes, self.greedy))
        self.last_eval = float(value)
        return self.last_eval < self.threshold
