"""Config -> objects, in one place and in order: env -> policy -> privacy -> sampler -> learner -> trainer."""
from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import json
import math
import os
import sys
import typing

import torch
from hydra.utils import get_class, get_object, instantiate
from omegaconf import OmegaConf, open_dict

from dppo.config import (INJECTABLE, POLICY_KEYS, SPACE_KEYS, accepted_keys, did_you_mean, group_keys,  # noqa: F401
                         hint_line, to_container, validate)
from dppo.data import OnePassUserSampler, PoissonUserSampler
from dppo.envs.memory import physical_memory_bytes
from dppo.envs.reward_ranges import clipping_warning, resolve_reward_bound
from dppo.errors import ConfigError
from dppo.policies.check import check_env, check_policy
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant
from dppo.training import distributed
from dppo.training.logger import make_logger
from dppo.training import secret
from dppo.training.provenance import Population
from dppo.training.trainer import Trainer

# top-level keys that only some learners read: a learner refuses one set to anything but its schema default
SHORTCUTS = ("rounds", "users_per_round", "group_size", "max_grad_norm", "reward_bound", "episodes", "batch_size")
# The only settings a resumed run may change: where and how often it logs, checkpoints, evaluates, stops on
# a public evaluation. Every other key (eps, delta, rounds, users_per_round, group_size, clip norms, the
# algo's and oracle's parameters, accountant, population, secure_rng, max_epsilon, env, policy, seed) can
# change what a release spends or on whom, and a change to it refuses the resume, naming the key.
RESUME_MAY_CHANGE = ("logger", "progress", "checkpoint_every", "eval_episodes", "eval_every", "eval", "resume",
                     "callbacks", "hydra", "privacy.allow_over_target")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # relative policy.init_from: assets/
ROUND_MEMORY_FRACTION = 0.5   # refuse a round (or population) whose arrays would need more than this share of RAM


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def learner_class(cfg):
    try:
        return get_class(cfg.algo._target_)
    except Exception:  # noqa: BLE001
        raise ConfigError(f"algo target '{cfg.algo._target_}' cannot be imported; check conf/algo/") from None


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
        raise _unwrap(err, "env") from None
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


def load_init_source(init_from: str | None) -> tuple[dict | None, dict | None]:
    """``policy.init_from``: a run directory (its newest checkpoint, else its ``policy.pt``), a ``policy.pt``,
    a run's checkpoint file, or a file holding a bare ``state_dict`` (or ``{"policy": state_dict}``); a
    relative path that does not exist from the working directory is read from the repository root.

    Returns (policy state_dict, provenance record: which users the weights' training consumed, or None for
    a bare state_dict, whose provenance is unknown). Every file is read with ``weights_only=True``.
    """
    policy, record, _ = read_init_source(init_from)
    return policy, record


def read_init_source(init_from: str | None) -> tuple[dict | None, dict | None, dict | None]:
    """``load_init_source``'s (policy, provenance record) and the source's critic state_dict (an actor-critic
    run's ``policy.pt`` or checkpoint; None otherwise): the critic's training consumed the same users."""
    from dppo.training import provenance
    from dppo.training.checkpoint import load_latest_checkpoint

    if not init_from:
        return None, None, None
    path = str(init_from)
    if not os.path.exists(path) and not os.path.isabs(path) and os.path.exists(os.path.join(REPO_ROOT, path)):
        path = os.path.join(REPO_ROOT, path)   # the shipped assets/ work from any directory
    if os.path.isdir(path):
        state, _ = load_latest_checkpoint(os.path.join(path, "checkpoints"))
        if state is None and os.path.isfile(os.path.join(path, "policy.pt")):
            state = _torch_load(os.path.join(path, "policy.pt"), path)
        if state is None:
            raise ConfigError(f"policy.init_from={path} is a directory without a readable checkpoint or policy.pt")
    elif os.path.isfile(path):
        state = _torch_load(path, path)
    else:
        raise ConfigError(f"policy.init_from={path} is neither a run directory nor a file")
    if isinstance(state, dict) and state.get("format") == "dppo-policy-1" and isinstance(state.get("policy"), dict):
        record = state.get("provenance")
        return state["policy"], record if provenance.is_record(record) else None, state.get("critic")
    if isinstance(state, dict) and isinstance(state.get("learner"), dict) and "policy" in state["learner"]:
        record = state.get("provenance")
        if not provenance.is_record(record):   # a checkpoint from before provenance: its sampler's ids
            used = (state.get("sampler") or {}).get("used")
            record = None if used is None else provenance.legacy_record(used)
        return state["learner"]["policy"], record, state["learner"].get("critic")
    if isinstance(state, dict) and isinstance(state.get("policy"), dict):
        state = state["policy"]
    if not (isinstance(state, dict) and state and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                      for k, v in state.items())):
        raise ConfigError(f"policy.init_from={path} holds no policy weights (a policy.pt, a run's checkpoint or a "
                          f"state_dict of tensors)")
    return state, None, None


def _torch_load(path: str, shown: str):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - not a torch file, or one that would need to run code
        reason = " ".join(str(err).split())[:120] or type(err).__name__
        raise ConfigError(f"policy.init_from={shown} is not a file torch.load(weights_only=True) can read "
                          f"({type(err).__name__}: {reason})") from None




