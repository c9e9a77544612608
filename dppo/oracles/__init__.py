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
    """Build the oracle registered as ``name`` (``conf/oracle/<name>.yaml``) with its keyword arguments
    (the class's defaults otherwise).

    Raises:
        ConfigError: unknown name or an argument the oracle does not take.
    """
    if name not in ORACLES:
        raise ConfigError(f"unknown oracle '{name}'; choose one of {sorted(ORACLES)}")
    try:
        return ORACLES[name](**kwargs)
    except TypeError as err:
        raise ConfigError(f"oracle {name}: {err}") from None


__all__ = ["make_oracle", "ORACLES", "LeastSquaresOracle", "UserRegression", "ExactOracle", "SSPOracle",
           "DPGDOracle", "ExpMechOracle", "exact_ridge"]
