"""The Python API: everything the CLI does, without Hydra's command line.

One configuration path: a list of ``key=value`` overrides, a nested dict, a ``TrainConfig`` dataclass or a
``DictConfig`` all go through Hydra's composition of ``conf/`` with the typed schema (``dppo/config.py``), so an
unknown key or a wrong type is the same one-line ``ConfigError`` as on the command line; a run directory gets the
same layout as a CLI run (``.hydra/config.yaml``, ``.hydra/overrides.yaml``) and can be resumed from the CLI.
"""
from __future__ import annotations

import dataclasses
import os
import re

from omegaconf import DictConfig, OmegaConf, open_dict

from dppo.build import build, build_env
from dppo.config import TrainConfig, compose
from dppo.errors import ConfigError, DPPOError
from dppo.training import distributed
from dppo.training.rundir import check_fresh, write_layout

GROUPS = ("algo", "env", "policy", "privacy", "logger", "callbacks")
_PLAIN = re.compile(r"[A-Za-z_/][\w\-./:]*")  # a string Hydra reads as the same string when unquoted
_KEYWORDS = ("true", "false", "null", "none", "inf", "nan", "yes", "no", "on", "off")


def config_error(err: BaseException) -> ConfigError:
    """The one-line error the CLI prints for a Hydra/OmegaConf composition failure."""
    from dppo.cli import _hydra_message

    return ConfigError(_hydra_message(err))


def _compose(overrides: list[str]) -> DictConfig:
    try:
        return compose(overrides)
    except DPPOError:
        raise
    except Exception as err:  # noqa: BLE001 - Hydra's errors, reported as the CLI reports them
        raise config_error(err) from None


def render(value) -> str:
    """A Python value in Hydra's override grammar (strings quoted, so they stay strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _KEYWORDS:
            return value  # as typed on the command line (so errors read the same)
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{render(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"config value {value!r} of type {type(value).__name__} cannot be used in a config")


def dict_to_overrides(d: dict) -> list[str]:
    """Group choices (``{'algo': 'dp_pg'}``) first, then one override per leaf; a dict value is descended
    where the composed config has a group there, else given whole (``algo.fisher_states={low: ...}``)."""
    choices = [f"{k}={v}" for k, v in d.items() if k in GROUPS and isinstance(v, str)]
    base = _compose(choices)
    out = list(choices)

    def walk(prefix: str, value):
        node = OmegaConf.select(base, prefix.lstrip("+"), default=None) if prefix else base
        if isinstance(value, dict) and (not prefix or isinstance(node, DictConfig)):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out.append(f"{prefix}={render(value)}")

    walk("", {k: v for k, v in d.items() if not (k in GROUPS and isinstance(v, str))})
    return out


def dataclass_to_overrides(cfg: TrainConfig) -> list[str]:
    """The fields of a ``TrainConfig`` that differ from the schema's defaults, as overrides; the group fields
    (``algo``, ``env``, ...) may name a group option (``algo='dp_pg'``) or be a dict of overrides."""
    given, default = dataclasses.asdict(cfg), dataclasses.asdict(TrainConfig())
    diff = {}
    for k, v in given.items():
        if k in GROUPS and v is None:
            continue  # None = the config's default choice
        if isinstance(v, dict) and isinstance(default.get(k), dict):
            sub = {kk: vv for kk, vv in v.items() if default[k].get(kk, object()) != vv}
            if sub:
                diff[k] = sub
        elif v != default.get(k):
            diff[k] = v
    return dict_to_overrides(diff)


def as_overrides(cfg) -> list[str] | None:
    """The overrides a config input stands for (None for a DictConfig, which is validated as it is)."""
    if cfg is None:
        return []
    if isinstance(cfg, (list, tuple)):
        return [str(o) for o in cfg]
    if isinstance(cfg, dict):
        return dict_to_overrides(cfg)
    if isinstance(cfg, TrainConfig):
        return dataclass_to_overrides(cfg)
    if isinstance(cfg, DictConfig):
        return None
    raise ConfigError(f"a config must be a list of key=value overrides, a dict, a TrainConfig or a DictConfig, "
                      f"got {type(cfg).__name__}")


def make_config(overrides: list[str] | dict | TrainConfig | DictConfig | None = None) -> DictConfig:
    """The packaged default config with overrides (``key=value`` list, nested dict, or ``TrainConfig``),
    validated exactly like the CLI's (same one-line ``ConfigError`` for an unknown key or a wrong type)."""
    ovr = as_overrides(overrides)
    if ovr is None:
        return validate_dictconfig(overrides)
    return _compose(ovr)