def build_policy(cfg, env, init_state: dict | None = None):
    """Instantiate cfg.policy for the env's spaces; load ``init_state`` (from ``policy.init_from``: fine-tuning);
    ``policy.freeze`` lists parameter-name prefixes that are not trained (requires_grad=False)."""
    spec = dict(to_container(cfg.policy) or {})
    if "_target_" not in spec:
        return None
    init_from = spec.pop("init_from", None)
    for k in ("init_users_offset", "init_provenance", "init_data_disjoint"):
        spec.pop(k, None)   # read by the builder (provenance), not by the policy
    freeze = spec.pop("freeze", None) or []
    for k in SPACE_KEYS:
        spec.pop(k, None)
    check_target_keys(spec, "policy", extra=POLICY_KEYS + SPACE_KEYS + ("observation_space", "action_space"),
                      cfg=cfg)
    try:
        policy = instantiate(spec, observation_space=env.observation_space, action_space=env.action_space,
                             _convert_="all")
    except Exception as err:  # noqa: BLE001
        raise _unwrap(err, "policy") from None
    if init_state is None and init_from:
        init_state, _ = load_init_source(init_from)
    adapter = getattr(policy, "trainable", None)
    if init_state is not None and callable(adapter) and set(init_state) == {n for n, _ in adapter()}:
        policy.load_adapter_state(init_state)   # a checkpoint of an LM run holds only its adapter's tensors
    elif init_state is not None:
        try:
            policy.load_state_dict(init_state)
        except (RuntimeError, TypeError) as err:
            raise ConfigError(f"policy.init_from does not fit this policy: {str(err).splitlines()[0]}") from None
    names = [n for n, _ in policy.named_parameters()]
    for prefix in freeze:
        hit = [n for n in names if n == prefix or n.startswith(f"{prefix}.")]
        if not hit:
            raise ConfigError(f"policy.freeze: no parameter named {prefix!r} (parameters: {names})")
        for n, p in policy.named_parameters():
            if n in hit:
                p.requires_grad_(False)
    return policy


def build_space(cfg, policy, defaults: dict | None = None):
    """The policy's parameter space (``policy.subspace``, ``policy.dim``; ``dppo.policies.spaces.make_space``);
    ``defaults``: the learner's own choice where the config names none (``space_defaults``, e.g. PPO's full space)."""
    from dppo.policies.spaces import make_space

    spec = to_container(cfg.policy) or {}
    return make_space(policy, seed=cfg.seed, **{**(defaults or {}), **{k: spec[k] for k in SPACE_KEYS if k in spec}})


def parameter_kind(target, key: str) -> tuple[str | None, bool]:
    """What a keyword argument of ``target`` holds: ``int``, ``float``, ``floats`` (a list or tuple of numbers)
    or None (anything else), from its annotation, else its default's type; and whether null is allowed."""
    classes = [target]
    if inspect.isclass(target):
        classes = [c for c in target.__mro__ if "__init__" in vars(c) and c is not object]
    for c in classes:
        fn = c.__init__ if inspect.isclass(c) else c
        param = inspect.signature(fn).parameters.get(key)
        if param is None:
            continue
        try:
            hint = typing.get_type_hints(fn).get(key, param.annotation)
        except Exception:  # noqa: BLE001 - an annotation that does not resolve: read it as text below
            hint = param.annotation
        return _kind_of(hint, param.default)
    return None, True


def _kind_of(hint, default) -> tuple[str | None, bool]:
    if isinstance(hint, str):   # an unresolved annotation: its text ("int | None", "float")
        names = {t.strip() for t in hint.replace("Optional[", "").rstrip("]").split("|")}
        optional = "None" in names or default is None
        names.discard("None")
        base = {"int": int, "float": float}.get(next(iter(names))) if len(names) == 1 else None
        return (base.__name__ if base else None), optional
    if hint is inspect.Parameter.empty:
        if isinstance(default, bool) or default is inspect.Parameter.empty or default is None:
            return None, True
        if isinstance(default, int):
            return "int", False
        if isinstance(default, float):
            return "float", False
        if isinstance(default, (list, tuple)) and default and all(isinstance(v, float) for v in default):
            return "floats", False
        return None, True
    args = typing.get_args(hint)
    optional = type(None) in args or default is None
    bases = [a for a in args if a is not type(None)] if args and typing.get_origin(hint) not in (list, tuple) else [hint]
    if len(bases) != 1:
        return None, optional
    base = bases[0]
    if base is int:
        return "int", optional
    if base is float:
        return "float", optional
    if typing.get_origin(base) in (list, tuple) and set(typing.get_args(base)) - {Ellipsis} <= {float, int}:
        return "floats", optional
    return None, optional


def check_target_values(target, spec: dict, group: str) -> None:
    """Refuse, before anything runs, a value a numeric key cannot hold (one line): a non-integer for an integer
    key (``algo.epochs=2.5`` would run 2 epochs and record 2.5), a NaN or infinite number for a float key
    (``algo.ent_coef=nan`` would drop the term), whatever the learner, env, policy or oracle; the types are
    the signature's (``parameter_kind``). A NaN or infinity is refused for a key of unknown type too."""
    for key, value in spec.items():
        kind, optional = parameter_kind(target, key)
        if value is None:
            continue
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{group}.{key} must be an integer{' (or null)' if optional else ''}, got {value!r}")
        if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{group}.{key} must be a number{' (or null)' if optional else ''}, got {value!r}")
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{group}.{key} must be a finite number, got {value!r}")


