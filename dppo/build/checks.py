"""Checks of a composed config against what it builds, before anything is built: each group's keys and value
types (from the target's signature), the top-level shortcuts a learner does not read, the device; and the
names runs and errors use (the algorithm's name, a build error as one line)."""
from __future__ import annotations

import difflib
import importlib
import inspect
import math
import sys
import typing

from hydra.utils import get_object
from omegaconf import OmegaConf

from dppo.algos.base import Learner
from dppo.config import POLICY_KEYS, SPACE_KEYS, accepted_keys, did_you_mean, hint_line, to_container
from dppo.errors import ConfigError
from dppo.training import distributed

# top-level keys that only some learners read: a learner refuses one set to anything but its default (the
# learner's run shape for rounds / users_per_round / group_size, the schema's for the others)
SHORTCUTS = ("rounds", "users_per_round", "group_size", "max_grad_norm", "reward_bound", "episodes", "batch_size")
# renamed keys: old name -> (new name, the old name's default, which saved configs may carry and which says
# nothing); the old name still works for one release, with a one-line warning (one name, one meaning: the
# accountant that composes a set of releases is an ``accountant`` in every group)
RENAMED_KEYS = {"algo.composition": ("algo.accountant", None), "oracle.composition": ("oracle.accountant", None),
                "privacy.composition": ("privacy.accountant", "advanced")}


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


def key_kind(target, key: str) -> tuple[str | None, bool]:
    """``parameter_kind`` of a group's target: a learner's key from its declaration (``Learner.hyperparameters``),
    any other target's (env, policy, oracle: a class, a function or a user's callable) from its signature."""
    if isinstance(target, type) and issubclass(target, Learner):
        hint, default = target.hyperparameters().get(key, (inspect.Parameter.empty, inspect.Parameter.empty))
        return _kind_of(hint, default)
    return parameter_kind(target, key)


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
    the learner's declaration's or the signature's (``key_kind``). A NaN or infinity is refused for a key of unknown
    type too."""
    for key, value in spec.items():
        kind, optional = key_kind(target, key)
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
    dp_pg, so ``algo=pg eps=5`` is a dp_pg run), else ``algo.name``, else the learner's ``name``, else the group
    choice. ``cls``: the ``Learner`` subclass, or None before it is known (a name for an error line)."""
    if cls is not None and cls.names and private is not None:
        return cls.names[1 if private else 0]
    if cfg.algo.get("name"):
        return str(cfg.algo.name)
    if cls is not None and cls.name != Learner.name:
        return cls.name
    return group_choice_name(cfg)


def group_choice_name(cfg) -> str:
    if cfg.algo.get("name"):
        return str(cfg.algo.name)
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices["algo"]
    except Exception:  # noqa: BLE001 - outside a Hydra run
        return OmegaConf.select(cfg, "algo_name") or cfg.algo._target_.rsplit(".", 1)[-1]


def warn_renamed_keys(cfg) -> None:
    """One line on stderr for each renamed key (``RENAMED_KEYS``) the config sets: its new name and value."""
    for old, (new, default) in RENAMED_KEYS.items():
        value = OmegaConf.select(cfg, old, default=None)
        if value is not None and value != default and distributed.from_env().is_main:
            print(f"dppo: warning: {old} is deprecated and goes in the next release: use {new}={value} (the same "
                  f"choice)", file=sys.stderr, flush=True)


def check_shortcuts(cfg, cls) -> None:
    """Refuse a top-level shortcut (``SHORTCUTS``, ``oracle``) set for a learner that does not read it: one line
    naming what it reads instead (``algo=dp_npg max_grad_norm=0.1``: DP-NPG's oracle clips its rows)."""
    from dppo.config import TrainConfig, run_shape_defaults

    reads = {k for k in SHORTCUTS if k in cls.needs} | set(cls.reads)     # what the learner declares it reads
    defaults = {**vars(TrainConfig()), **run_shape_defaults(cfg)}
    for key in SHORTCUTS:
        if key not in reads and cfg[key] != defaults[key]:
            hint = ""
            if key == "max_grad_norm" and "oracle" in cls.needs:
                hint = " (its oracle clips each user's rows: oracle.x_bound, oracle.y_bound)"
            elif key in ("rounds", "users_per_round") and "episodes" in reads:
                hint = ", which runs for a number of episodes (one user each)"
            raise ConfigError(f"{key}={cfg[key]} does not apply to algo={algo_name(cfg, cls, cfg.eps is not None)}"
                              f"{hint}; it reads {sorted(reads) or 'none of them'}: remove {key}")
    if cfg.oracle is not None and "oracle" not in cls.needs:
        raise ConfigError(f"oracle= applies to the regression learners (npg, rebel and their private twins), not to "
                          f"algo={algo_name(cfg, cls, cfg.eps is not None)}: remove it")


def unwrap_build_error(err: Exception, group: str) -> Exception:
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
