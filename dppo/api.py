"""The Python API: everything the CLI does, without Hydra's command line.

One configuration path: a list of ``key=value`` overrides, a nested dict, a ``TrainConfig`` dataclass or a
``DictConfig`` all go through Hydra's composition of ``conf/`` with the typed schema (``dppo/config.py``), so an
unknown key or a wrong type is the same one-line ``ConfigError`` as on the command line; a run directory gets the
same layout as a CLI run (``.hydra/config.yaml``, ``.hydra/overrides.yaml``) and can be resumed from the CLI.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re

from omegaconf import DictConfig, OmegaConf

from dppo.build import build
from dppo.config import TrainConfig, compose, hydra_message, render
from dppo.errors import ArgumentError, ConfigError, DPPOError
from dppo.training import distributed
from dppo.training.rundir import check_fresh, record_extension, write_layout

GROUPS = ("algo", "env", "policy", "oracle", "logger", "callbacks")  # group choices (a string picks an option)


def config_error(err: BaseException) -> ConfigError:
    """The one-line error the CLI prints for a Hydra/OmegaConf composition failure (``env=CartPole-v1``, a
    gymnasium id where an env option goes: the line names ``env.id=CartPole-v1``)."""
    from dppo.envs.gym_env import env_option_hint

    line = hydra_message(err)
    match = re.match(r"unknown env '([^']+)'", line)
    hint = env_option_hint(match.group(1)) if match else None
    return ConfigError(hint or line)


def _compose(overrides: list[str]) -> DictConfig:
    try:
        return compose(overrides)
    except DPPOError:
        raise
    except Exception as err:  # noqa: BLE001 - Hydra's errors, reported as the CLI reports them
        raise config_error(err) from None


def dict_to_overrides(d: dict) -> list[str]:
    """Group choices (``{'algo': 'dp_pg'}``) first, then one override per leaf: a nested dict is descended to
    its leaves (``{'env': {'id': 'Acrobot-v1'}}`` -> ``env.id=Acrobot-v1``), a list is one value. Nothing is
    composed here: the overrides are composed once, by ``make_config``."""
    out = [f"{k}={v}" for k, v in d.items() if k in GROUPS and isinstance(v, str)]

    def walk(prefix: str, value):
        if isinstance(value, dict) and (value or not prefix):   # {'algo': 'dp_ppo'} alone: no leaf to set
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
    composed once and validated exactly like the CLI's (same one-line ``ConfigError`` for an unknown key or a
    wrong type); a DictConfig is type-checked against the schema as it is."""
    return _config_and_overrides(overrides)[0]


def _config_and_overrides(cfg) -> tuple[DictConfig, list[str] | None]:
    """(the composed config, the overrides it was composed from: None for a DictConfig given whole)."""
    ovr = as_overrides(cfg)
    if ovr is None:
        return validate_dictconfig(cfg), None
    return _compose(ovr), ovr


def validate_dictconfig(cfg: DictConfig) -> DictConfig:
    """Type-check a DictConfig against the schema (unknown top-level key, wrong type: one line); one that is
    already typed by the schema (composed by ``make_config``, Hydra or ``load_run_config``) is returned as it is."""
    if OmegaConf.get_type(cfg) is TrainConfig:
        return cfg
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
    except Exception as err:  # noqa: BLE001
        raise config_error(err) from None
    OmegaConf.set_struct(merged, True)
    return merged


# what TRL's inputs (train_dataset, reward_funcs, ...) imply for a group left at its default choice: prompts as
# users, a causal LM, DP-PG in the GRPO form (the one algorithm with no need for public prompts)
PROMPTS_CHOICES = (("env", "prompts"), ("policy", "lm"), ("algo", "dp_pg"))


@functools.lru_cache(maxsize=1)
def _default_choices() -> dict:
    return dict(compose([], hydra=True).hydra.runtime.choices)