def check_config_values(cfg) -> None:
    """``check_target_values`` for every group of the run (algo, env, policy and its parameter space, oracle),
    on the composed config, before any object is built."""
    from dppo.policies.spaces import make_space

    for group in ("algo", "env", "policy", "oracle"):
        node = cfg.get(group)
        if node is None or "_target_" not in node:
            continue
        spec = {k: v for k, v in to_container(node).items() if k != "_target_"}
        try:
            target = get_object(str(node["_target_"]))
        except Exception:  # noqa: BLE001 - an import error is reported when the object is built
            continue
        if group == "policy":
            check_target_values(make_space, {k: spec.pop(k) for k in SPACE_KEYS if k in spec}, group)
            for k in POLICY_KEYS:
                spec.pop(k, None)
        check_target_values(target, spec, group)
    check_policy_device(cfg)


def check_policy_device(cfg) -> None:
    """``device=cuda`` moves only a policy that takes a device (``policy=lm``); the gym policies, the bandit's
    and the tabular learners run on the CPU, so there it is refused rather than recorded and ignored. Then
    the machine must have CUDA."""
    from dppo.config import check_device

    if not str(cfg.device).startswith("cuda"):
        return
    node = cfg.get("policy")
    takes = node is not None and "_target_" in node and "device" in node
    if not takes:
        shown = OmegaConf.select(cfg, "policy._target_", default=None) or "no policy"
        raise ConfigError(f"device={cfg.device} applies to a policy that takes a device (policy=lm); this run's "
                          f"policy ({str(shown).rsplit('.', 1)[-1]}) runs on the CPU: drop device, or use "
                          f"device=auto")
    check_device(cfg.device)


def check_target_keys(node, group: str, extra=(), cfg=None) -> None:
    """Refuse a key of a group (env, policy, oracle) that the object it builds does not take, or a value its
    type cannot hold (one line). With the run's ``cfg``, a close or same-named key of another group is suggested
    too (``env.epochs`` -> ``algo.epochs``)."""
    spec = dict(node if isinstance(node, dict) else to_container(node) or {})
    target = spec.pop("_target_", None)
    if target is None:
        return
    try:
        module, _, attr = target.rpartition(".")
        obj = getattr(importlib.import_module(module), attr)
    except Exception:  # noqa: BLE001 - an import error is reported when the object is built
        return
    valid = accepted_keys(obj)
    if valid is None:
        return
    valid |= set(extra)
    for key in spec:
        if key not in valid:
            if cfg is not None:
                hint = hint_line(did_you_mean(f"{group}.{key}", cfg))
            else:
                close = difflib.get_close_matches(key, sorted(valid), n=1)
                hint = f" (did you mean '{group}.{close[0]}'?)" if close else ""
            shown = sorted(valid - {"observation_space", "action_space"})
            raise ConfigError(f"unknown key '{group}.{key}'{hint}: {target.rsplit('.', 1)[-1]} takes {shown}")
    # build() checked every group already (check_config_values); this serves scripts that build one object
    check_target_values(obj, {k: v for k, v in spec.items() if k not in extra}, group)


def algo_name(cfg, cls=None, private: bool | None = None) -> str:
    """The run's algorithm name: the learner's own (``names``: its non-private and private twin, e.g. pg and
    dp_pg, so ``algo=pg eps=5`` is a dp_pg run), else ``algo.name``, else the group choice."""
    names = getattr(cls, "names", None)
    if names and private is not None:
        return names[1 if private else 0]
    if cfg.algo.get("name"):
        return str(cfg.algo.name)
    if cls is not None and getattr(cls, "name", "learner") != "learner":
        return cls.name
    return _algo_name(cfg)


def check_shortcuts(cfg, cls) -> None:
    """Refuse a top-level shortcut (``SHORTCUTS``, ``oracle``) set for a learner that does not read it: one line
    naming what it reads instead (``algo=dp_npg max_grad_norm=0.1``: DP-NPG's oracle clips its rows)."""
    from dppo.config import TrainConfig

    sig = inspect.signature(cls.__init__).parameters
    reads = {k for k in SHORTCUTS if k in sig} | set(getattr(cls, "reads", ()))
    defaults = TrainConfig()
    for key in SHORTCUTS:
        if key not in reads and cfg[key] != getattr(defaults, key):
            hint = ""
            if key == "max_grad_norm" and "oracle" in sig:
                hint = " (its oracle clips each user's rows: oracle.x_bound, oracle.y_bound)"
            elif key in ("rounds", "users_per_round") and "episodes" in reads:
                hint = ", which runs for a number of episodes (one user each)"
            raise ConfigError(f"{key}={cfg[key]} does not apply to algo={algo_name(cfg, cls, cfg.eps is not None)}"
                              f"{hint}; it reads {sorted(reads) or 'none of them'}: remove {key}")
    if cfg.oracle is not None and "oracle" not in sig:
        raise ConfigError(f"oracle= applies to the regression learners (npg, rebel and their private twins), not to "
                          f"algo={algo_name(cfg, cls, cfg.eps is not None)}: remove it")