def validate_dictconfig(cfg: DictConfig) -> DictConfig:
    """Type-check a DictConfig against the schema (unknown top-level key, wrong type: one line)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
    except Exception as err:  # noqa: BLE001
        raise config_error(err) from None
    OmegaConf.set_struct(merged, True)
    return merged


def train(cfg=None, run_dir: str | None = None, *, resume: bool = False, callbacks=(), reward_funcs=None,
          reward_weights=None, train_dataset=None, eval_dataset=None, **objects) -> dict:
    """Train from a config (list of ``key=value``, dict, ``TrainConfig`` or DictConfig); returns the summary.

    Any of ``policy``, ``env``, ``privacy``, ``logger``, ``sampler``, ``learner`` may be passed in to
    replace the object the config would build (e.g. your own ``nn.Module`` policy); they are checked against
    the env's spaces and the policy protocol before any user is drawn. A new run refuses a ``run_dir`` that
    already holds a run (``resume=True`` continues it).

    With ``env=prompts``, TRL's names give the rewards and prompts from Python (``dppo.envs.prompts``):
    ``reward_funcs`` (a callable, a dotted path, or a list of them; called as ``f(prompts=, completions=,
    **columns)``), ``reward_weights``, ``train_dataset`` and ``eval_dataset`` (a ``datasets.Dataset`` or a list
    of dicts). They go to the prompts env, so the split rules and checks are those of a prompts file: the
    weighted reward is clipped to ``reward_bound``, user ids name private rows only, evaluation uses the public
    ones. The run's config records the rewards' dotted names and the rows' SHA-256; a resume (or
    ``dppo.load``) must pass the same objects again.
    """
    inputs = {"reward_funcs": reward_funcs, "reward_weights": reward_weights, "train_dataset": train_dataset,
              "eval_dataset": eval_dataset}
    return _train(cfg, run_dir, resume=resume, callbacks=callbacks, write_config=True, prompt_inputs=inputs,
                  **objects)


def python_prompts(cfg: DictConfig, reward_funcs=None, reward_weights=None, train_dataset=None,
                   eval_dataset=None):
    """The prompts env built from ``cfg.env`` with rewards / rows passed from Python (None if none is given);
    ``cfg.env`` is updated in place to record them (dotted reward names, the rows' fingerprint)."""
    given = {"reward_funcs": reward_funcs, "reward_weights": reward_weights, "dataset": train_dataset,
             "eval_dataset": eval_dataset}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    from dppo.envs.prompts import PYTHON_ROWS, PromptsEnv

    target = OmegaConf.select(cfg, "env._target_", default=None)
    if target != f"{PromptsEnv.__module__}.{PromptsEnv.__name__}":
        raise ConfigError(f"reward_funcs / reward_weights / train_dataset / eval_dataset apply to env=prompts, "
                          f"not to env target {target}")
    if "reward_funcs" in given and not isinstance(reward_funcs, (list, tuple)):
        given["reward_funcs"] = [reward_funcs]
    env = build_env(cfg, **given)  # a recorded env.data_sha256 (resume, load) is checked by the env
    with open_dict(cfg):
        if "reward_funcs" in given:
            cfg.env.reward = None
            cfg.env.reward_funcs = list(env.reward_names)
        if "reward_weights" in given:
            cfg.env.reward_weights = list(env.reward_weights)
        if "dataset" in given:
            cfg.env.path = PYTHON_ROWS
            cfg.env.data_sha256 = env.data_sha256
    return env


def _train(cfg, run_dir, *, resume: bool = False, callbacks=(), write_config: bool = True, prompt_inputs=None,
           **objects) -> dict:
    overrides = as_overrides(cfg)
    cfg = make_config(cfg)
    env = python_prompts(cfg, **(prompt_inputs or {}))
    if env is not None:
        if objects.get("env") is not None:
            raise ConfigError("pass either env= or reward_funcs / train_dataset / eval_dataset, not both")
        objects["env"] = env
    dist = distributed.init()  # a torchrun launch: join the process group (dppo/training/distributed.py)
    try:
        if run_dir is not None and not resume and dist.is_main:
            check_fresh(run_dir)
        trainer = build(cfg, run_dir, callbacks=callbacks, **objects)
        if resume:
            def load():
                if not trainer.try_resume():
                    raise ConfigError(f"no usable checkpoint in {run_dir}/checkpoints; start a new run instead")
            distributed.on_main(load, dist)  # rank 0 loads; fit() hands the state to the other ranks
        if run_dir is not None and write_config and not resume and dist.is_main:
            write_layout(run_dir, cfg, overrides)
        return trainer.fit()
    finally:
        distributed.shutdown(dist)


def load_run_config(run_dir: str, overrides: list[str] | None = None) -> DictConfig:
    """The saved config of a run directory (``.hydra/config.yaml``) with extra overrides applied."""
    path = os.path.join(run_dir, ".hydra", "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir} is not a run directory (no .hydra/config.yaml); "
                          f"pass the directory of an earlier run")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(path))
        cfg.resume = None
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    except Exception as err:  # noqa: BLE001
        raise config_error(err) from None
    return cfg