def prompts_overrides(overrides: list[str] | None, inputs: dict) -> list[str] | None:
    """``overrides`` with the group choices of a prompts run put first (``PROMPTS_CHOICES``: env=prompts,
    policy=lm, algo=dp_pg) when TRL's inputs are given and the env is left at its default choice: each for a group
    that neither an override nor an experiment chooses. An env chosen explicitly (``env=...``, or by an
    experiment) is kept as it is (and refused by the build if it takes no prompts); a DictConfig given whole
    (``overrides`` None) is used as it is."""
    if overrides is None or all(v is None for v in inputs.values()):
        return overrides
    named = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    groups = [o for o in overrides if "=" in o and o.split("=", 1)[0].lstrip("+~") in GROUPS + ("experiment",)]
    try:   # the group choices only: a key of the prompts env (env.eval_path=...) is not a key of the default env
        choices, defaults = dict(compose(groups, hydra=True).hydra.runtime.choices), _default_choices()
    except Exception:  # noqa: BLE001 - the composition of the whole config reports it
        return overrides
    if "env" in named or choices.get("env") != defaults.get("env"):
        return overrides
    return [f"{g}={v}" for g, v in PROMPTS_CHOICES if g not in named and choices.get(g) == defaults.get(g)] + overrides


def train(cfg=None, run_dir: str | None = None, *, resume: bool = False, callbacks=(), reward_funcs=None,
          reward_weights=None, train_dataset=None, eval_dataset=None, **objects) -> dict:
    """Train from a config (list of ``key=value``, dict, ``TrainConfig`` or DictConfig); returns the summary.

    Any of ``policy``, ``env``, ``privacy``, ``logger``, ``sampler``, ``learner`` may be passed in to
    replace the object the config would build (e.g. your own ``nn.Module`` policy); they are checked against
    the env's spaces and the policy protocol before any user is drawn. ``env=`` also takes what Stable-Baselines3
    users pass: a registered gymnasium id (``'CartPole-v1'``, ``'pkg:EnvId'``), a ``gymnasium.Env``, a callable or
    class returning a fresh env, a gymnasium vector env (``with_env_argument``, docs/api.md "Your environment");
    the config records which env ran (``env.id``). A new run refuses a ``run_dir`` that
    already holds a run (``resume=True`` continues it, whatever point it stopped at).

    Without ``run_dir`` nothing is written anywhere: no checkpoints, journal, logs, ``policy.pt`` or
    ``summary.json`` (the returned summary and the objects you passed in are all that remains), and such a
    run cannot be resumed. Give a ``run_dir`` to keep the run (the CLI's layout: ``python train.py
    resume=<run_dir>`` continues it).

    With ``env=prompts``, TRL's names give the rewards and prompts from Python (``dppo.envs.prompts``):
    ``reward_funcs`` (a callable, a dotted path, or a list of them; called as ``f(prompts=, completions=,
    **columns)``), ``reward_weights``, ``train_dataset`` and ``eval_dataset`` (a ``datasets.Dataset`` or a list
    of dicts). They go to the prompts env through the one build path (``dppo.build.build_env``), so the split
    rules and checks are those of a prompts file: the weighted reward is clipped to ``reward_bound``, user ids
    name private rows only, evaluation uses the public ones. The run's config records the rewards' dotted names
    and ``env.path=<python rows>``, nothing about the rows; a resume (or ``dppo.load``) must pass the same objects
    again, checked against the rows' keyed fingerprint in the run's secret files.

    These inputs imply ``env=prompts``, ``policy=lm`` and ``algo=dp_pg`` for each of those groups the config
    leaves at its default choice (``prompts_overrides``; an explicit choice is kept), and the rows may stand
    in for the config: ``dppo.train(rows, run_dir, reward_funcs=[f])`` is ``dppo.train(None, run_dir,
    train_dataset=rows, reward_funcs=[f])``. Without a split column or an ``eval_dataset`` every row is a private
    user and nothing is evaluated (``final_return`` null), said in one line on the console.
    """
    from dppo.envs.prompts import is_rows

    if is_rows(cfg):   # dppo.train(rows, ...): TRL's dataset in the config's place
        if train_dataset is not None:
            raise ConfigError("the prompts were given twice: as the first argument and as train_dataset; give them "
                              "once (the config goes first, e.g. dppo.train(['policy.path=...'], train_dataset=rows))")
        cfg, train_dataset = None, cfg
    check_train_keywords(cfg, objects, callbacks)
    inputs = {"reward_funcs": reward_funcs, "reward_weights": reward_weights, "train_dataset": train_dataset,
              "eval_dataset": eval_dataset}
    ovr = as_overrides(cfg)
    composed, overrides = _config_and_overrides(cfg if ovr is None else prompts_overrides(ovr, inputs))
    if objects.get("env") is not None:
        composed, objects["env"], overrides = with_env_argument(composed, objects["env"], overrides)
    trainer, dist = start(composed, run_dir, resume=resume, callbacks=callbacks, overrides=overrides,
                          env_inputs=inputs, **objects)
    return RunSummary(finish(trainer, dist))


