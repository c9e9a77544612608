"""The user journal (``users.journal``): a write-ahead log of the users each round takes and of every release.

One JSON object per line: a ``take`` is written and fsynced *before* the users it names are touched; a
``release`` is written (to the OS, so it survives a killed process) before its result leaves the privacy
context, and made durable by the next take's fsync - before the released policy reaches the next
round's users - or by the checkpoint; a process start is a ``start`` line. One fsync per round: about
1-5 ms on this machine's disk. A non-private run journals without fsync (nothing to protect). A checkpoint stores the journal's byte offset at the time it was written, so after a
crash the lines past that offset are exactly what the checkpoint does not know about: users that a lost
attempt took (and whose data may have reached an output: a TensorBoard event, a release) and releases
that attempt made. What resume does with them is the trainer's rule (``Trainer.recover_journal``):

* secure noise: the lost attempt's users are *burned* (never used again, the round is redone on fresh
  users) and its releases are charged to the accountant (labelled ``lost``);
* seeded noise: a replay from the checkpoint is bit-identical (same users, same noise), so it reveals
  nothing new; the journal is then used to check the replay takes the same users.

A torn last line (a kill during the write) is ignored: its write never returned, so its users were
never touched. The journal names user ids and its start lines hold the run's secret key and keyed data
fingerprint (``dppo/training/secret.py``): it is a secret file of the run directory (mode 0600).
"""
from __future__ import annotations

import json
import os

from dppo.errors import PrivacyError
from dppo.training.faults import maybe_kill

JOURNAL_NAME = "users.journal"


class UserJournal:
    """Append-only, fsynced JSON-lines journal of takes and releases."""

    def __init__(self, path: str):
        self.path = path
        self.round = 0
        self.incarnation = 0
        self.expect: dict[int, list[int]] = {}   # seeded resume: the users a crashed attempt took, per round
        self.durable = True                        # fsync takes (private runs)
        self._fd = None

    # ---- reading -----------------------------------------------------------------------------
    @staticmethod
    def read(path: str, start: int = 0) -> list[dict]:
        """The complete events of ``path`` from byte ``start`` on (torn or garbled lines skipped)."""
        if not os.path.exists(path):
            return []
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
        events = []
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and "event" in ev:
                events.append(ev)
        return events

    @property
    def offset(self) -> int:
        """Bytes durably written so far (what a checkpoint records)."""
        return os.path.getsize(self.path) if os.path.exists(self.path) else 0

    # ---- writing -----------------------------------------------------------------------------
    def open(self, start_round: int, secret: dict | None = None) -> None:
        """Open for appending (after a torn line, start on a fresh line) and journal a process start, with the
        run's secret (its key and keyed data fingerprint: a crash before the first checkpoint keeps them)."""
        previous = [e for e in self.read(self.path) if e["event"] == "start"]
        self.incarnation = len(previous)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")
        start = {"event": "start", "incarnation": self.incarnation, "round": int(start_round)}
        if secret is not None:
            start["secret"] = dict(secret)
        self._append(start, sync=True)

    def take(self, ids) -> None:
        """Journal (fsynced) that the current round takes users ``ids``; call before touching them."""
        if self._fd is None:
            return
        expected = self.expect.pop(int(self.round), None)
        if expected is not None and [int(i) for i in ids] != expected:
            raise PrivacyError(f"the seeded replay of round {self.round} takes other users than the crashed attempt "
                               f"did; its outputs would not be identical, so the run cannot be resumed safely")
        self._append({"event": "take", "round": int(self.round), "incarnation": self.incarnation,
                      "users": [int(i) for i in ids]}, sync=self.durable)
        maybe_kill("after_take", self.round)

    def release(self, entry: dict) -> None:
        """Journal a ledger entry just recorded, before its result is used (durable with the next sync)."""
        if self._fd is None:
            return
        self._append({"event": "release", "round": int(entry.get("round", self.round)),
                      "incarnation": self.incarnation, "entry": entry}, sync=False)
        maybe_kill("after_release", self.round)

    def sync(self) -> None:
        """Make everything written so far durable (before a checkpoint records ``offset``)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def _append(self, event: dict, sync: bool) -> None:
        os.write(self._fd, (json.dumps(event, default=str) + "\n").encode())
        if sync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
