"""The privacy context handed to every learner: target (eps, delta), noise, ledger, accountant."""
from __future__ import annotations

import math

from dppo.errors import BudgetExhausted, PrivacyError
from dppo.privacy.accountants import Accountant, ParallelAccountant
from dppo.privacy.ledger import Ledger
from dppo.privacy.noise import NoiseSource
from dppo.privacy.users import UserGate

ADJACENCIES = ("replace_one", "add_remove")


class PrivacyContext:
    """One object through which every private release goes: ``release`` records it in the ledger
    and steps the accountant together, so no learner can forget either.

    ``eps=None`` means non-private: learners skip their privatizer and nothing is released.
    Without an explicit ``noise`` the context draws from the OS CSPRNG (unpredictable); pass
    ``NoiseSource(seed)`` for reproducible (seeded) noise.

    Ledger vocabulary (one for every mechanism): each release names its ``mechanism``, ``round``,
    ``users`` (count), ``eps``/``delta`` (None when only the accountant can say, e.g. Poisson rounds),
    ``adjacency`` (``replace_one`` or ``add_remove``) and its noise: Gaussian releases ``sigma``,
    ``sensitivity`` (l2) and ``noise_multiplier = sigma / sensitivity``; pure-DP releases their
    scale (``scale`` or ``beta``) and ``sensitivity``.
    """

    def __init__(self, eps: float | None = None, delta: float = 1e-5, *, accountant: Accountant | None = None,
                 noise: NoiseSource | None = None, ledger: Ledger | None = None,
                 max_epsilon: float | None = None, multi_pass: bool = False, population_size: int | None = None,
                 noise_correlation=None, check_users: bool = True):
        self.eps = None if eps is None else float(eps)
        self.delta = float(delta)
        self.accountant = accountant or ParallelAccountant()
        self.noise = noise or NoiseSource.os_csprng()
        self.ledger = ledger or Ledger()
        self.max_epsilon = max_epsilon
        self.multi_pass = bool(multi_pass)
        self.population_size = population_size
        self.noise_correlation = noise_correlation
        self.check_users = bool(check_users)
        self.users = UserGate(self.multi_pass, population_size if self.multi_pass else None, self.check_users)
        self.journal = None      # set by the trainer: every release is journalled before it leaves

    @property
    def private(self) -> bool:
        return self.eps is not None

    @property
    def adjacency(self) -> str:
        """The adjacency of the run's guarantee: add/remove one user for multi-pass, else replace-one."""
        return "add_remove" if self.multi_pass else "replace_one"

    def release(self, mechanism: str, *, round: int, users: int, eps: float | None, delta: float | None = 0.0,
                adjacency: str, **params) -> dict:
        """Record one private release; raises BudgetExhausted (recording nothing) if it would pass max_epsilon."""
        if adjacency not in ADJACENCIES:
            raise PrivacyError(f"release {mechanism}: adjacency must be one of {ADJACENCIES}, got {adjacency!r}")
        sigma, sens, nm = params.get("sigma"), params.get("sensitivity"), params.get("noise_multiplier")
        if sigma is not None and sens and nm is not None and not math.isclose(nm, sigma / sens, rel_tol=1e-9):
            raise PrivacyError(f"release {mechanism}: noise_multiplier {nm} is not sigma / sensitivity = "
                               f"{sigma / sens}")
        entry = {"mechanism": mechanism, "round": round, "users": users, "eps": eps, "delta": delta,
                 "adjacency": adjacency, **params}
        if self.max_epsilon is not None:
            after, _ = self.accountant.spent_after(entry, self.delta)
            if after > self.max_epsilon + 1e-12:
                raise BudgetExhausted(f"the next release ({mechanism}, round {round}) would raise eps to "
                                      f"{after:.4g} > privacy.max_epsilon={self.max_epsilon}; stopping")
        recorded = self.ledger.record(mechanism, round=round, users=users, eps=eps, delta=delta,
                                      adjacency=adjacency, **params)
        self.accountant.step(recorded)
        if self.journal is not None:
            self.journal.release(recorded)
        return recorded

    def charge(self, entry: dict, **labels) -> dict:
        """Record and account a release that already happened (a crashed attempt's, found in the journal on
        resume), with ``labels`` such as ``lost=True``; never refused by ``max_epsilon`` (it is spent)."""
        params = {k: v for k, v in entry.items() if k not in ("mechanism", "round", "users", "eps", "delta")}
        params.update(labels)
        recorded = self.ledger.record(entry["mechanism"], round=entry["round"], users=entry["users"],
                                      eps=entry["eps"], delta=entry["delta"], **params)
        self.accountant.step(recorded)
        return recorded

    def spent(self) -> tuple[float, float]:
        """(eps, delta) spent so far, from the accountant."""
        return self.accountant.spent(self.delta)

    def state_dict(self) -> dict:
        return {"ledger": self.ledger.state_dict(), "accountant": self.accountant.state_dict(),
                "noise": self.noise.state_dict(), "users": self.users.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ledger.load_state_dict(state["ledger"])
        self.accountant.load_state_dict(state["accountant"])
        self.noise.load_state_dict(state["noise"])
        self.users.load_state_dict(state.get("users"))
