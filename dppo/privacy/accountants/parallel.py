"""One-pass accounting: rounds touch disjoint users, so the run is as private as its worst round."""
from __future__ import annotations

from collections import defaultdict

from dppo.privacy.accountants.base import Accountant, register


@register
class ParallelAccountant(Accountant):
    """Parallel composition over rounds (disjoint users), basic composition within a round.

    Valid only if every user takes part in one round: the one-pass sampler enforces that.
    Guarantee: max over rounds of (sum of eps, sum of delta) of that round's releases.
    """

    name = "parallel"

    def __init__(self):
        self.per_round: dict[str, list[float]] = {}

    @staticmethod
    def group(release: dict) -> str:
        """The set of users a release touched: its round, or (a crashed attempt's release charged on
        resume, ``lost``) that attempt's round, whose users were burned and are disjoint from every other."""
        if release.get("lost"):
            return f"{int(release['round'])}:lost{int(release.get('incarnation', 0))}"
        return str(int(release["round"]))

    def step(self, release: dict) -> None:
        cur = self.per_round.setdefault(self.group(release), [0.0, 0.0])
        cur[0] += float(release["eps"])
        cur[1] += float(release["delta"])

    def spent(self, delta: float | None = None) -> tuple[float, float]:
        if not self.per_round:
            return 0.0, 0.0
        eps = max(v[0] for v in self.per_round.values())
        dlt = max(v[1] for v in self.per_round.values())
        return eps, dlt

    def load_state_dict(self, state: dict) -> None:
        self.per_round = {str(k): list(v) for k, v in state["per_round"].items()}
