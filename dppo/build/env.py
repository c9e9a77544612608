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
    node = cfg.env
    if OmegaConf.select(cfg, "env.wrappers", default=None):   # {_target_: wrapper, ...} entries are specs to keep,
        given = {**given, "wrappers": OmegaConf.to_container(cfg.env.wrappers, resolve=True)}   # not to instantiate
        node = OmegaConf.create({k: v for k, v in cfg.env.items() if k != "wrappers"})
    try:
        if not given:
            env = instantiate(node, _convert_="all")
        else:   # not through the config (OmegaConf would copy rows and callables into nodes)
            env = instantiate(node, _convert_="all", _partial_=True)(**given)
    except Exception as err:  # noqa: BLE001 - hydra wraps the real error
        raise unwrap_build_error(err, "env") from None
    given.pop("wrappers", None)
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


GYM_TARGET = "dppo.envs.gym_env.GymEnvFactory"
# env.* keys a Python env fills in only where the config leaves them at their defaults
ENV_DEFAULTS = {"horizon": None, "kwargs": {}, "vectorization": "auto", "num_envs": "auto", "imports": [],
                "wrappers": []}


def apply_env_argument(cfg, env, overrides: list[str] | None = None):
    """``dppo.train(env=...)``: record in ``cfg.env`` what the env is (``dppo.envs.gym_env.env_argument``: its id,
    and the kwargs, wrappers, horizon, ``num_envs`` and backend it was handed in with, where the config leaves
    them at their defaults; a ``GymEnvFactory``'s arguments as they are) and return the object to build the run
    with (None: the config builds it, as ``python train.py env.id=...`` does). ``overrides`` (the config's, if
    known) and the appended ``env.*`` overrides that say what was recorded. One line for a contradiction: an
    env= on a config whose env group is not a gymnasium one, or an ``env.id`` override naming another env."""
    from dppo.envs.gym_env import FORMS, env_argument

    plan, obj = env_argument(env)
    if plan is None:
        return obj
    target = OmegaConf.select(cfg, "env._target_", default=None)
    if target != GYM_TARGET:
        raise ConfigError(f"dppo.train(env=...) takes {FORMS}, and the config's env group builds {target}: leave "
                          f"out env= or the config's env choice")
    named = [o.split("=", 1)[1] for o in overrides or () if o.lstrip("+~").startswith("env.id=")]
    if named and named[-1] != plan["id"] and obj is None:
        raise ConfigError(f"the env is given twice: env.id={named[-1]} in the config and dppo.train(env=...) "
                          f"({plan['id']}); give it once")
    with open_dict(cfg):
        if obj is not None:   # a GymEnvFactory passed in: the run uses it as it was made
            for key, value in plan.items():
                cfg.env[key] = value
            return obj
        for key, value in plan.items():
            current = OmegaConf.select(cfg.env, key, default=ENV_DEFAULTS.get(key))
            current = OmegaConf.to_container(current) if OmegaConf.is_config(current) else current
            if key in ("imports", "wrappers"):
                cfg.env[key] = list(value) + [v for v in current or [] if v not in value]
            elif key == "kwargs":
                cfg.env[key] = {**value, **(current or {})}
            elif key == "id" or current == ENV_DEFAULTS.get(key):
                cfg.env[key] = value
    return None


def env_overrides(cfg, before) -> list[str]:
    """The ``env.*`` overrides that take ``before`` (the env config as composed) to ``cfg.env``, ``env.id`` always."""
    from dppo.config import render

    now = OmegaConf.to_container(cfg.env, resolve=True)
    return [f"env.{k}={render(v)}" for k, v in now.items()
            if k == "id" or (k != "_target_" and before.get(k, object()) != v)]


def load_env(cfg, inputs: dict | None = None):
    """The env ``dppo.load`` rebuilds a run on, and the inputs left for ``build``: (None, ``inputs``) to build the
    run's own env from its config (as training did; rows given are checked against the run), or, for a prompts
    run whose private prompts are not at hand (rows passed from Python and not given again, or an ``env.path``
    file that is gone), a ``WithheldPromptsEnv`` holding no private row and (env, None): a released model
    generates without the data it was trained on (``dppo/envs/prompts_withheld.py``)."""
    from dppo.envs.prompts import PromptsEnv
    from dppo.envs.prompts_withheld import WithheldPromptsEnv, prompts_at_hand

    target = OmegaConf.select(cfg, "env._target_", default=None)
    if target != f"{PromptsEnv.__module__}.{PromptsEnv.__name__}" or prompts_at_hand(cfg, inputs):
        return None, inputs
    check_target_keys(cfg.env, "env", cfg=cfg)
    given = env_inputs(cfg, inputs)
    spec = OmegaConf.to_container(cfg.env, resolve=True)
    spec.pop("_target_", None)
    for key, value in given.items():   # the Python objects replace their config entries (names, weights)
        spec[key] = value
    if "reward_funcs" in given:
        spec.pop("reward", None)
    return WithheldPromptsEnv(**spec), None