def build_oracle(cfg, cls, private: bool, dim: int):
    """The oracle group (``oracle=<name>``, ``oracle.<key>=``) or the learner's default for its privacy and space."""
    from dppo.oracles import make_oracle

    if cfg.oracle is None:
        return make_oracle(cls.default_oracle(private, dim))
    check_target_keys(cfg.oracle, "oracle", cfg=cfg)
    try:
        return instantiate(cfg.oracle, _convert_="all")
    except Exception as err:  # noqa: BLE001 - hydra wraps the real error
        raise _unwrap(err, "oracle") from None


def _default_accountant(cls, cfg) -> str:
    """The learner's own accountant choice (``accountant_name(privacy_cfg[, algo_cfg])``), else rdp/parallel."""
    fn = getattr(cls, "accountant_name", None)
    if fn is None:
        return "rdp" if cfg.privacy.multi_pass else "parallel"
    if len(inspect.signature(fn).parameters) >= 2:
        return fn(cfg.privacy, to_container(cfg.algo))
    return fn(cfg.privacy)


def inherited_provenance(cfg, record: dict | None, population, init_state: dict | None = None) -> list[dict]:
    """What the weights of ``policy.init_from`` consumed (their provenance), plus the users
    ``policy.init_users_offset=<n>`` names (this run's ids 0..n-1). A bare state_dict has no provenance: it is
    refused unless the offset is stated (0 = the weights never saw a user of this population). A shareable
    ``policy.pt`` of a run on private rows withholds its members: they are read from that run's directory
    (``policy.init_provenance=<run_dir>``), or the user states ``policy.init_data_disjoint=true``."""
    from dppo.training import provenance

    init_from = OmegaConf.select(cfg, "policy.init_from", default=None)
    offset = OmegaConf.select(cfg, "policy.init_users_offset", default=None)
    source = OmegaConf.select(cfg, "policy.init_provenance", default=None)
    disjoint = OmegaConf.select(cfg, "policy.init_data_disjoint", default=None)
    if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool) or offset < 0):
        raise ConfigError(f"policy.init_users_offset must be an integer >= 0, got {offset}")
    if disjoint is not None and not isinstance(disjoint, bool):
        raise ConfigError(f"policy.init_data_disjoint must be true or false, got {disjoint}")
    for key, value in (("init_users_offset", offset), ("init_provenance", source), ("init_data_disjoint", disjoint)):
        if value not in (None, False) and not init_from:
            raise ConfigError(f"policy.{key} applies to policy.init_from (the users its weights consumed); "
                              f"set policy.init_from too, or drop policy.{key}")
    if not init_from:
        return []
    if record is None and offset is None:
        raise ConfigError(f"policy.init_from={init_from} is a bare state_dict: which users trained it is unknown; "
                          f"state policy.init_users_offset=<n> (its training used user ids 0..n-1 of this run's "
                          f"population; 0 if it never saw one of them), or init from a run directory or its policy.pt")
    if source:
        record = secret_provenance(source, init_from, init_state)
    elif provenance.withheld(record):
        if not disjoint:
            raise ConfigError(f"policy.init_from={init_from} is a shared policy.pt of a run on private rows, which "
                              f"does not carry their members; name that run's directory with "
                              f"policy.init_provenance=<run_dir> (or init from the directory itself), or state "
                              f"policy.init_data_disjoint=true if this run's data share no person with its")
        print(f"dppo: note: policy.init_data_disjoint=true: no row of this run is skipped for the private rows "
              f"that trained policy.init_from={init_from} (stated disjoint)", file=sys.stderr)
        record = {**record, "consumed": [e for e in record["consumed"] if not e.get("withheld")]}
    out = list(record["consumed"]) if record is not None else []
    if offset:
        out.append(provenance.offset_entry(population, offset))
    return out


def secret_provenance(source: str, init_from: str, init_state: dict | None) -> dict:
    """``policy.init_provenance``: the whole provenance record of the run that wrote ``policy.init_from``, read
    from its secret files (its newest checkpoint: a run directory or a checkpoint file), after checking
    that the checkpoint holds the very weights being loaded."""
    from dppo.training import provenance
    from dppo.training.checkpoint import load_latest_checkpoint

    path = str(source)
    state = None
    if os.path.isdir(path):
        state, _ = load_latest_checkpoint(os.path.join(path, "checkpoints"))
    elif os.path.isfile(path):
        state = _torch_load(path, path)
    if not (isinstance(state, dict) and isinstance(state.get("learner"), dict)
            and provenance.is_record(state.get("provenance"))):
        raise ConfigError(f"policy.init_provenance={path} is not a run directory (or checkpoint) with a readable "
                          f"checkpoint; name the directory of the run that wrote policy.init_from")
    if not _holds_the_weights(state["learner"].get("policy"), init_state):
        raise ConfigError(f"policy.init_provenance={path} is not the run that wrote policy.init_from={init_from} "
                          f"(its newest checkpoint holds other weights); name that run's own directory")
    return state["provenance"]


