"""Structured config schema (validated by Hydra/OmegaConf before any work starts) and value checks."""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from hydra.utils import get_object
from omegaconf import OmegaConf

from dppo.errors import ConfigError
from dppo.training.threads import check_threads

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
# below ~1e-300 the analytic Gaussian's delta(sigma) underflows and its solver pins sigma at its upper limit
MIN_DELTA = 1e-100


@dataclass
class PrivacyConfig:
    """privacy group: how releases are accounted and how noise is drawn."""

    accountant: Optional[str] = None  # null = the learner's default (parallel one-pass; rdp if multi_pass; GFA:
    # advanced, or zcdp); the accountants: dppo/privacy/accountants/
    multi_pass: bool = False  # users resampled (Poisson) across rounds; needs population_size
    population_size: Optional[int] = None  # finite user population for multi-pass
    secure_rng: bool = True  # noise from the OS CSPRNG; false = seeded, reproducible, not private against the seed
    max_epsilon: Optional[float] = None  # stop cleanly before a release would exceed this total
    composition: Optional[str] = None  # deprecated, dropped in the next release: GFA's privacy.accountant
    allow_over_target: bool = False  # resume even if a crashed attempt's charged releases end the run above eps
    noise_correlation: str = "none"  # none | banded | banded_sqrt: DP-PG's / DP-PPO's noise correlated across rounds
    bands: int = 8  # bands of the correlated noise's factorization (docs/correlated_noise.md)
    noise_workload: str = "auto"  # what the factorization is optimized for: auto (SGD's momentum when the learner
    # steps with SGD, else prefix sums) | prefix | momentum


@dataclass
class LoggerConfig:
    """logger group: outputs of the one logger."""

    tensorboard: bool = True
    csv: bool = True
    console: bool = False
    console_every: int = 10
    diagnostics: bool = True  # log raw statistics of users' data under diag/ (switch off in deployment); false
    # also logs against cumulative episodes instead of env steps (which reveal episode lengths)
    wandb: bool = False  # also log to Weights & Biases (logger=wandb; needs the wandb package)
    wandb_project: str = "dppo"
    wandb_mode: Optional[str] = None  # online | offline | disabled (null: W&B's own default)
    wandb_entity: Optional[str] = None
    wandb_group: Optional[str] = None


@dataclass
class EvalConfig:
    greedy: bool = False  # evaluate the stochastic policy unless true
    select: str = "last"  # the policy a run ends with: last | best (its best release on public selection episodes)


@dataclass
class TrainConfig:
    """The top-level keys and their defaults: the one home of each (``conf/config.yaml`` repeats none of them).

    The run-level shortcuts (``rounds`` ... ``oracle``) go to the learners that read them; a learner that does
    not read one refuses it when it is set to anything but its default (``dppo.build.check_shortcuts``).
    """

    algo: Any = None  # algorithm group (conf/algo/<name>.yaml: its _target_ and what differs from its defaults)
    env: Any = None  # environment group (conf/env/)
    policy: Any = None  # policy group (conf/policy/; auto: the MLP the action space calls for)
    oracle: Any = None  # NPG / REBEL: the least-squares oracle group (conf/oracle/; null: the learner's default)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    callbacks: Any = field(default_factory=dict)  # named callback _target_ specs (conf/callbacks/)
    eps: Optional[float] = 5.0  # target eps of the run; null: the non-private twin (the one switch)
    delta: float = 1e-5  # target delta
    seed: int = 0  # seeds python/numpy/torch and env resets; the noise only with privacy.secure_rng=false
    # the run shape; null: the learner's default_run_shape (dppo/algos/base.py: 100 x 10 x 8; NPG's 200 x 15 x 4),
    # filled in when the config is composed (resolve_run_shape), so a run's config records what it ran
    rounds: Optional[int] = None  # PG / NPG / REBEL / PPO: rounds of the one-pass meta-algorithm
    users_per_round: Optional[int] = None  # PG / NPG / REBEL / PPO: m fresh users per round
    group_size: Optional[int] = None  # PG / NPG / REBEL: G rollouts per user from its own start (one privacy unit)
    max_grad_norm: float = 1.0  # PG / DP-PG: per-user clip norm C
    reward_bound: Optional[float] = None  # rewards clipped to [-reward_bound, reward_bound] (null: the env's declared
    # range, dppo/envs/reward_ranges.py; a private run on an env declaring none is refused, a non-private one clips nothing)
    resume: Optional[str] = None  # a run directory to continue
    episodes: Optional[int] = None  # tabular / GFA learners: total episodes (users; null: the learner's default)
    batch_size: Optional[int] = None  # GFA: episodes per policy update (null: the paper's rule)
    eval_episodes: int = 20  # held-out public evaluation episodes (final_return, eval/return)
    eval_every: Union[int, str, None] = "auto"  # eval/return every this many rounds and at the end; auto: about 10
    # evaluations per run (every max(1, R // 10) of its R rounds); null: at the end only
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint_every: int = 10  # rounds between checkpoints (and one at the end)
    progress: bool = True  # the progress bar
    device: str = "cpu"  # cpu | cuda | auto (policies that support it, e.g. policy=lm)
    threads: Union[int, str] = "auto"  # torch's CPU threads while training: auto = one for a small policy, torch's
    # default for a large one (an LM), OMP_NUM_THREADS if set (dppo/training/threads.py); or an int


