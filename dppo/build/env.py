"""The env group: ``cfg.env`` instantiated, with a prompts env's objects given from Python (TRL's names)."""
from __future__ import annotations

import sys

from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from dppo.build.checks import check_target_keys, unwrap_build_error
from dppo.errors import ConfigError
from dppo.training import distributed

ENV_INPUTS = ("reward_funcs", "reward_weights", "train_dataset", "eval_dataset")  # TRL's names, Python only


def build_env(cfg, inputs: dict | None = None):
    """Instantiate cfg.env. ``inputs``: objects passed from Python to a prompts env (TRL's ``reward_funcs``,
    ``reward_weights``, ``train_dataset``, ``eval_dataset``: callables and rows, not config values), given to
    its constructor as they are; ``cfg.env`` records the rewards' dotted names and ``env.path=<python rows>``
    (nothing about the rows: a resume or ``dppo.load`` checks them against the run's keyed fingerprint, kept
    in its secret files)."""
    check_target_keys(cfg.env, "env", cfg=cfg)
    given = env_inputs(cfg, inputs)
    try:
        if not given:
            env = instantiate(cfg.env, _convert_="all")
        else:   # not through the config (OmegaConf would copy rows and callables into nodes)
            env = instantiate(cfg.env, _convert_="all", _partial_=True)(**given)
    except Exception as err:  # noqa: BLE001 - hydra wraps the real error
        raise unwrap_build_error(err, "env") from None
    if given:
        record_env_inputs(cfg, env, given)
    # e.g. a prompts file without a split column: every row is private, nothing is evaluated. The line may name
    # the number of private rows: the console only (the operator's), never a run's files
    note = getattr(env, "split_note", None)
    if isinstance(note, str) and note and distributed.from_env().is_main:
        print(f"dppo: note: {note}", file=sys.stderr, flush=True)
    return env


def env_inputs(cfg, inputs: dict | None) -> dict:
    """The Python objects given for the env, as the prompts env's constructor takes them ({} if none)."""
    given = {k: v for k, v in (inputs or {}).items() if v is not None}
    unknown = set(given) - set(ENV_INPUTS)
    if unknown:
        raise ConfigError(f"unknown env input(s) {sorted(unknown)}; the Python inputs are {list(ENV_INPUTS)}")
    if not given:
        return {}
    from dppo.envs.prompts import PromptsEnv

    target = OmegaConf.select(cfg, "env._target_", default=None)
    if target != f"{PromptsEnv.__module__}.{PromptsEnv.__name__}":
        raise ConfigError(f"reward_funcs / reward_weights / train_dataset / eval_dataset apply to env=prompts, "
                          f"not to env target {target}")
    if "reward_funcs" in given and not isinstance(given["reward_funcs"], (list, tuple)):
        given["reward_funcs"] = [given["reward_funcs"]]
    if "train_dataset" in given:
        given["dataset"] = given.pop("train_dataset")
    return given


def record_env_inputs(cfg, env, given: dict) -> None:
    """Write what the Python inputs were into ``cfg.env``: dotted reward names, weights, and that the rows came
    from Python (``env.path=<python rows>``). Nothing derived from the rows: the config is shareable."""
    from dppo.envs.prompts import PYTHON_ROWS

    with open_dict(cfg):
        if "reward_funcs" in given:
            cfg.env.reward = None
            cfg.env.reward_funcs = list(env.reward_names)
        if "reward_weights" in given:
            cfg.env.reward_weights = list(env.reward_weights)
        if "dataset" in given:
            cfg.env.path = PYTHON_ROWS
