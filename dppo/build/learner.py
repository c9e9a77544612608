"""The learner: its own ``algo`` keys plus the objects and top-level keys it declares it needs (``Learner.needs``),
its oracle, and the reward bound it gets."""
from __future__ import annotations

import sys

from hydra.utils import instantiate

from dppo.build.checks import algo_name, check_target_keys, unwrap_build_error
from dppo.config import did_you_mean, hint_line, to_container
from dppo.envs.reward_ranges import clipping_warning, resolve_reward_bound
from dppo.errors import ConfigError
from dppo.training import distributed


def build_learner(cfg, cls, objects: dict):
    """Call the learner with its own algo keys (its hyper-parameters: ``Learner.defaults``) plus what it declares it
    needs (``Learner.needs``: the injectable objects and top-level keys)."""
    params = dict(to_container(cfg.algo))
    params.pop("_target_")
    params.pop("name", None)     # the learner names itself (its name / names); a run saved before says it too
    params.pop("private", None)  # in the configs of runs saved before pucb.yaml dropped it; eps alone decides privacy
    valid = sorted(cls.hyperparameters())    # its algo.* keys, as it declares them
    # a run-level key under algo. (algo.rounds) would be replaced by the top-level one: refused, not ignored
    unknown = [k for k in params if k not in valid]
    if unknown:
        hint = hint_line(did_you_mean(f"algo.{unknown[0]}", cfg))
        raise ConfigError(f"unknown key 'algo.{unknown[0]}'{hint} for algo={algo_name(cfg, cls, cfg.eps is not None)}; "
                          f"valid: {valid}")
    available = {"seed": cfg.seed, "rounds": cfg.rounds, "users_per_round": cfg.users_per_round,
                 "group_size": cfg.group_size, "episodes": cfg.episodes, "batch_size": cfg.batch_size,
                 "max_grad_norm": cfg.max_grad_norm, "reward_bound": learner_reward_bound(cfg, cls, objects),
                 "eps": objects["privacy"].eps,
                 "delta": cfg.delta, **objects}
    if "oracle" in cls.needs and "oracle" not in objects:
        space = objects.get("space")
        available["oracle"] = build_oracle(cfg, cls, objects["privacy"].private, space.dim if space is not None else 0)
    cls.check_config(params, oracle=available.get("oracle"),
                     oracle_keys=[k for k in (to_container(cfg.oracle) if cfg.oracle is not None else {})
                                  if k != "_target_"])
    for k in cls.needs:
        if k in available and (available[k] is not None or k not in ("episodes",)):
            params[k] = available[k]
    return cls(**params)


def build_oracle(cfg, cls, private: bool, dim: int):
    """The oracle group (``oracle=<name>``, ``oracle.<key>=``) or the learner's default for its privacy and space:
    a ``LeastSquaresOracle``, which declares what a learner asks of it (``pure_dp``, ``uses_public_gram``, ...)."""
    from dppo.oracles import make_oracle
    from dppo.oracles.base import LeastSquaresOracle

    if cfg.oracle is None:
        return make_oracle(cls.default_oracle(private, dim))
    check_target_keys(cfg.oracle, "oracle", cfg=cfg)
    try:
        oracle = instantiate(cfg.oracle, _convert_="all")
    except Exception as err:  # noqa: BLE001 - hydra wraps the real error
        raise unwrap_build_error(err, "oracle") from None
    if not isinstance(oracle, LeastSquaresOracle):
        raise ConfigError(f"oracle target '{cfg.oracle._target_}' is not a dppo.oracles.base.LeastSquaresOracle: "
                          f"subclass it (its class attributes declare what a learner asks of an oracle)")
    return oracle


def learner_reward_bound(cfg, cls, objects: dict) -> float | None:
    """``reward_bound`` as the learner gets it (``dppo.envs.reward_ranges.resolve_reward_bound``), with a public
    warning on stderr when it cuts into the env's declared range."""
    needs = "reward_bound" in cls.needs and cls.defaults().get("reward_bound") is not None
    private = objects["privacy"].private
    bound = resolve_reward_bound(cfg.reward_bound, objects["env"], private=private, needs_bound=needs,
                                 seed=cfg.seed, algo=algo_name(cfg, cls, private))
    warning = clipping_warning(bound, objects["env"])
    if warning and distributed.from_env().is_main:
        print(f"dppo: warning: {warning}", file=sys.stderr, flush=True)
    return bound