def _holds_the_weights(saved, init_state) -> bool:
    """Whether a checkpoint's policy tensors are the ones being loaded: every saved tensor (a checkpoint may hold
    only the trainable ones, e.g. an LM's adapter, under the wrapped module's names) equals its init tensor."""
    if not (isinstance(saved, dict) and saved and isinstance(init_state, dict)):
        return False
    for k, v in saved.items():
        mine = init_state.get(k, init_state.get(f"model.{k}"))
        if not (torch.is_tensor(v) and torch.is_tensor(mine) and v.shape == mine.shape and torch.equal(v, mine)):
            return False
    return True


def exclude_pretraining_users(sampler, population, consumed: list[dict]) -> None:
    """Private fine-tuning never reuses a user whose data trained the initial weights: their ids are skipped
    for ever (``dppo.training.provenance.exclude``)."""
    from dppo.training import provenance

    if sampler is not None and consumed:
        provenance.exclude(sampler, population, consumed, "policy.init_from")


def build_privacy(cfg, cls) -> PrivacyContext:
    p = cfg.privacy
    name = p.accountant
    if p.multi_pass and cfg.eps is not None and _releases_pure_dp(cfg, cls):
        raise ConfigError(f"privacy.multi_pass=true: Opacus' RDP/PRV accounting composes Poisson-subsampled "
                          f"Gaussian releases, and {cls.__name__} makes pure-DP releases; use one-pass training")
    if name is None:
        name = _default_accountant(cls, cfg)
    if p.multi_pass and name not in ("rdp", "prv"):
        raise ConfigError("privacy.multi_pass=true needs privacy.accountant=rdp or prv (users are reused)")
    check_accountant(cfg, cls, name)
    return PrivacyContext(cfg.eps, cfg.delta, accountant=make_accountant(name),
                          noise=NoiseSource(cfg.seed, secure=p.secure_rng), max_epsilon=p.max_epsilon,
                          multi_pass=p.multi_pass, population_size=p.population_size)


def check_accountant(cfg, cls, name: str) -> None:
    """Refuse, before round 0, an accountant or composition that cannot account this learner's releases."""
    if cfg.eps is None:
        return
    p = cfg.privacy
    if name in ("rdp", "prv") and not p.multi_pass:
        raise ConfigError(f"privacy.accountant={name} composes Poisson-subsampled rounds and needs "
                          f"privacy.multi_pass=true with privacy.population_size; one-pass runs use parallel "
                          f"(the default) or basic")
    pure = _releases_pure_dp(cfg, cls)
    if p.multi_pass and pure:
        raise ConfigError(f"privacy.multi_pass=true: Opacus' RDP/PRV accounting composes Poisson-subsampled "
                          f"Gaussian releases, and {cls.__name__} makes pure-DP releases; use one-pass training")
    carries_rho = bool(getattr(cls, "releases_carry_rho", lambda c: False)(cfg))   # Gaussian releases with their zCDP rho
    if name in ("advanced", "zcdp") and not pure and not (name == "zcdp" and carries_rho):
        raise ConfigError(f"privacy.accountant={name} composes pure-DP (delta=0) releases only, and "
                          f"{cls.__name__} makes (eps, delta) Gaussian releases; use privacy.accountant=parallel "
                          f"(one-pass default) or basic")
    if name == "gdp" and (pure or not carries_rho):
        raise ConfigError(f"privacy.accountant=gdp composes the Gaussian continual counters' releases only, and "
                          f"{cls.__name__} (with this config) makes other releases; use privacy.accountant=null "
                          f"(the learner's default)")
    uses_composition = getattr(cls, "uses_composition", False)
    if uses_composition and p.accountant is not None and p.composition != "advanced" and p.accountant != p.composition:
        raise ConfigError(f"privacy.accountant={p.accountant} contradicts privacy.composition={p.composition}; "
                          f"set privacy.accountant=null and choose privacy.composition")
    if p.composition != "advanced" and not uses_composition:
        raise ConfigError(f"privacy.composition={p.composition} applies to the GFA learners only; "
                          f"{cls.__name__} is accounted by privacy.accountant")
    # one-pass rounds (and PUCB's counters) each spend the whole eps at once; multi-pass rounds and GFA's
    # composed releases spend a share of it, so a lower cap there just stops the run early
    if p.max_epsilon is not None and p.max_epsilon < cfg.eps and not p.multi_pass and not uses_composition:
        raise ConfigError(f"privacy.max_epsilon={p.max_epsilon} is below eps={cfg.eps}: the run would stop "
                          f"before its first full round; raise privacy.max_epsilon or lower eps")
    if p.max_epsilon is not None and p.multi_pass and p.population_size and name in ("rdp", "prv"):
        from dppo.privacy.accountants.opacus import multi_pass_first_release_epsilon

        first = multi_pass_first_release_epsilon(cfg.eps, cfg.delta, cfg.users_per_round / p.population_size,
                                                 cfg.rounds, name)
        if first > p.max_epsilon:
            raise ConfigError(f"privacy.max_epsilon={p.max_epsilon} is below the {first:.4g} that the first "
                              f"multi-pass round spends (eps={cfg.eps} over {cfg.rounds} rounds): the run would "
                              f"stop before round 0; raise privacy.max_epsilon")


