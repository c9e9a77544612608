"""The round loop: a learner, a privacy context, a logger and callbacks; checkpoint/resume; summary."""
from __future__ import annotations

import copy
import glob
import json
import math
import os
import sys
import time

from dppo.errors import BudgetExhausted, ConfigError, DataError, DPPOError, PrivacyError
from dppo.training.callbacks import (Callback, CallbackList, EvalCallback, LoggingCallback, ProgressBarCallback,
                                     ReleasedMetricsCallback)
from dppo.training.checkpoint import (atomic_write_bytes, atomic_write_json, check_fingerprint,
                                      load_latest_checkpoint, rng_state, save_checkpoint, set_rng_state)
from dppo.training import distributed, provenance, secret
from dppo.training.journal import JOURNAL_NAME, UserJournal
from dppo.training.runlock import RunLock
from dppo.training.selection import SelectBest
from dppo.training.steps import StepCounter
from dppo.training.threads import torch_threads

SEEDED_WARNING = ("dppo: warning: privacy.secure_rng=false: the noise is seeded (reproducible); the privacy "
                  "guarantee does not hold against anyone who knows the seed")
SEEDED_NOTE = ("seeded noise (privacy.secure_rng=false): reproducible, and the guarantee does not hold against "
               "anyone who knows the seed")
