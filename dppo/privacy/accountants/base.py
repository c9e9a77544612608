"""Accountant interface: ``step(release)``, ``spent(delta) -> (eps, delta)``, ``state_dict``."""
from __future__ import annotations

import copy


class Accountant:
    """Turns the ledger's releases into the (eps, delta) guarantee the program prints.

    ``step`` receives each ledger entry (a dict with at least ``mechanism``, ``round``, ``users``,
    ``eps``, ``delta`` and the mechanism's parameters); subclasses read what their analysis needs.
    """

    name = "base"

    def step(self, release: dict) -> None:
        raise NotImplementedError

    def spent(self, delta: float | None = None) -> tuple[float, float]:
        raise NotImplementedError

    def spent_after(self, release: dict, delta: float | None = None) -> tuple[float, float]:
        """What ``spent`` would return after ``release``, without recording it (for budget checks)."""
        trial = copy.deepcopy(self)
        trial.step(release)
        return trial.spent(delta)

    def state_dict(self) -> dict:
        return {"name": self.name, **copy.deepcopy({k: v for k, v in vars(self).items() if not k.startswith("_")})}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            if k != "name":
                setattr(self, k, copy.deepcopy(v))


_REGISTRY: dict[str, type[Accountant]] = {}


def register(cls: type[Accountant]) -> type[Accountant]:
    """Class decorator adding an accountant to the registry under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def make_accountant(name: str, **kwargs) -> Accountant:
    """Build a registered accountant by name (``parallel``, ``rdp``, ``prv``, ...)."""
    from dppo.errors import ConfigError

    if name not in _REGISTRY:
        raise ConfigError(f"unknown accountant '{name}'; choose one of {sorted(_REGISTRY)}")
    return _REGISTRY[name](**kwargs)
