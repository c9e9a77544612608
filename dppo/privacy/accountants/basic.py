"""Basic (sequential) composition: eps and delta add up over every release."""
from __future__ import annotations

from dppo.privacy.accountants.base import Accountant, register


@register
class BasicAccountant(Accountant):
    """Sum of eps and of delta over all releases (Dwork & Roth Thm 3.16); valid for any releases."""

    name = "basic"

    def __init__(self):
        self.eps_total = 0.0
        self.delta_total = 0.0

    def step(self, release: dict) -> None:
        self.eps_total += float(release["eps"])
        self.delta_total += float(release["delta"])

    def spent(self, delta: float | None = None) -> tuple[float, float]:
        return self.eps_total, self.delta_total