class RunSummary(dict):
    """What ``train`` returns: ``summary.json``'s content as a plain dict, printed in a few lines (the ledger, one
    entry per release, is in ``summary["ledger"]``)."""

    def __repr__(self) -> str:
        def num(x):
            return "-" if x is None else (f"{x:.6g}" if isinstance(x, (int, float)) else str(x))

        if self.get("eps") is None:
            privacy = "none (non-private: eps null)"
        else:
            privacy = (f"eps spent {num(self.get('epsilon_spent'))} of {num(self.get('eps'))}, delta spent "
                       f"{num(self.get('delta_spent'))} of {num(self.get('delta'))}")
        chosen = self.get("final_policy") or {}
        kept = f" (the release of round {chosen['round']}: eval.select=best)" if chosen.get("rule") == "best" else ""
        return "\n".join([f"RunSummary({self.get('algo')} on {self.get('env_id')})", f"  privacy: {privacy}",
                          f"  rounds: {self.get('rounds_done')}" + (" (complete)" if self.get("complete") else ""),
                          f"  final_return: {num(self.get('final_return'))}{kept}",
                          f"  ledger: {len(self.get('ledger') or [])} releases; all fields: summary.keys()"])

    __str__ = __repr__


OBJECTS = ("policy", "env", "privacy", "logger", "sampler", "learner")  # the objects dppo.train takes by keyword


def with_env_argument(cfg: DictConfig, env, overrides: list[str] | None):
    """``dppo.train(env=...)`` in any of its forms (a registered id, a ``gymnasium.Env``, a callable or class, a
    vector env, a ``GymEnvFactory``: ``dppo.envs.gym_env.env_argument``), recorded in a copy of the config (and as
    ``env.*`` overrides), so the run's ``.hydra/config.yaml``, ``summary.json`` and checkpoints say which env ran
    and a resume with another env is refused. Returns (config, the env object to build with or None, overrides)."""
    import copy

    from dppo.build.env import apply_env_argument, env_overrides

    cfg = copy.deepcopy(cfg)
    before = OmegaConf.to_container(cfg.env, resolve=True)
    env = apply_env_argument(cfg, env, overrides)
    if overrides is not None:
        overrides = list(overrides) + env_overrides(cfg, before)
    return cfg, env, overrides