def eps_tag(eps) -> str:
    """Folder tag of a run's privacy level: ``eps5.0``, or ``nonprivate`` when eps is null (``hydra.sweep.subdir``)."""
    if eps is None or str(eps).lower() in ("none", "null"):
        return "nonprivate"
    return f"eps{eps}"


def register_schema() -> None:
    """Register the schema as ``base_config`` so ``conf/config.yaml`` is typed and closed."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_config", node=TrainConfig)
    if not OmegaConf.has_resolver("dppo_eps_tag"):
        OmegaConf.register_new_resolver("dppo_eps_tag", eps_tag)


GROUPS = ("algo", "env", "policy", "oracle", "logger", "callbacks", "experiment")


def normalize_override(arg: str) -> str:
    """A ``key=value`` override as Hydra must read it when the group yamls hold only what differs from their
    defaults: a value (``algo.lr=0.1``, ``rounds=5``, ``+rounds_=3``) becomes ``++key=value`` (set or add), so
    a key the yaml does not list reaches the config like one it does; the schema and the learner then refuse an
    unknown key by name (``validate``). Group choices (``algo=dp_pg``, ``+experiment=...``), deletions
    (``~key``), package overrides (``@``) and ``hydra.*`` keys are left as they are."""
    if "=" not in arg or arg.startswith(("~", "-")):
        return arg
    key, value = arg.split("=", 1)
    bare = key.lstrip("+")
    if not bare or "@" in bare or "/" in bare or bare in GROUPS or bare.split(".")[0] == "hydra":
        return arg
    return f"++{bare}={value}"


def compose(overrides: list[str] | None = None, *, hydra: bool = False):
    """The packaged config with overrides, composed once by Hydra's compose API (``hydra=True``: with Hydra's
    own section, for ``compose_run``), every key checked (``check_keys``)."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hcompose(config_name="config", overrides=[normalize_override(o) for o in overrides or []],
                       return_hydra_config=hydra)
    check_keys(cfg)
    resolve_run_shape(cfg)
    return cfg


RUN_SHAPE = ("rounds", "users_per_round", "group_size")


def run_shape_defaults(cfg) -> dict:
    """The run shape of the learner ``algo._target_`` names (its ``default_run_shape``; a learner that declares
    none, or a target that does not import, gets the base ``Learner``'s)."""
    from dppo.algos.base import Learner

    cls = learner_target(cfg)
    return dict((cls or Learner).default_run_shape)


