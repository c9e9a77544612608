"""The privacy ledger: one entry per private release (what was spent, by which mechanism, on whom)."""
from __future__ import annotations

import copy
import math


class Ledger:
    """Append-only list of releases; saved with every checkpoint and in ``summary.json``."""

    def __init__(self):
        self.entries: list[dict] = []

    def record(self, mechanism: str, *, round: int, users: int, eps: float, delta: float, **params) -> dict:
        """Record one release: mechanism name, its parameters, its (eps, delta), the users it touched."""
        entry = {"mechanism": mechanism, "round": int(round), "users": int(users),
                 "eps": _num(eps), "delta": _num(delta)}
        entry.update({k: _num(v) for k, v in params.items()})
        self.entries.append(entry)
        return entry

    def __len__(self) -> int:
        return len(self.entries)

    def state_dict(self) -> dict:
        return {"entries": copy.deepcopy(self.entries)}

    def load_state_dict(self, state: dict) -> None:
        self.entries = copy.deepcopy(list(state["entries"]))


def _num(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        return v.item()
    return v