def _releases_pure_dp(cfg, cls) -> bool:
    """Whether every release of the learner is pure eps-DP (delta = 0): a learner says so itself
    (``releases_pure_dp``); an oracle-based learner is pure with the exponential-mechanism oracle."""
    if hasattr(cls, "releases_pure_dp"):
        return bool(cls.releases_pure_dp(cfg))
    if "oracle" in inspect.signature(cls.__init__).parameters and cfg.oracle is not None:
        return getattr(get_class(cfg.oracle._target_), "name", None) == "exp_mech"
    return False


def build_sampler(cfg, noise=None):
    p = cfg.privacy
    if p.multi_pass:
        return PoissonUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed, noise=noise)
    sampler = OnePassUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed)
    return sampler


def check_memory(cfg, env=None, policy=None) -> None:
    """Refuse, before anything is allocated, a population or a round whose arrays cannot fit in memory.

    Estimates (float64 / int64 entries): a finite population's visiting order (one-pass) or per-round
    coins (multi-pass), 8 bytes per user; a round's padded episodes, users x horizon x (obs + 3) entries,
    and, with a policy, users x parameters x 3 (per-user gradients, clipped copy, workspace).
    """
    limit = physical_memory_bytes()
    if limit is None:
        return
    limit = int(limit * ROUND_MEMORY_FRACTION)
    pop = cfg.privacy.population_size
    if pop is not None and 8 * int(pop) > limit:
        raise ConfigError(f"privacy.population_size={pop} needs ~{8 * int(pop) / 2**30:.3g} GiB for its user "
                          f"order, more than {ROUND_MEMORY_FRACTION:.0%} of this machine's memory; lower it")
    horizon = getattr(env, "horizon", None)
    space = getattr(env, "observation_space", None)
    if not horizon or space is None or getattr(space, "shape", None) is None:
        return
    import math as _math

    obs = _math.prod(space.shape) if space.shape else 1
    group = OmegaConf.select(cfg, "group_size", default=None) or 1
    m = int(cfg.users_per_round) * int(group)
    need = 8 * m * int(horizon) * (obs + 3)
    if policy is not None and hasattr(policy, "parameters"):
        need += 8 * 3 * int(cfg.users_per_round) * sum(p.numel() for p in policy.parameters())
    if need > limit:
        raise ConfigError(f"one round (users_per_round={cfg.users_per_round}, horizon {horizon}) needs "
                          f"~{need / 2**30:.3g} GiB, more than {ROUND_MEMORY_FRACTION:.0%} of this machine's "
                          f"memory; lower users_per_round or env.horizon")


def build_learner(cfg, cls, objects: dict):
    """Call the learner with its own algo keys plus the injectable objects and top-level keys its signature names."""
    params = dict(to_container(cfg.algo))
    params.pop("_target_")
    params.pop("name", None)
    params.pop("private", None)  # conf/algo/pucb.yaml still names it; eps alone decides privacy
    sig = inspect.signature(cls.__init__).parameters
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in sig.values())
    # a run-level key under algo. (algo.rounds) would be replaced by the top-level one: refused, not ignored
    unknown = [k for k in params if (k not in sig and not accepts_any) or k in INJECTABLE]
    if unknown:
        valid = sorted(k for k in sig if k not in INJECTABLE and k != "self")
        hint = hint_line(did_you_mean(f"algo.{unknown[0]}", cfg))
        raise ConfigError(f"unknown key 'algo.{unknown[0]}'{hint} for algo={algo_name(cfg, cls, cfg.eps is not None)}; "
                          f"valid: {valid}")
    available = {"seed": cfg.seed, "rounds": cfg.rounds, "users_per_round": cfg.users_per_round,
                 "group_size": cfg.group_size, "episodes": cfg.episodes, "batch_size": cfg.batch_size,
                 "max_grad_norm": cfg.max_grad_norm, "reward_bound": learner_reward_bound(cfg, cls, objects),
                 "eps": objects["privacy"].eps,
                 "delta": cfg.delta, **objects}
    if "oracle" in sig and "oracle" not in objects:
        space = objects.get("space")
        available["oracle"] = build_oracle(cfg, cls, objects["privacy"].private, space.dim if space is not None else 0)
    if hasattr(cls, "check_config"):
        oracle = available.get("oracle")
        cls.check_config(params, oracle=oracle,
                         oracle_keys=[k for k in (to_container(cfg.oracle) if cfg.oracle is not None else {})
                                      if k != "_target_"])
    for k in INJECTABLE:
        if k in sig and k in available and (available[k] is not None or k not in ("episodes",)):
            params[k] = available[k]
    return cls(**params)