POLICY_FORMAT = "dppo-policy-1"   # policy.pt: {"format", "policy": state_dict, "config", "provenance", ...}
# the part of summary.json that policy.pt carries: the run's guarantee as the accountant states it and the public
# evaluation (released or public quantities only), so that a policy.pt shared alone still says what it cost
POLICY_SUMMARY_KEYS = ("algo", "env_id", "eps", "delta", "epsilon_spent", "delta_spent", "accountant", "adjacency",
                       "noise_source", "noise_note", "rounds_done", "complete", "final_return", "final_policy")


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

    dist = distributed.SINGLE  # under torchrun, set by the builder (only rank 0 has a run_dir and writes)
    threads: int | None = None  # torch's CPU threads for the loop (set by the builder; None: as they are)

    def __init__(self, learner, privacy, logger, *, sampler=None, callbacks=(), run_dir: str | None = None,
                 checkpoint_every: int = 10, eval_episodes: int = 20, eval_greedy: bool = False,
                 eval_select: str = "last", progress: bool = True, meta: dict | None = None, fingerprint="", eval_every: int | None = None,
                 hparams: dict | None = None, population=None, inherited: list | None = None,
                 config: dict | None = None, extend_refusal: dict | None = None, allow_over_target: bool = False,
                 capacity_limit: int | None = None, key: str | None = None, data_parts=None):
        self.learner, self.privacy, self.logger, self.sampler = learner, privacy, logger, sampler
        self.run_dir = run_dir
        self.eval_episodes, self.eval_greedy = int(eval_episodes), bool(eval_greedy)
        self.meta = dict(meta or {})
        self.fingerprint = fingerprint
        # provenance of the policy (dppo/training/provenance.py): this run's population and what the weights it
        # started from had consumed; ``config`` is the run's public config, saved in policy.pt to rebuild it
        self.population, self.inherited, self.config = population, list(inherited or []), config
        # per key a resume may raise (rounds, episodes): why more would change the guarantee (None: it would not)
        self.extend_refusal = extend_refusal
        self.allow_over_target = bool(allow_over_target)
        self.nothing_to_do = None   # a resume of a finished run: the one line that says so (``fit``)
        self._resumed = False       # continued from a checkpoint, or restarted with the journal applied
        self.summary: dict | None = None   # the latest summary.json content (``write_summary``)
        self.capacity_limit = capacity_limit      # an env's finite population: ids at or above it do not exist
        self.journal = None if run_dir is None else UserJournal(os.path.join(run_dir, JOURNAL_NAME))
        # the run's secret (dppo/training/secret.py): its key and the keyed fingerprint of its private rows (for
        # an env of rows: ``data_parts``), kept in the checkpoints and the journal only
        self.data_parts = data_parts
        self.secret = {"key": key or secret.new_key(), "data": None}
        self.secret["data"] = self.data_fingerprint(self.secret["key"])
        self.hparams = dict(hparams or {})  # resolved hyper-parameters (TensorBoard HParams, W&B config)
        self.steps = StepCounter()  # the logging axis global_step (env steps, or episodes without diagnostics)
        # eval.select=best: the run ends with its best release on public selection episodes (dppo/training/selection.py)
        self.selection = SelectBest(eval_episodes, eval_greedy) if eval_select == "best" and eval_episodes > 0 else None
        self.final_policy: dict = {"rule": "last"}   # what the run ended with (summary.json's ``final_policy``)
        builtin = [EvalCallback(eval_every, eval_episodes, eval_greedy), *([self.selection] if self.selection else []),
                   LoggingCallback(), ProgressBarCallback(progress)]
        if run_dir is not None:
            builtin.append(CheckpointCallback(checkpoint_every))
        # user callbacks of a private run see only released quantities (the Callback docstring's rule)
        user = [ReleasedMetricsCallback(c) if privacy.private else c for c in callbacks]
        self.callbacks = CallbackList(builtin + user)
        self.start_round = 0
        self.round = 0
        self.best_round_return = -math.inf
        self.wall_time_prev = 0.0
        self.stop_reason = None
        self.announce = False       # the CLI's: print where the run goes (and what a resume cost) as it starts
        self.recovered = None       # a resume's cost: {"burned": users, "charged": releases, "replayed": rounds}
        self._t_start = time.perf_counter()

    # ---- state -----------------------------------------------------------------------------
    @property
    def ckpt_dir(self) -> str | None:
        return None if self.run_dir is None else os.path.join(self.run_dir, "checkpoints")

    def state_dict(self) -> dict:
        if self.journal is not None:
            self.journal.sync()
        return {"format": "dppo-ckpt-1", "round": self.round, "fingerprint": self.fingerprint,
                "learner": self.learner.state_dict(), "privacy": self.privacy.state_dict(),
                "sampler": None if self.sampler is None else self.sampler.state_dict(),
                "rng": rng_state(), "best_round_return": self.best_round_return, "steps": self.steps.state_dict(),
                "wall_time_s": self.wall_time(), "provenance": self.provenance(), "secret": dict(self.secret),
                "public_env_steps": self.learner.public_env_steps,
                "selection": None if self.selection is None else self.selection.state_dict(),
                "journal_offset": None if self.journal is None else self.journal.offset}

    def provenance(self) -> dict | None:
        """Which users the current policy's training consumed (``dppo/training/provenance.py``)."""
        if self.population is None:
            return None
        return provenance.record(seed=self.meta.get("seed", 0), algo=self.meta.get("algo", self.learner.name),
                                 env_id=self.meta.get("env_id", ""), population=self.population,
                                 sampler=self.sampler, inherited=self.inherited)

    def data_fingerprint(self, key: str) -> str | None:
        """The keyed fingerprint of the env's rows under ``key`` (None for an env that is not rows)."""
        return None if self.data_parts is None else secret.data_fingerprint(key, self.data_parts())

    def adopt_secret(self, stored: dict | None) -> None:
        """Continue under a stored secret (a checkpoint's or the journal's): its key, after checking that this
        run was handed the same rows (same keyed fingerprint); one line otherwise."""
        if not isinstance(stored, dict) or not stored.get("key"):
            return   # a checkpoint from before the secret existed: nothing to check against
        if stored.get("data") is not None and self.data_fingerprint(stored["key"]) != stored["data"]:
            raise ConfigError("these are not the rows this run was trained on (public and private prompts, in "
                              "order): user ids would name other people's prompts; pass the same train_dataset / "
                              "eval_dataset (or the same env.path file, unchanged)")
        self.secret = {"key": stored["key"], "data": stored.get("data")}
        if self.population is not None:
            self.population.set_key(stored["key"])

    def load_state_dict(self, state: dict) -> None:
        check_fingerprint(state["fingerprint"], self.fingerprint, extendable=self.extendable(state))
        self.adopt_secret(state.get("secret"))
        self.learner.load_state_dict(state["learner"])
        self.privacy.load_state_dict(state["privacy"])
        if self.sampler is not None and state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
            if "users" not in state["privacy"] and not self.sampler.multi_pass:   # a checkpoint from before the gate
                self.privacy.users.burn(self.sampler.used)
        set_rng_state(state["rng"])
        self.round = self.start_round = int(state["round"])
        self.best_round_return = float(state["best_round_return"])
        self.wall_time_prev = float(state["wall_time_s"])
        self.steps.load_state_dict(state.get("steps"))
        if state.get("public_env_steps") is not None:
            self.learner.public_env_steps = int(state["public_env_steps"])
        if self.selection is not None:
            self.selection.load_state_dict(state.get("selection"))
        # what an interrupted session logged after this checkpoint is redone: drop it from the logs
        self.logger.purge_after(self.steps.global_step(self.logger.diagnostics))
        self.recover_journal(state.get("journal_offset") or 0)

    def extendable(self, state: dict) -> dict:
        """The keys a resume may raise over the checkpoint's values: ``rounds``, when more rounds leave every
        user's guarantee unchanged (one-pass parallel composition: new rounds take new users); else the
        reason why not, for the refusal's one line."""
        rules = self.extend_refusal if isinstance(self.extend_refusal, dict) else {"rounds": self.extend_refusal}
        return {k: reason or int(state.get("round", 0)) for k, reason in rules.items()}

    def restart_from_initial_state(self) -> None:
        """Resume a run that has no usable checkpoint (a crash before the first one, or every one corrupt):
        start again from the initial policy, drop what the lost attempts logged, and apply the journal from
        its start (their users burned, their releases charged)."""
        self.logger.purge_after(-1)
        if self.journal is not None:
            starts = [e for e in UserJournal.read(self.journal.path) if e["event"] == "start" and e.get("secret")]
            if starts:
                self.adopt_secret(starts[0]["secret"])   # the lost attempts' users were keyed with it
        self.recover_journal(0)
        self._resumed = True

    def recover_journal(self, offset: int) -> None:
        """Apply the resume rule to what the journal holds past the checkpoint (``offset``): a crashed
        attempt's takes and releases (``dppo/training/journal.py``).

        Secure noise (private run): the attempt's users are burned (the sampler skips them for ever, the
        rounds are redone on fresh users) and its releases are charged to the accountant, labelled
        ``lost`` (under parallel composition in their own group: their users were burned); a learner
        whose releases span rounds adds its own charges (``lost_attempt_charges``).
        Seeded noise, or a non-private run: the replay from the checkpoint is bit-identical, so it may
        take the same users; the journal checks that it does.
        """
        if self.journal is None:
            return
        events = UserJournal.read(self.journal.path, offset)
        takes = [e for e in events if e["event"] == "take"]
        releases = [e for e in events if e["event"] == "release"]
        if not (takes or releases):
            return
        if not (self.privacy.private and self.privacy.noise.secure):
            self.journal.expect = {int(e["round"]): list(e["users"]) for e in takes}
            self.recovered = {"burned": 0, "charged": 0, "replayed": len({int(e["round"]) for e in takes})}
            return
        if self.sampler is not None:
            self.sampler.burn(sorted({int(u) for e in takes for u in e["users"]}))
        before = copy.deepcopy(self.privacy.accountant)
        charged = [self.privacy.charge(e["entry"], lost=True, incarnation=int(e["incarnation"])) for e in releases]
        if takes:
            charged += [self.privacy.charge(entry, replay=True) for entry in
                        self.learner.lost_attempt_charges(sorted({int(e["round"]) for e in takes}))]
        self.recovered = {"burned": len({int(u) for e in takes for u in e["users"]}), "charged": len(charged),
                          "replayed": 0}
        if charged:
            self.check_resume_budget(before, charged)

    def check_resume_budget(self, before, charged: list[dict]) -> None:
        """Refuse (one line naming the amount) a resume whose charged releases put eps above the target or
        ``privacy.max_epsilon``, unless ``privacy.allow_over_target=true``.

        Two ways a charge overshoots: the eps spent is already above the target or the cap once they are
        charged (PUCB's second copy of its counters); or the charges compose with the run's other releases
        (basic, multi-pass RDP/PRV, GFA's composition), so the finished run ends above the total its plan
        meets. The second is measured by the accountant itself: the same releases made once more as
        ordinary releases, with and without the charges; under parallel composition (one pass, burned
        users) the difference is zero, since a lost attempt's users are disjoint from every other round's.
        For the composing accountants the increase of a finished run is at most this difference (their
        totals grow concavely in further releases).
        """
        target, cap, delta = self.privacy.eps, self.privacy.max_epsilon, self.privacy.delta
        now = self.privacy.spent()[0]
        with_charges, without = copy.deepcopy(before), copy.deepcopy(before)
        for e in charged:
            plain = {k: v for k, v in e.items() if k not in ("lost", "replay", "incarnation")}
            with_charges.step(plain)
            without.step(plain)
        for e in charged:
            with_charges.step(e)
        excess = with_charges.spent(delta)[0] - without.spent(delta)[0]
        tol = 1e-9 * max(1.0, target)
        why = ("multi-pass burns no users: they stay in the population and are drawn again, so the lost releases "
               "count" if self.privacy.multi_pass else "their users are burned")
        what = f"the crashed attempt's {len(charged)} release(s) must be charged ({why}) and"
        if now > target + tol:
            reason = f"{what} put eps spent at {now:.4g}, above the target eps={target:g}"
        elif cap is not None and now > cap + tol:
            reason = f"{what} put eps spent at {now:.4g}, above privacy.max_epsilon={cap:g}"
        elif excess > tol:
            reason = (f"{what} compose with the run's other releases: the finished run would spend up to "
                      f"{excess:.4g} more than its target eps={target:g}")
        else:
            return
        if not self.allow_over_target:
            raise PrivacyError(f"resume refused: {reason}; to accept that, resume with privacy.allow_over_target=true")
        if self.dist.is_main:
            print(f"dppo: warning: privacy.allow_over_target=true: {reason}", file=sys.stderr, flush=True)

    def save_checkpoint(self) -> str | None:
        if self.ckpt_dir is None:
            return None
        try:
            path = save_checkpoint(self.ckpt_dir, self.round, self.state_dict())
            self.learner.export_artifacts(self.run_dir, self.round)  # e.g. a LoRA adapter in peft's layout
            self.write_summary()
        except OSError as err:
            raise DPPOError(f"cannot write a checkpoint in {self.ckpt_dir}: {err.strerror or err}; "
                            f"free space or fix permissions, then resume") from None
        self.callbacks.on_checkpoint(self, path)
        return path

    def try_resume(self) -> bool:
        """Continue ``run_dir`` from its newest good checkpoint (True), or, when it has none (a crash before
        the first checkpoint, or every one damaged), from the initial state with the journal applied (False):
        every crash point can be resumed, and no user a lost attempt took is handed out again."""
        if self.ckpt_dir is None:
            return False
        state, _ = load_latest_checkpoint(self.ckpt_dir) if os.path.isdir(self.ckpt_dir) else (None, None)
        if state is None:
            self.restart_from_initial_state()
            return False
        self.load_state_dict(state)
        self._resumed = True
        return True

    def remove_stale_temp_files(self) -> None:
        """Temp files of writes a killed process never finished (``*.tmp.<pid>``): never read, removed once
        this process holds the run lock (so no other process can be writing them)."""
        for pattern in (os.path.join(self.run_dir, "*.tmp.*"), os.path.join(self.run_dir, "checkpoints", "*.tmp.*"),
                        os.path.join(self.run_dir, "*.tmp")):
            for path in glob.glob(pattern):
                try:
                    os.remove(path)
                except OSError:
                    pass

    def check_capacity(self) -> None:
        """Before this session's first round: the users still to draw fit in what the population has left
        (burned, excluded and used users counted), one line otherwise."""
        sampler = self.sampler
        if sampler is None or self.round >= self.learner.num_rounds:
            return
        what = "the population" if self.capacity_limit is None else f"the env's population ({self.meta.get('env_id')})"
        if sampler.multi_pass:
            sampler.check_capacity(0, self.capacity_limit, what)
            return
        taken = len(sampler.used) - len(sampler.burned)     # the completed rounds' users
        need = self.learner.planned_users(sampler.users_per_round) - taken
        sampler.check_need(need, self.capacity_limit, what)   # the base UserSampler's checks nothing

    # ---- loop ------------------------------------------------------------------------------
    def wall_time(self) -> float:
        return self.wall_time_prev + time.perf_counter() - self._t_start

    def fit(self) -> dict:
        """Train until ``learner.num_rounds`` rounds are done, a callback stops, or the budget runs out."""
        lock = RunLock(self.run_dir) if self.run_dir else None
        try:
            if lock:
                lock.acquire()
                self.remove_stale_temp_files()
                finished = None if self.dist.enabled else self.finished_summary()
                if finished is not None:
                    # a resume of a finished run with no more rounds to do: nothing is run, written or charged
                    self.nothing_to_do = self.nothing_to_do_line()
                    if self.dist.is_main:
                        print(self.nothing_to_do, file=sys.stderr, flush=True)
                    self.summary = finished
                    return finished
            if self.privacy.private and not self.privacy.noise.secure and self.dist.is_main:
                print(SEEDED_WARNING, file=sys.stderr, flush=True)
            if self.journal is not None:
                if not self._resumed and UserJournal.read(self.journal.path):
                    # a fresh start in a directory whose earlier attempt crashed before its first checkpoint:
                    # everything that attempt journalled (and logged) is lost, and the same rule applies
                    self.restart_from_initial_state()
                self.journal.durable = self.privacy.private
                self.journal.open(self.start_round, secret=self.secret)
                self.privacy.journal = self.journal
                if self.sampler is not None:
                    self.sampler.journal = self.journal
            if self.dist.enabled:
                self.sync_from_main()
            if self.dist.is_main:
                self.check_capacity()
            with torch_threads(self.threads):   # dppo/training/threads.py: the build's choice for the work
                return self._fit()
        finally:
            if lock:
                lock.release()
            if self.journal is not None:
                self.journal.close()
            self.logger.close()

    def finished_summary(self) -> dict | None:
        """The run directory's ``summary.json`` when this (resumed) run is already complete at its planned
        rounds, else None."""
        if not self._resumed or self.round < self.learner.num_rounds:
            return None
        try:
            with open(os.path.join(self.run_dir, "summary.json")) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            return None     # the run ended its rounds but not its summary: fit finishes it
        return summary if summary.get("complete") and summary.get("rounds_done") == self.round else None

    def nothing_to_do_line(self) -> str:
        """One line for a resume with nothing to do: what is done and how to extend the run (or why not)."""
        rules = self.extend_refusal if isinstance(self.extend_refusal, dict) else {"rounds": self.extend_refusal}
        unit, planned = self.learner.run_length, self.learner.planned_length
        done = f"dppo: nothing to do: {self.run_dir} has done all {planned} of its {unit}"
        if rules.get(unit):
            return f"{done}; it cannot be extended ({rules[unit]}): start a new run"
        return (f"{done}; to extend it with new users, raise {unit}: python train.py resume={self.run_dir} "
                f"{unit}={2 * int(planned)}")

    def sync_from_main(self) -> None:
        """Multi-process run: every rank starts from rank 0's learner state and round (after its resume)."""
        state = distributed.broadcast_object(
            {"round": self.round, "learner": self.learner.state_dict()} if self.dist.is_main else None, self.dist)
        if not self.dist.is_main:
            self.learner.load_state_dict(state["learner"])
            self.round = self.start_round = int(state["round"])

    def start_line(self) -> str:
        """One line as a CLI run starts: where it writes, and for a resume where it continues and what the lost
        attempt cost (its users burned, its releases charged: ``recover_journal``)."""
        total = self.learner.num_rounds
        if not self._resumed:
            eps = f"eps={self.privacy.eps:g}" if self.privacy.private else "non-private"
            return (f"dppo: {self.meta.get('algo')} on {self.meta.get('env_id')}, {eps}, {total} rounds -> "
                    f"{self.run_dir} (Ctrl-C is safe: resume={self.run_dir} continues)")
        line = f"dppo: resuming {self.run_dir} at round {self.round} of {total}"
        rec = self.recovered
        if rec and rec["replayed"]:
            line += (f"; {rec['replayed']} lost round(s) replayed on the same users (seeded noise or no privacy: "
                     f"the replay is bit-identical)")
        elif rec and self.sampler is not None and self.sampler.multi_pass and rec["charged"]:
            # a multi-pass round's Poisson sample size depends on who is in the population: no user count here
            line += f"; the lost attempt's {rec['charged']} release(s) charged (multi-pass: its users stay drawable)"
        elif rec and (rec["burned"] or rec["charged"]):
            line += (f"; the lost attempt's {rec['burned']} user(s) burned (never drawn again) and "
                     f"{rec['charged']} release(s) charged")
        elif self.round < total:
            line += "; nothing was lost since the checkpoint"
        if self.privacy.private:
            line += f"; eps spent {self.privacy.spent()[0]:.4g} of {self.privacy.eps:g}"
        return line

    def interrupted_line(self) -> str:
        """One line for Ctrl-C: how far the run got and how to continue it (and what continuing costs)."""
        if self.run_dir is None:
            return f"dppo: interrupted in round {self.round + 1} of {self.learner.num_rounds}; nothing was saved"
        multi_pass = self.sampler is not None and self.sampler.multi_pass
        cost = ("" if not (self.privacy.private and self.privacy.noise.secure) else
                " (any release the interrupted round made is charged)" if multi_pass else
                " (the interrupted round's users are burned and any release it made is charged)")
        return (f"dppo: interrupted in round {self.round + 1} of {self.learner.num_rounds} ({self.round} done); "
                f"continue with: python train.py resume={self.run_dir}{cost}")

    def _fit(self) -> dict:
        self._t_start = time.perf_counter()
        if self.announce and self.dist.is_main:
            print(self.start_line(), file=sys.stderr, flush=True)
        self.callbacks.on_train_start(self)
        while self.round < self.learner.num_rounds:
            r = self.round
            if self.journal is not None:
                self.journal.round = r
            if self.sampler is not None:
                self.sampler.round = r    # the round the user gate records a take under (dppo.privacy.users)
            self.callbacks.on_round_start(self, r)
            try:
                metrics = dict(self.learner.train_round(r))
                if self.dist.enabled:
                    metrics = distributed.merge_metrics(metrics, metrics.get("rollout/users", 0), self.dist)
            except BudgetExhausted as err:
                self.stop_reason = str(err)
                break
            except DataError:
                # Nothing of the failed round was released; its users stay marked as used. The
                # checkpoint lets `resume=` retry round r with fresh users.
                self.save_checkpoint()
                raise
            self.round = r + 1
            if self.sampler is not None and self.sampler.multi_pass:
                metrics = self.expected_counts(metrics)
            self.steps.update(metrics, self.learner)
            metrics.setdefault("privacy/epsilon", self.privacy.spent()[0])
            if "diag/return" in metrics:
                self.best_round_return = max(self.best_round_return, metrics["diag/return"])
            if not self.callbacks.on_round_end(self, r, metrics):
                self.stop_reason = f"stopped by a callback after round {r}"
                break
        selecting = self.selection is not None and self.dist.is_main and self.round > 0
        chosen = self.selection.finish(self) if selecting else None
        self.save_checkpoint()   # the last iterate: what an extension of the run continues from
        if chosen is not None:
            self.use_selected(chosen)
        summary = self.write_summary(final=True)
        self.export_policy()
        self.callbacks.on_train_end(self)
        return summary

    def use_selected(self, chosen: dict) -> None:
        """``eval.select=best``: put the run's best release (public selection episodes) in the learner's released
        modules, for ``final_return``, ``policy.pt`` and the exported artifacts (the checkpoint keeps the last
        iterate, which an extension continues from)."""
        self.final_policy = chosen
        if chosen["round"] != chosen["last_round"]:
            self.selection.install(self)
            if self.run_dir is not None:
                self.learner.export_artifacts(self.run_dir, self.round)

    def expected_counts(self, metrics: dict) -> dict:
        """A multi-pass round draws a Poisson sample, whose size depends on who is in the population (add/remove
        adjacency): the released counts are the expected ones (q N users, q N G episodes, public), the realised
        ones raw diagnostics (``diag/users``, ``diag/episodes``)."""
        out = dict(metrics)
        expected = self.sampler.sample_rate * self.sampler.population_size
        for key, per_user in (("users", 1), ("episodes", self.learner.summary().get("group_size") or 1)):
            if f"rollout/{key}" in out:
                out[f"diag/{key}"] = out.pop(f"rollout/{key}")
                out[f"rollout/{key}"] = expected * per_user
        return out

    def write_summary(self, final: bool = False) -> dict:
        """``summary.json``: a file safe to share (released and public quantities only, plus the ``diag``
        section of raw statistics, present only with ``logger.diagnostics=true``)."""
        eps_spent, delta_spent = self.privacy.spent()
        private = self.privacy.private
        entries = self.privacy.ledger.entries
        adjacencies = sorted({e.get("adjacency") for e in entries if e.get("adjacency")})
        # multi-pass: the users a Poisson sample drew are counted in the diag section only (expected_counts)
        multi_pass = self.sampler is not None and bool(self.sampler.multi_pass)
        realised_private = self.sampler is None or multi_pass
        summary = {**self.meta, "eps": self.privacy.eps, "delta": self.privacy.delta,
                   "epsilon_spent": eps_spent, "delta_spent": delta_spent, "accountant": self.privacy.accountant.name,
                   "adjacency": ("/".join(adjacencies) if adjacencies else self.privacy.adjacency) if private else None,
                   "noise_source": self.privacy.noise.label if private else None,
                   "rounds_done": self.round,
                   "users_seen": None if realised_private else len(self.sampler.used),
                   "users_burned": None if realised_private else len(self.sampler.burned),
                   "releases_lost": sum(1 for e in entries if e.get("lost")),
                   "final_return": None, "stop_reason": self.stop_reason,
                   "complete": final, **self.learner.summary(),
                   "policy_sha256": parameters_sha256(self.learner.released_modules().get("policy")),
                   "final_policy": dict(self.final_policy),
                   "world_size": self.dist.world_size,
                   "ledger": entries}
        if private and not self.privacy.noise.secure:
            summary["noise_note"] = SEEDED_NOTE
        diagnostics = self.logger.diagnostics
        if diagnostics:
            # timing depends on the users' episode lengths: like every raw statistic, only with diagnostics on
            summary["wall_time_s"] = round(self.wall_time(), 3)
            summary["diag"] = {"best_round_return": _finite(self.best_round_return)}
            if multi_pass:
                summary["diag"]["users_seen"] = len(self.sampler.used)
                summary["diag"]["users_burned"] = len(self.sampler.burned)
        if final and self.eval_episodes > 0:
            summary["final_return"] = float(self.learner.evaluate(self.eval_episodes, self.eval_greedy))
        # env steps: the public rollouts' (evaluation, public Fisher states) are public; the users' are a raw
        # statistic of their data (episode lengths), present only with diagnostics on, like ``diag``
        summary["env_steps"] = {"public": self.learner.public_env_steps}
        if diagnostics:
            summary["env_steps"]["users"] = self.steps.env_steps
        if self.run_dir is not None:
            atomic_write_json(os.path.join(self.run_dir, "summary.json"), summary)
        self.summary = summary
        return summary

    def export_policy(self) -> str | None:
        """``policy.pt``: the final (released) policy, self-sufficient and safe to share with ``summary.json``.

        ``{"format": "dppo-policy-1", "policy": state_dict, "config": the run's public config (policy, env,
        algo: enough to rebuild and run it), "provenance": the users its training consumed in public form
        (``provenance.public_record``: no member of a population of private rows), "rounds_done",
        "algo", "env_id", "summary": summary.json's public part (``POLICY_SUMMARY_KEYS``: eps and delta spent,
        accountant, adjacency, noise source, rounds, the public evaluation)}``, and an actor-critic learner's
        ``"critic"`` state_dict (released like the policy:
        ``policy.init_from`` starts a new run's critic from it); no optimizer, RNG or noise state, no ledger, no
        journal. Loads with ``torch.load(weights_only=True)``.
        """
        released = self.learner.released_modules()
        policy = released.get("policy")
        if self.run_dir is None or policy is None:   # a learner whose policy is no module: nothing to export
            return None
        import io

        import torch

        buf = io.BytesIO()
        saved = {"format": POLICY_FORMAT,
                 "policy": {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()},
                 "config": copy.deepcopy(self.config), "provenance": provenance.public_record(self.provenance()),
                 "rounds_done": int(self.round), "algo": self.meta.get("algo"), "env_id": self.meta.get("env_id"),
                 "summary": {k: copy.deepcopy(v) for k, v in (self.summary or {}).items()
                             if k in POLICY_SUMMARY_KEYS}}
        critic = released.get("critic")
        if critic is not None:
            saved["critic"] = {k: v.detach().cpu().clone() for k, v in critic.state_dict().items()}
        torch.save(saved, buf)
        path = os.path.join(self.run_dir, "policy.pt")
        atomic_write_bytes(path, buf.getvalue())
        return path


def parameters_sha256(module) -> str | None:
    """SHA-256 of a module's ``state_dict`` (names, dtypes, shapes and bytes, in order): equal iff the
    parameters are bit-identical (e.g. a multi-process run against a single-process one); None for no module."""
    if module is None:
        return None
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _finite(x: float):
    return x if math.isfinite(x) else None
