"""The record of one mechanism's audit (one row of the audit table)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from dppo.audit.bounds import ThresholdAudit, threshold_audit


@dataclass
class MechanismAudit:
    """One audited mechanism.

    Attributes:
        mechanism: table name (e.g. ``dp_pg_round``).
        entry_point: the project function the trials called.
        claimed_eps, delta: the (eps, delta) the project's accountant reports for one release.
        trials: total runs of the mechanism (both inputs, both halves).
        seconds: wall time of the trials and the test.
        test: the threshold test's outcome (eps_lb and its counts).
        gaussian: a white-box Gaussian audit (subject to the power check).
    """

    mechanism: str
    entry_point: str
    claimed_eps: float
    delta: float
    trials: int
    seconds: float
    test: ThresholdAudit
    gaussian: bool = False

    @property
    def eps_lb(self) -> float:
        return self.test.eps_lb

    @property
    def passed(self) -> bool:
        """True when the empirical bound does not contradict the claim (eps_lb <= claimed eps)."""
        return self.eps_lb <= self.claimed_eps + 1e-12

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MechanismAudit":
        return cls(**{**d, "test": ThresholdAudit(**d["test"])})


def conclude(mechanism: str, entry_point: str, claimed: tuple[float, float], null_scores, alt_scores,
             started: float, confidence: float = 0.95) -> MechanismAudit:
    """Run the threshold test on the scores and package the row (``started`` from ``time.perf_counter``)."""
    null = np.asarray(null_scores, dtype=np.float64)
    alt = np.asarray(alt_scores, dtype=np.float64)
    test = threshold_audit(null, alt, claimed[1], confidence)
    return MechanismAudit(mechanism, entry_point, float(claimed[0]), float(claimed[1]), int(null.size + alt.size),
                          time.perf_counter() - started, test)


def same_claim(claims: list[tuple[float, float]]) -> tuple[float, float]:
    """The common (eps, delta) of every batch of trials (they must all agree)."""
    first = claims[0]
    if any(abs(c[0] - first[0]) > 1e-12 or abs(c[1] - first[1]) > 1e-15 for c in claims):
        raise RuntimeError(f"the accountant reported different per-release claims across trials: {set(claims)}")
    return first