def check_train_keywords(cfg, objects: dict, callbacks=()) -> None:
    """Refuse, in one line naming ``dppo.train``, a keyword it does not take (a config key passed as a keyword,
    a typo: a close keyword, and how a config key is passed) and a group's option name where an object goes
    (``env='riverswim'``)."""
    import difflib
    import inspect

    for name, value in [*objects.items(), ("callbacks", callbacks)]:
        if name == "env" and isinstance(value, str) and not _env_option_only(value):
            continue   # a gymnasium id, as env.id= takes it
        if name in GROUPS and isinstance(value, str):
            what = "an object or a gymnasium id" if name == "env" else "an object"
            raise ArgumentError(f"dppo.train({name}={value!r}): the {name}= keyword takes {what}, not an option's "
                                f"name; pick the config's {name} option in the config, as '{name}={value}' in the "
                                f"overrides list or {{'{name}': {value!r}}} in the dict")
    unknown = [k for k in objects if k not in OBJECTS]
    if not unknown:
        return
    name, value = unknown[0], objects[unknown[0]]
    keywords = [k for k in inspect.signature(train).parameters if k != "objects"] + list(OBJECTS)
    key, exact = _config_key(cfg, name)
    close = difflib.get_close_matches(name, keywords, n=1)
    head = f"dppo.train() got an unexpected keyword argument '{name}'"
    try:
        override = render(value)
    except ConfigError:
        override = "..."
    override = f"'{key}={override if len(override) <= 40 else '...'}'"
    shown = repr(value) if len(repr(value)) <= 40 else "..."
    where = f"as {override} in the overrides list or {{'{key}': {shown}}} in the dict"
    if key and exact:
        what = "a config key" if key == name else f"the config key {key}"
        raise ArgumentError(f"{head}: {name} is {what}, which goes in the config, {where}")
    how = f"a config key goes in the config, {where}" if key else \
        "a config key goes in the config, as 'key=value' in the overrides list or {'key': value} in the dict"
    hint = f" (did you mean {close[0]}=?)" if close else f" (did you mean the config key '{key}'?)" if key else ""
    raise ArgumentError(f"{head}{hint}; dppo.train's keywords are {', '.join(keywords)}; {how}")


def _env_option_only(name: str) -> bool:
    """Whether ``dppo.train(env=name)`` names an option of conf/env/ (``'riverswim'``) that no gymnasium id is."""
    from dppo.config import group_options
    from dppo.envs.gym_env import env_option_hint

    return name in group_options("env") and env_option_hint(name) is None


def _config_key(cfg, name: str) -> tuple[str | None, bool]:
    """The config key (dotted) a keyword of ``dppo.train`` names, in ``cfg`` (else the default config), and
    whether its name is exactly the keyword's: (None, False) when no key is close."""
    from dppo.config import did_you_mean, known_keys

    composed = None
    for attempt in (lambda: _config_and_overrides(cfg)[0], lambda: _compose([])):
        try:
            composed = attempt()
            break
        except Exception:  # noqa: BLE001 - only a hint: a bad config is reported once the keywords are right
            continue
    known = known_keys(composed)
    if name in known[""]:
        return name, True
    close = did_you_mean(name, composed, known)
    return (close[0], close[0].rpartition(".")[2] == name) if close else (None, False)


def start(cfg: DictConfig, run_dir: str | None, *, resume: bool = False, callbacks=(), overrides=None,
          write_config: bool = True, **objects):
    """The one path from a composed config to a ready run, shared by the CLI and the API: validate and build
    every object once, in order (``dppo.build.build``: nothing is written before every object is built and
    checked), continue a resumed run's state, then write the run layout (``.hydra/config.yaml``, the
    overrides). Returns (trainer, the process group of a torchrun launch); ``finish`` runs the loop."""
    dist = distributed.init()  # a torchrun launch: join the process group (dppo/training/distributed.py)
    try:
        if run_dir is not None and not resume and dist.is_main:
            check_fresh(run_dir)
        trainer = build(cfg, run_dir, callbacks=callbacks, **objects)
        if resume:
            # rank 0 loads the newest good checkpoint, or (none yet, or all damaged) starts again from the
            # initial state with the journal applied; fit() hands the state to the other ranks
            distributed.on_main(trainer.try_resume, dist)
            if run_dir is not None and dist.is_main:
                record_extension(run_dir, cfg)   # an accepted extension is what the run now is
        if run_dir is not None and write_config and not resume and dist.is_main:
            write_layout(run_dir, cfg, overrides)
    except BaseException:
        distributed.shutdown(dist)
        raise
    return trainer, dist