def learner_target(cfg):
    """The ``Learner`` subclass ``algo._target_`` names, or None where it names none that imports (the build refuses
    it then, in one line: ``dppo.build.run.learner_class``); what a learner declares is read from it."""
    from dppo.algos.base import Learner

    try:
        cls = get_object(str(OmegaConf.select(cfg, "algo._target_", default=None)))
    except Exception:  # noqa: BLE001 - an unknown target is reported by validate / the build
        return None
    return cls if isinstance(cls, type) and issubclass(cls, Learner) else None


def resolve_run_shape(cfg):
    """Fill each run-shape key left null (``rounds``, ``users_per_round``, ``group_size``) with the learner's
    default, in place: the composed config then says what the run runs with (``.hydra/config.yaml``, the
    fingerprint, the hyper-parameters). A key the user set is kept."""
    missing = [k for k in RUN_SHAPE if k in cfg and cfg[k] is None]
    if missing:
        shape = run_shape_defaults(cfg)
        for k in missing:
            cfg[k] = shape[k]
    return cfg


def compose_run(overrides: list[str]):
    """A command-line run's config and run directory from one composition: ``hydra.run.dir`` resolved as
    Hydra's run resolves it (``HydraConfig`` set, so ``${hydra:runtime.choices.algo}`` and ``${now:...}`` work),
    then Hydra's section removed, as Hydra hands a task its config."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    cfg = compose(overrides, hydra=True)
    HydraConfig.instance().set_config(cfg)
    run_dir = os.path.abspath(str(cfg.hydra.run.dir))  # as Hydra's runtime.output_dir
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, run_dir


def _type_name(tp) -> str:
    """``Optional[int]`` -> ``an int (or null)``: how a schema field's type reads in an error."""
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args else tp
    name = {int: "an int", float: "a number", bool: "true or false", str: "a string"}.get(base, getattr(base, "__name__", str(base)))
    return f"{name} (or null)" if optional else name


def schema_type(path: str):
    """The type of the schema field at a dotted path (``privacy.max_epsilon`` -> Optional[float]), or None."""
    node, tp = TrainConfig, None
    for part in path.split("."):
        if not dataclasses.is_dataclass(node):
            return None
        tp = typing.get_type_hints(node).get(part)
        if tp is None:
            return None
        node = tp
    return tp


def schema_optional(path: str) -> bool:
    return type(None) in typing.get_args(schema_type(path))