def check_writable(run_dir: str) -> None:
    """Fail at start, in one line, if the run directory cannot be written."""
    probe = os.path.join(run_dir, f".write_probe.{os.getpid()}")
    try:
        os.makedirs(run_dir, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.remove(probe)
    except OSError as err:
        raise ConfigError(f"the run directory {run_dir} is not writable ({err.strerror}); "
                          f"choose another hydra.run.dir or free space") from None


def fingerprint(cfg) -> dict:
    """Every setting a resumed run must share with the original, flattened (``oracle.x_bound``);
    the checkpoint stores it and resume compares it key by key (``check_fingerprint``)."""
    flat = _flat(to_container(cfg))
    keep = {k: _plain(v) for k, v in flat.items()
            if k.split(".", 1)[0] not in RESUME_MAY_CHANGE and k not in RESUME_MAY_CHANGE}
    keep["_hash"] = hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return keep


def _plain(v):
    if isinstance(v, (list, tuple)):
        return json.dumps(v, default=str)
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def learner_reward_bound(cfg, cls, objects: dict) -> float | None:
    """``reward_bound`` as the learner gets it (``dppo.envs.reward_ranges.resolve_reward_bound``), with a public
    warning on stderr when it cuts into the env's declared range."""
    sig = inspect.signature(cls.__init__).parameters
    needs = "reward_bound" in sig and sig["reward_bound"].default not in (None, inspect.Parameter.empty)
    private = objects["privacy"].private
    bound = resolve_reward_bound(cfg.reward_bound, objects["env"], private=private, needs_bound=needs,
                                 seed=cfg.seed, algo=algo_name(cfg, cls, private))
    warning = clipping_warning(bound, objects["env"])
    if warning and distributed.from_env().is_main:
        print(f"dppo: warning: {warning}", file=sys.stderr, flush=True)
    return bound


def build(cfg, run_dir: str | None = None, *, callbacks=(), policy=None, env=None, privacy=None, logger=None,
          sampler=None, learner=None, env_inputs: dict | None = None) -> Trainer:
    """Build every object of a run from ``cfg``, once and in order (env -> privacy -> sampler -> logger ->
    policy -> space -> oracle -> learner -> trainer); any object passed in is used instead of being built.
    Nothing is written before every object is built and checked: the run directory is made last.
    ``env_inputs``: a prompts env's objects from Python (``build_env``; ``cfg.env`` records them)."""
    validate(cfg)
    check_config_values(cfg)
    dist = distributed.from_env()
    if not dist.is_main:  # torchrun rank > 0: computes its shard of each round, writes nothing
        run_dir = None
    seed_everything(cfg.seed)
    cls = learner_class(cfg)
    check_shortcuts(cfg, cls)
    check_memory(cfg)
    env_given = env is not None
    if env_given and any(v is not None for v in (env_inputs or {}).values()):
        raise ConfigError("pass either env= or reward_funcs / train_dataset / eval_dataset, not both")
    env = env if env_given else build_env(cfg, env_inputs)
    privacy = privacy if privacy is not None else build_privacy(cfg, cls)
    init_state, init_record, init_critic = read_init_source(OmegaConf.select(cfg, "policy.init_from", default=None))
    if sampler is None:
        sampler = build_sampler(cfg, privacy.noise)
    key = secret.new_key()   # the run's secret (dppo/training/secret.py): a resume adopts the stored one
    population = Population(env, sampler, key)
    inherited = inherited_provenance(cfg, init_record, population, init_state)
    exclude_pretraining_users(sampler, population, inherited)
    if logger is None:
        logger = make_logger(run_dir, **{**to_container(cfg.logger), **({} if dist.is_main else {"console": False})})
    if learner is None:
        sig = inspect.signature(cls.__init__).parameters
        objects = {"env": env, "privacy": privacy, "sampler": sampler, "logger": logger}
        if init_critic is not None and "init_critic" in sig:   # an actor-critic source: its critic too
            objects["init_critic"] = init_critic
        if "policy" in sig:
            if env_given:
                check_env(env)
            cls.check_env(env)
            if policy is None:
                check_policy_fits_env(cfg, env)
            objects["policy"] = policy if policy is not None else build_policy(cfg, env, init_state)
            if objects["policy"] is not None:
                check_policy(objects["policy"], env)  # before any user is drawn
                if "space" in sig:
                    objects["space"] = build_space(cfg, objects["policy"], getattr(cls, "space_defaults", None))
        check_memory(cfg, env, objects.get("policy"))
        learner = build_learner(cfg, cls, objects)
    if dist.enabled:
        distributed.attach(learner, dist)
    cb = [instantiate(spec) for spec in (to_container(cfg.callbacks) or {}).values()] + list(callbacks)
    meta = {"algo": algo_name(cfg, cls, privacy.private), "env_id": getattr(env, "id", type(env).__name__),
            "seed": cfg.seed}
    hparams = resolved_hparams(cfg, privacy, learner)
    env_population = getattr(env, "population", None)
    # an env with no held-out public data (prompts that are all private) is not evaluated: final_return null
    evaluates = dist.is_main and getattr(env, "evaluates", True)
    trainer = Trainer(learner, privacy, logger, sampler=sampler, callbacks=cb, run_dir=run_dir,
                      checkpoint_every=cfg.checkpoint_every, eval_episodes=cfg.eval_episodes if evaluates else 0,
                      eval_greedy=cfg.eval.greedy, progress=cfg.progress and dist.is_main, meta=meta,
                      fingerprint=fingerprint(cfg), eval_every=cfg.eval_every if dist.is_main else None,
                      hparams=hparams, population=population, inherited=inherited, config=public_config(cfg),
                      extend_refusal=extension_rules(cfg, type(learner), privacy),
                      allow_over_target=bool(OmegaConf.select(cfg, "privacy.allow_over_target", default=False)),
                      capacity_limit=env_population if isinstance(env_population, int) else None,
                      key=key, data_parts=getattr(env, "data_parts", None))
    trainer.dist = dist
    if dist.is_main:
        trainer.check_capacity()   # the population covers the run, before any user is drawn
    if run_dir is not None:
        check_writable(run_dir)    # the first thing written: after every object is built and checked
    logger.log_hparams(hparams)  # remembered only; written with the final metrics at the end of the session
    return trainer


def check_policy_fits_env(cfg, env) -> None:
    """Refuse, before anything is instantiated, a policy learner on an env it cannot act in: a tabular MDP (no
    observation or action space) or text prompts with a non-language-model policy."""
    name = _algo_name(cfg)
    if getattr(env, "kind", None) == "prompts":
        target = OmegaConf.select(cfg, "policy._target_", default=None)
        try:
            pcls = get_object(target) if target else None  # a class, or a factory such as policy=auto's
        except Exception:  # noqa: BLE001 - reported by build_policy with the real reason
            return
        missing = [m for m in ("encode", "sample", "token_log_probs") if not callable(getattr(pcls, m, None))]
        if pcls is None or missing:
            from dppo.policies.check import LM_PROTOCOL

            shown = target.rsplit(".", 1)[-1] if target else "none"
            raise ConfigError(f"env=prompts has text prompts as observations, and the policy {shown} cannot act on "
                              f"them; use policy=lm ({LM_PROTOCOL})")
        return
    if getattr(env, "observation_space", None) is None or getattr(env, "action_space", None) is None:
        raise ConfigError(f"algo={name} trains a neural policy and needs an env with observation and action spaces "
                          f"(a gymnasium env.id, env=pendulum, env=bandit, or env=prompts with policy=lm); "
                          f"{getattr(env, 'id', type(env).__name__)} is a tabular MDP: use algo=ubev, pucb, dp_ubev, "
                          f"gfa or gfa_outcome")


def extension_rules(cfg, cls, privacy) -> dict:
    """Whether a resume may raise ``rounds`` / ``episodes`` (extend a run), or why not (the refusal's reason).

    One-pass rounds under parallel composition (and non-private rounds) may grow: each new round takes new
    users, released once at the run's eps, so every user's guarantee stays what it was. Not so where more
    releases compose (multi-pass RDP/PRV, the basic accountant, GFA's batches) or where a learner's private
    counters are sized for its episodes (the tabular learners).
    """
    name = _algo_name(cfg)
    sig = inspect.signature(cls.__init__).parameters
    composes = getattr(cls, "uses_composition", False)
    if "rounds" not in sig:
        rounds = f"algo={name} runs for a number of episodes, not rounds"
    elif privacy.private and privacy.multi_pass:
        rounds = ("multi-pass training composes every round's release (RDP/PRV): more rounds would spend more than "
                  "the target eps")
    elif privacy.private and privacy.accountant.name != "parallel":
        rounds = (f"the {privacy.accountant.name} accountant composes every round's release: more rounds would spend "
                  f"more than the target eps")
    else:
        rounds = None
    rules = {"rounds": rounds}
    if composes:
        rules["episodes"] = (f"algo={name} splits its budget over the batches of the planned episodes (its releases "
                             f"compose): more episodes would spend more than the target eps")
    elif "episodes" in sig:
        rules["episodes"] = (f"algo={name} sizes its counters and confidence bounds for the planned episodes (a "
                             f"private counter's capacity is fixed when it is built)")
    return rules


def public_config(cfg) -> dict:
    """The run's composed config as plain values, without Hydra's section or ``resume``: what ``policy.pt``
    carries to rebuild and run its policy (the same public config as ``.hydra/config.yaml``)."""
    out = to_container(cfg)
    out.pop("hydra", None)
    out.pop("resume", None)
    return out


def resolved_hparams(cfg, privacy, learner) -> dict:
    """The run's hyper-parameters as they were used: the accountant and oracle actually built (not null
    defaults), eps = null for a non-private run, the algorithm's name; flattened ``a.b`` keys."""
    hp = _flat(to_container(cfg))
    hp.pop("resume", None)
    hp["algo"] = algo_name(cfg, type(learner), privacy.private)
    hp["eps"] = privacy.eps
    hp["private"] = bool(privacy.private)
    hp["privacy.accountant"] = privacy.accountant.name
    oracle = getattr(learner, "oracle", None)
    if oracle is not None and hasattr(oracle, "name"):
        hp["oracle"] = oracle.name
    return hp


def _algo_name(cfg) -> str:
    if cfg.algo.get("name"):
        return str(cfg.algo.name)
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices["algo"]
    except Exception:  # noqa: BLE001 - outside a Hydra run
        return OmegaConf.select(cfg, "algo_name") or cfg.algo._target_.rsplit(".", 1)[-1]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _unwrap(err: Exception, group: str) -> Exception:
    """Hydra wraps constructor errors; surface our own ConfigError, or say which group failed and why
    (the innermost error's type and message: the real reason, not Hydra's wrapper line)."""
    e, root = err, err
    while e is not None:
        if isinstance(e, ConfigError):
            return e
        root = e
        e = e.__cause__ or e.__context__
    if root is not err:
        reason = f"{type(root).__name__}: {' '.join(str(root).split())}".rstrip(": ")
    else:   # Hydra folds the cause into its text: "Error in call to target 'X':\nValueError('...')"
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        reason = " ".join(lines[1:]) if len(lines) > 1 else (lines[0] if lines else type(err).__name__)
    return ConfigError(f"cannot build the '{group}' group: {reason}")