def finish(trainer, dist) -> dict:
    """Run the loop of a run ``start`` built; returns the summary."""
    try:
        summary = trainer.fit()
    except BaseException:
        distributed.shutdown(dist)
        raise
    distributed.shutdown(dist, clean=True)
    return summary


def load_run_config(run_dir: str, overrides: list[str] | None = None) -> DictConfig:
    """The saved config of a run directory (``.hydra/config.yaml``) with extra overrides applied.

    ``hydra.*`` overrides configure where Hydra puts a *new* run; a resume continues ``run_dir`` in place, so
    they are dropped, and a ``hydra.run.dir`` naming another directory is refused. A group choice (``algo=``,
    ``env=``, ...) is refused in one line: the run keeps its groups (``_check_group_override``).
    """
    path = os.path.join(run_dir, ".hydra", "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir} is not a run directory (no .hydra/config.yaml); "
                          f"pass the directory of an earlier run")
    overrides = [o for o in overrides or [] if not _check_hydra_override(o, run_dir)]
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(path))
        cfg.resume = None
    except Exception as err:  # noqa: BLE001
        raise config_error(err) from None
    overrides = [o for o in overrides if not _check_group_override(o, run_dir, cfg)]
    try:
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    except Exception as err:  # noqa: BLE001
        raise config_error(err) from None
    return cfg


def run_algo_name(cfg) -> str:
    """The algorithm a saved config runs, as its runs are named (``dp_pg``; ``algo=pg eps=5`` is a dp_pg run)."""
    from dppo.build.checks import algo_name
    from dppo.config import learner_target

    cls = learner_target(cfg)
    if cls is None:
        return str(OmegaConf.select(cfg, "algo.name", default=None)
                   or OmegaConf.select(cfg, "algo._target_", default="an unknown learner"))
    return algo_name(cfg, cls, cfg.eps is not None)


def _check_group_override(override: str, run_dir: str, cfg) -> bool:
    """Refuse a group choice (``algo=dp_ppo``, ``env=...``, ``+experiment=...``) on a resume, in one line: a
    resumed run keeps the groups it was started with; a new run is started without ``resume=``. An ``algo=``
    naming the run's own algorithm says nothing and is dropped (True)."""
    key, sep, value = override.partition("=")
    group = key.lstrip("+~")
    if group not in GROUPS + ("experiment",) or not sep:
        return False
    choice = f"{key}={value}"
    if group == "algo":
        name = run_algo_name(cfg)
        if value == name:
            return True
        raise ConfigError(f"resume={run_dir} continues a {name} run, and a resumed run keeps its algorithm "
                          f"(algo={name}): drop {choice} to continue it, or start a new run with {choice} by "
                          f"leaving out resume=")
    raise ConfigError(f"resume={run_dir} continues that run, and a resumed run keeps its {group} (as its "
                      f".hydra/config.yaml says): drop {choice} to continue it, or start a new run with {choice} "
                      f"by leaving out resume=")


def _check_hydra_override(override: str, run_dir: str) -> bool:
    """True for a ``hydra.*`` override (dropped on resume); refuses a ``hydra.run.dir`` other than the run's."""
    key, _, value = override.lstrip("+~").partition("=")
    if not key.startswith("hydra.") and key != "hydra":
        return False
    if key == "hydra.run.dir" and os.path.abspath(value) != os.path.abspath(run_dir):
        raise ConfigError(f"resume={run_dir} continues that run in its own directory; drop hydra.run.dir={value} "
                          f"(a resumed run cannot move)")
    return True