def hydra_message(err: BaseException) -> str:
    """The one line a Hydra/OmegaConf composition failure is reported as: a wrong type names the key and the
    expected type; otherwise its text, without OmegaConf's location dump."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ValidationError

    e = err
    while e is not None:
        if isinstance(e, ValidationError) and getattr(e, "full_key", None):
            tp = schema_type(str(e.full_key))
            if tp is not None:
                return f"{e.full_key} must be {_type_name(tp)}, got {getattr(e, 'value', None)!r}"
        if isinstance(e, MissingConfigException) and "/" in str(getattr(e, "missing_cfg_file", None) or ""):
            return unknown_option(*str(e.missing_cfg_file).rsplit("/", 1), e.options)
        e = e.__cause__ or e.__context__
    text = " ".join(str(err).split())
    for marker in ("full_key:", "object_type=", "Config search path:"):
        text = text.split(marker)[0].strip()
    return f"bad config: {text}" if text else f"bad config ({type(err).__name__})"


def check_keys(cfg, node=None, schema=TrainConfig, prefix: str = "") -> None:
    """Refuse a key the schema does not know (``unknown_key=``, ``+unknown_key=`` and nested ones alike):
    the top-level keys and the ``privacy``, ``logger`` and ``eval`` groups are closed; the ``algo``, ``env``,
    ``policy`` and ``callbacks`` groups are checked against what they build (``dppo.build``)."""
    node = cfg if node is None else node
    hints = typing.get_type_hints(schema)
    names = {f.name for f in dataclasses.fields(schema)}
    for key in list(node.keys()):
        if not prefix and key == "hydra":
            continue
        if key not in names:
            close = did_you_mean(f"{prefix}{key}", cfg)
            if prefix:
                raise ConfigError(f"unknown key '{prefix}{key}'{hint_line(close)}: not a key of {prefix[:-1]}; "
                                  f"valid: {sorted(names)}")
            if not close:
                groups = ", ".join(g for g in known_keys(cfg) if g)
                raise ConfigError(f"unknown key '{key}': not a top-level key nor a key of {groups}; "
                                  f"top-level keys: {sorted(names)}")
            where = ""
            if "." in close[0]:   # a group's key: show it with its prefix and the value given
                value = node[key]
                shown = value if isinstance(value, (int, float, str, bool)) or value is None else "..."
                where = f"; a group's key takes the group's prefix: {close[0]}={shown}"
            raise ConfigError(f"unknown key '{key}'{hint_line(close)}: not a top-level key{where}")
        sub = hints.get(key)
        if dataclasses.is_dataclass(sub) and node[key] is not None:
            check_keys(cfg, node[key], sub, f"{prefix}{key}.")


# What each group's object takes (the build checks keys with these; did-you-mean ranks them)
INJECTABLE = ("policy", "space", "env", "privacy", "sampler", "logger", "init_critic", "seed", "rounds", "users_per_round",
              "episodes", "batch_size", "max_grad_norm", "reward_bound", "group_size", "eps", "delta", "oracle")
POLICY_KEYS = ("init_from", "init_users_offset", "init_provenance", "init_data_disjoint", "freeze")  # policy.* keys the builder reads itself (with SPACE_KEYS)
SPACE_KEYS = ("subspace", "dim")  # policy.* keys of the parameter space (dppo.policies.spaces.make_space)


def accepted_keys(target) -> set | None:
    """The keyword arguments ``target`` (an env, policy or oracle class or function, dppo's or a user's) accepts,
    following ``**kwargs`` into the base classes' ``__init__``; None when it accepts anything. Its signature is its
    declaration: these targets share no base class to declare keys on (a learner declares its own:
    ``Learner.hyperparameters``)."""
    accepted, classes = set(), [target]
    if inspect.isclass(target):
        classes = [c for c in target.__mro__ if "__init__" in vars(c) and c is not object]
    for c in classes:
        params = inspect.signature(c.__init__ if inspect.isclass(c) else c).parameters
        accepted |= {n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - {"self"}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return accepted
        if not inspect.isclass(c):
            return None
    return None


def group_keys(cfg, group: str) -> set:
    """The keys the ``group`` (algo, env, policy, oracle) of the composed ``cfg`` takes, as the build checks them:
    the learner's declared ``algo.*`` keys (``Learner.hyperparameters``: its constructor's less what the builder
    passes it); what the env, policy (with ``POLICY_KEYS`` and ``SPACE_KEYS``) or oracle takes (``accepted_keys``).
    Empty when the group has no target that imports."""
    node = cfg.get(group) if cfg is not None else None
    if node is None or "_target_" not in node:
        return set()
    if group == "algo":   # a learner declares its keys (Learner.hyperparameters); any other target: none to read
        cls = learner_target(cfg)
        return set(cls.hyperparameters()) if cls is not None else set()
    try:
        target = get_object(str(node["_target_"]))
    except Exception:  # noqa: BLE001 - reported when the object is built
        return set()
    keys = accepted_keys(target)
    if keys is None:   # takes **kwargs: its named parameters
        fn = target.__init__ if inspect.isclass(target) else target
        keys = {n for n, p in inspect.signature(fn).parameters.items()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    keys -= {"self", "observation_space", "action_space"}
    if group == "policy":
        keys |= set(POLICY_KEYS + SPACE_KEYS)
    return keys


SUGGESTION_GROUPS = ("algo", "env", "policy", "oracle", "privacy", "logger", "eval")  # did-you-mean order


def known_keys(cfg=None) -> dict[str, set]:
    """Every key the composed config ``cfg`` takes, by group ('' for the top level): the schema's top-level keys
    and its privacy, logger and eval groups; for algo, env, policy and oracle, what the object their _target_
    names takes (``group_keys``; none for a group the config does not have)."""
    hints = typing.get_type_hints(TrainConfig)
    out = {"": {f.name for f in dataclasses.fields(TrainConfig)}}
    for group in SUGGESTION_GROUPS:
        if dataclasses.is_dataclass(hints.get(group)):
            out[group] = {f.name for f in dataclasses.fields(hints[group])}
        elif cfg is not None:
            keys = group_keys(cfg, group)
            if keys:
                out[group] = keys
    return out


def did_you_mean(key: str, cfg=None, known: dict | None = None, n: int = 3) -> list[str]:
    """The keys (dotted) a mistyped or misplaced ``key`` may have meant, best first, among the top-level keys and
    every group's keys (``known_keys``): the bare name's exact match in another group (``epochs`` ->
    ``algo.epochs``, ``algo.rounds`` -> ``rounds``), then close matches in the key's own group, then elsewhere."""
    known = known_keys(cfg) if known is None else known
    group, _, bare = key.rpartition(".")
    order = {g: i for i, g in enumerate(known)}
    scored = []
    for g, keys in known.items():
        for k in keys:
            full = f"{g}.{k}" if g else k
            ratio = difflib.SequenceMatcher(None, bare, k).ratio()
            if full != key and (k == bare or ratio >= 0.7):
                scored.append((k != bare, g != group, -round(ratio, 2), order[g], full))
    scored.sort()
    # the best, its ties, then the clearly close of its kind (exact elsewhere / same group / other group)
    kind = scored[0][:2] if scored else None
    return [s[-1] for s in scored if s[:2] == kind and (s[2] == scored[0][2] or -s[2] >= 0.75)][:n]


