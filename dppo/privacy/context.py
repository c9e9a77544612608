"""The privacy context handed to every learner: target (eps, delta), noise, ledger, accountant."""
from __future__ import annotations

from dppo.errors import BudgetExhausted
from dppo.privacy.accountants import Accountant, ParallelAccountant
from dppo.privacy.ledger import Ledger
from dppo.privacy.noise import NoiseSource


class PrivacyContext:
    """One object through which every private release goes: ``release`` records it in the ledger
    and steps the accountant together, so no learner can forget either.

    ``eps=None`` means non-private: learners skip their privatizer and nothing is released.
    """

    def __init__(self, eps: float | None = None, delta: float = 1e-5, *, accountant: Accountant | None = None,
                 noise: NoiseSource | None = None, ledger: Ledger | None = None,
                 max_epsilon: float | None = None, multi_pass: bool = False, population_size: int | None = None):
        self.eps = None if eps is None else float(eps)
        self.delta = float(delta)
        self.accountant = accountant or ParallelAccountant()
        self.noise = noise or NoiseSource(0)
        self.ledger = ledger or Ledger()
        self.max_epsilon = max_epsilon
        self.multi_pass = bool(multi_pass)
        self.population_size = population_size

    @property
    def private(self) -> bool:
        return self.eps is not None

    def release(self, mechanism: str, *, round: int, users: int, eps: float, delta: float = 0.0, **params) -> dict:
        """Record one private release; raises BudgetExhausted (recording nothing) if it would pass max_epsilon."""
        entry = {"mechanism": mechanism, "round": round, "users": users, "eps": eps, "delta": delta, **params}
        if self.max_epsilon is not None:
            after, _ = self.accountant.spent_after(entry, self.delta)
            if after > self.max_epsilon + 1e-12:
                raise BudgetExhausted(f"the next release ({mechanism}, round {round}) would raise eps to "
                                      f"{after:.4g} > privacy.max_epsilon={self.max_epsilon}; stopping")
        recorded = self.ledger.record(mechanism, round=round, users=users, eps=eps, delta=delta, **params)
        self.accountant.step(recorded)
        return recorded

    def spent(self) -> tuple[float, float]:
        """(eps, delta) spent so far, from the accountant."""
        return self.accountant.spent(self.delta)

    def state_dict(self) -> dict:
        return {"ledger": self.ledger.state_dict(), "accountant": self.accountant.state_dict(),
                "noise": self.noise.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ledger.load_state_dict(state["ledger"])
        self.accountant.load_state_dict(state["accountant"])
        self.noise.load_state_dict(state["noise"])
