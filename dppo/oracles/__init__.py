"""Private least-squares oracles ([PO] Sec. 4): ``make_oracle(name, **kwargs)``.

``exact`` (non-private), ``ssp`` (sufficient-statistics perturbation, (eps, delta)),
``dp_gd`` (noisy projected GD, (eps, delta) over k composed steps), ``exp_mech`` (pure eps).
"""
from __future__ import annotations

from dppo.errors import ConfigError
from dppo.oracles.base import ExactOracle, LeastSquaresOracle, UserRegression, exact_ridge
from dppo.oracles.dp_gd import DPGDOracle
from dppo.oracles.exp_mech import ExpMechOracle
from dppo.oracles.ssp import SSPOracle

ORACLES: dict[str, type[LeastSquaresOracle]] = {cls.name: cls for cls in (ExactOracle, SSPOracle, DPGDOracle,
                                                                           ExpMechOracle)}


def make_oracle(name: str, **kwargs) -> LeastSquaresOracle:
    """Build the oracle registered as ``name`` with its keyword arguments.

    Keyword arguments are shared by every oracle (``x_bound``, ``y_bound``, ``ridge``, ...) except
    those nested under an oracle's name, which apply only to that oracle, so an algo config can
    carry settings for several oracles and ``oracle=<name>`` picks one.

    Raises:
        ConfigError: unknown name or an argument the oracle does not take.
    """
    if name not in ORACLES:
        raise ConfigError(f"unknown oracle '{name}'; choose one of {sorted(ORACLES)}")
    # keys named after an oracle hold that oracle's own settings: {x_bound: 1, dp_gd: {steps: 5}}
    own = kwargs.get(name) or {}
    kwargs = {k: v for k, v in kwargs.items() if k not in ORACLES}
    kwargs.update(own)
    try:
        return ORACLES[name](**kwargs)
    except TypeError as err:
        raise ConfigError(f"oracle {name}: {err}") from None


__all__ = ["make_oracle", "ORACLES", "LeastSquaresOracle", "UserRegression", "ExactOracle", "SSPOracle",
           "DPGDOracle", "ExpMechOracle", "exact_ridge"]