def hint_line(close: list[str]) -> str:
    """`` (did you mean 'a'?)``, `` (did you mean 'a', 'b' or 'c'?)``, or '' for no suggestion."""
    if not close:
        return ""
    quoted = [f"'{c}'" for c in close]
    return f" (did you mean {quoted[0] if len(quoted) == 1 else ', '.join(quoted[:-1]) + ' or ' + quoted[-1]}?)"


def group_options(group: str) -> list[str]:
    """The options of a config group: the names of ``conf/<group>/*.yaml``."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def unknown_option(group: str, name: str, options=()) -> str:
    """The line for a group choice with no file (``algo=dp_pgg``): the group's options and a close one; for
    ``env=<a gymnasium id>`` (``env=CartPole-v1``), the ``env.id=`` override that runs it."""
    if group == "env":
        from dppo.envs.gym_env import env_option_hint

        hint = env_option_hint(name)
        if hint:
            return hint
    options = group_options(group) or sorted(options or ())
    close = difflib.get_close_matches(name, options, n=1) or [o for o in options if name and o.startswith(name)][:1]
    return f"unknown {group} '{name}'{hint_line(close)}: choose one of {', '.join(options)}"


def schema_floats(schema=TrainConfig, prefix: str = "") -> list[str]:
    """Every float field of the schema (``Optional[float]`` too), as dotted keys."""
    out = []
    for name, tp in typing.get_type_hints(schema).items():
        if dataclasses.is_dataclass(tp):
            out += schema_floats(tp, f"{prefix}{name}.")
        elif tp is float or set(typing.get_args(tp)) == {float, type(None)}:
            out.append(f"{prefix}{name}")
    return out


def check_device(device: str) -> None:
    """``device=cuda`` (or ``cuda:N``) needs a CUDA device on this machine."""
    if str(device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device={device} but this machine has no CUDA device (torch.cuda.is_available() is "
                              f"False); use device=cpu, or device=auto to take a GPU where there is one")


def validate(cfg) -> None:
    """Value checks the schema's types cannot express; raise ConfigError with a one-line fix. A run shape left
    null (a config Hydra composed itself, a DictConfig) is filled in first (``resolve_run_shape``)."""
    check_keys(cfg)
    resolve_run_shape(cfg)
    for key in schema_floats():   # NaN or inf passes the schema's float type and every comparison below
        value = OmegaConf.select(cfg, key)
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number{' (or null)' if schema_optional(key) else ''}, "
                              f"got {value}")
    if cfg.eps is not None and not (cfg.eps > 0 and math.isfinite(cfg.eps)):
        raise ConfigError(f"eps must be > 0 (or null for a non-private run), got {cfg.eps}")
    if not (0 < cfg.delta < 1):
        raise ConfigError(f"delta must lie strictly between 0 and 1, got {cfg.delta}")
    if cfg.delta < MIN_DELTA:
        raise ConfigError(f"delta={cfg.delta:g} is below {MIN_DELTA:g}: no guarantee needs it (delta is usually "
                          f"well below 1/users, e.g. 1e-5 to 1e-12), and the noise calibration is exact only above it")
    if cfg.group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {cfg.group_size}")
    if cfg.users_per_round < 1:
        raise ConfigError(f"users_per_round must be >= 1, got {cfg.users_per_round}")
    if not (cfg.max_grad_norm > 0):
        raise ConfigError(f"max_grad_norm must be > 0, got {cfg.max_grad_norm}")
    if cfg.reward_bound is not None and not (cfg.reward_bound > 0):
        raise ConfigError(f"reward_bound must be > 0, got {cfg.reward_bound}")
    if cfg.rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {cfg.rounds}")
    if cfg.episodes is not None and cfg.episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {cfg.episodes}")
    if cfg.batch_size is not None and cfg.batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {cfg.batch_size}")
    if cfg.eval_episodes < 0 or cfg.checkpoint_every < 1:
        raise ConfigError("eval_episodes must be >= 0 and checkpoint_every >= 1")
    every = cfg.eval_every
    if every is not None and (every != "auto" if isinstance(every, str) else every < 1):
        raise ConfigError(f"eval_every must be an int >= 1, auto (about 10 evaluations per run) or null (at the end "
                          f"only), got {every}")
    if cfg.eval.select not in ("last", "best"):
        raise ConfigError(f"eval.select must be last (the final release) or best (the best release on held-out "
                          f"public episodes), got {cfg.eval.select}")
    p = cfg.privacy
    check_threads(cfg.threads)
    if cfg.device not in ("cpu", "cuda", "auto") and not str(cfg.device).startswith("cuda:"):
        raise ConfigError(f"device must be cpu, cuda or auto, got '{cfg.device}'")
    if p.max_epsilon is not None and not p.max_epsilon > 0:
        raise ConfigError(f"privacy.max_epsilon must be > 0, got {p.max_epsilon}")
    if p.multi_pass and not (p.population_size and p.population_size >= cfg.users_per_round):
        raise ConfigError("privacy.multi_pass=true needs privacy.population_size >= users_per_round")
    if p.population_size is not None and p.population_size < 1:
        raise ConfigError(f"privacy.population_size must be >= 1, got {p.population_size}")
    if p.bands < 1:   # invalid whatever the run (a non-private run, or privacy.noise_correlation=none, too)
        raise ConfigError(f"privacy.bands must be >= 1, got {p.bands}")
    if p.composition not in (None, "advanced", "zcdp"):
        raise ConfigError(f"privacy.composition (deprecated: privacy.accountant) must be 'advanced' or 'zcdp', got "
                          f"'{p.composition}'")
    for group in ("algo", "env"):
        node = cfg[group]
        if node is None or "_target_" not in node:
            raise ConfigError(f"the '{group}' group has no _target_; pick one with {group}=<name>")
    if cfg.oracle is not None and "_target_" not in cfg.oracle:
        raise ConfigError("oracle.* keys need an oracle: pick one with oracle=ssp|dp_gd|exp_mech|exact")


def to_container(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


_PLAIN = re.compile(r"[A-Za-z_/][\w\-./:]*")  # a string Hydra reads as the same string when unquoted
_KEYWORDS = ("true", "false", "null", "none", "inf", "nan", "yes", "no", "on", "off")


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
