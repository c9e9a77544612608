"""Config -> objects, in one place and in order: env -> policy -> privacy -> sampler -> learner -> trainer."""
from __future__ import annotations

import hashlib
import inspect
import json
import os

import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from dppo.config import to_container, validate
from dppo.data import OnePassUserSampler, PoissonUserSampler
from dppo.errors import ConfigError
from dppo.policies.check import check_env, check_policy
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant
from dppo.training import distributed
from dppo.training.logger import make_logger
from dppo.training.trainer import Trainer

INJECTABLE = ("policy", "env", "privacy", "sampler", "logger", "seed", "rounds", "users_per_round", "episodes",
              "batch_size", "max_grad_norm", "reward_bound", "eps", "delta", "oracle")
# The only settings a resumed run may change: where and how often it logs, checkpoints, evaluates, stops on
# a public evaluation. Every other key (eps, delta, rounds, users_per_round, group_size, clip norms, the
# algo's and oracle's parameters, accountant, population, secure_rng, max_epsilon, env, policy, seed) can
# change what a release spends or on whom, and a change to it refuses the resume, naming the key.
RESUME_MAY_CHANGE = ("logger", "progress", "checkpoint_every", "eval_episodes", "eval", "resume", "callbacks",
                     "hydra")
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


def build_env(cfg, **python_objects):
    """Instantiate cfg.env; ``python_objects`` (e.g. a prompts env's ``reward_funcs``, ``dataset``: objects
    passed from Python, not config values) are given to the constructor as they are."""
    try:
        if python_objects:  # not through the config (OmegaConf would copy rows and callables into nodes)
            return instantiate(cfg.env, _convert_="all", _partial_=True)(**python_objects)
        return instantiate(cfg.env, _convert_="all")
    except Exception as err:  # noqa: BLE001 - hydra wraps the real error
        raise _unwrap(err, "env") from None


def load_init_source(init_from: str | None) -> tuple[dict | None, list[int] | None]:
    """``policy.init_from``: a run directory (its newest checkpoint), a run's checkpoint file, or a file holding
    a bare ``state_dict`` (or ``{"policy": state_dict}``). Returns (policy state_dict, the user ids the
    pretraining run used, or None when the source does not record them)."""
    if not init_from:
        return None, None
    path = str(init_from)
    if os.path.isdir(path):
        from dppo.training.checkpoint import load_latest_checkpoint

        state, _ = load_latest_checkpoint(os.path.join(path, "checkpoints"))
        if state is None:
            raise ConfigError(f"policy.init_from={path} is a directory without a readable checkpoint")
    elif os.path.isfile(path):
        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        raise ConfigError(f"policy.init_from={path} is neither a run directory nor a file")
    if isinstance(state, dict) and isinstance(state.get("learner"), dict) and "policy" in state["learner"]:
        used = (state.get("sampler") or {}).get("used")
        return state["learner"]["policy"], None if used is None else [int(u) for u in used]
    if isinstance(state, dict) and isinstance(state.get("policy"), dict):
        return state["policy"], None
    return state, None


def build_policy(cfg, env, init_state: dict | None = None):
    """Instantiate cfg.policy for the env's spaces; load ``init_state`` (from ``policy.init_from``: fine-tuning);
    ``policy.freeze`` lists parameter-name prefixes that are not trained (requires_grad=False)."""
    spec = dict(to_container(cfg.policy) or {})
    if "_target_" not in spec:
        return None
    init_from = spec.pop("init_from", None)
    freeze = spec.pop("freeze", None) or []
    try:
        policy = instantiate(spec, observation_space=env.observation_space, action_space=env.action_space,
                             _convert_="all")
    except Exception as err:  # noqa: BLE001
        raise _unwrap(err, "policy") from None
    if init_state is None and init_from:
        init_state, _ = load_init_source(init_from)
    if init_state is not None:
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


def _default_accountant(cls, cfg) -> str:
    """The learner's own accountant choice (``accountant_name(privacy_cfg[, algo_cfg])``), else rdp/parallel."""
    fn = getattr(cls, "accountant_name", None)
    if fn is None:
        return "rdp" if cfg.privacy.multi_pass else "parallel"
    if len(inspect.signature(fn).parameters) >= 2:
        return fn(cfg.privacy, to_container(cfg.algo))
    return fn(cfg.privacy)


def exclude_pretraining_users(sampler, used: list[int] | None) -> None:
    """Private fine-tuning never reuses a user of the pretraining run: its ids are skipped for ever (a
    finite population: burned; a user stream: it starts after the largest one)."""
    if not used:
        return
    if getattr(sampler, "multi_pass", False):
        raise ConfigError("policy.init_from a run with privacy.multi_pass=true: the pretraining run's users "
                          "cannot be excluded from a Poisson-sampled population; fine-tune one-pass")
    if sampler.population_size is None:
        sampler.next_index = max(sampler.next_index, max(used) + 1)
    else:
        sampler.burn(used)


def build_privacy(cfg, cls) -> PrivacyContext:
    p = cfg.privacy
    name = p.accountant
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
    if "oracle" in inspect.signature(cls.__init__).parameters:
        return (cfg.oracle or cfg.algo.get("oracle")) == "exp_mech"
    return False


def build_sampler(cfg, noise=None):
    p = cfg.privacy
    if p.multi_pass:
        return PoissonUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed, noise=noise)
    sampler = OnePassUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed)
    return sampler


def physical_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


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
    """Call the learner with its own algo keys plus the injectable objects its signature names."""
    params = dict(to_container(cfg.algo))
    params.pop("_target_")
    params.pop("name", None)
    on_prompts = params.pop("on_prompts", None) or {}  # the algo's defaults for env=prompts (policy=lm)
    if getattr(cls, "env_kind", None) == "prompts":
        params = {**params, **on_prompts}
    private = params.pop("private", True)
    if not private and cfg.eps is not None:
        raise ConfigError(f"algo={_algo_name(cfg)} has no private mode, but eps={cfg.eps} was given; run it with "
                          f"eps=null, or pick a private algorithm (dp_pg, dp_npg, dp_rebel, pucb)")
    oracle_name = params.pop("oracle", None)
    oracle_kwargs = params.pop("oracle_kwargs", None) or {}
    sig = inspect.signature(cls.__init__).parameters
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in sig.values())
    unknown = [k for k in params if k not in sig and not accepts_any]
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} for algo {cls.__name__}; valid: "
                          f"{sorted(k for k in sig if k not in INJECTABLE and k != 'self')}")
    if cfg.group_size is not None:
        if "group_size" not in sig:
            raise ConfigError(f"group_size applies to the group learners (pg, npg, rebel and their private twins), "
                              f"not to algo={_algo_name(cfg)}")
        params["group_size"] = int(cfg.group_size)
    available = {"seed": cfg.seed, "rounds": cfg.rounds, "users_per_round": cfg.users_per_round,
                 "episodes": cfg.episodes, "batch_size": cfg.batch_size, "max_grad_norm": cfg.max_grad_norm,
                 "reward_bound": cfg.reward_bound, "eps": objects["privacy"].eps, "delta": cfg.delta, **objects}
    if "oracle" in sig and "oracle" not in objects:
        from dppo.oracles import make_oracle

        available["oracle"] = make_oracle(cfg.oracle or oracle_name, **oracle_kwargs)
    for k in INJECTABLE:
        if k in sig and k in available:
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
    """Every setting a resumed run must share with the original, flattened (``algo.oracle_kwargs.x_bound``);
    the checkpoint stores it and resume compares it key by key (``check_fingerprint``)."""
    flat = _flat(to_container(cfg))
    keep = {k: _plain(v) for k, v in flat.items() if k.split(".", 1)[0] not in RESUME_MAY_CHANGE}
    keep["_hash"] = hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return keep


def _plain(v):
    if isinstance(v, (list, tuple)):
        return json.dumps(v, default=str)
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def build(cfg, run_dir: str | None = None, *, callbacks=(), policy=None, env=None, privacy=None, logger=None,
          sampler=None, learner=None) -> Trainer:
    """Build every object of a run from ``cfg``; any object passed in is used instead of being built."""
    validate(cfg)
    dist = distributed.from_env()
    if not dist.is_main:  # torchrun rank > 0: computes its shard of each round, writes nothing
        run_dir = None
    if run_dir is not None:
        check_writable(run_dir)
    seed_everything(cfg.seed)
    cls = learner_class(cfg)
    check_memory(cfg)
    env_given = env is not None
    env = env if env_given else build_env(cfg)
    if getattr(env, "kind", None) == "prompts":  # language-model prompts: the algorithm family's LM learner
        from dppo.algos.prompt_po import prompt_twin

        cls = prompt_twin(cls)
    privacy = privacy if privacy is not None else build_privacy(cfg, cls)
    init_state, pretrain_users = load_init_source(OmegaConf.select(cfg, "policy.init_from"))
    if sampler is None:
        sampler = build_sampler(cfg, privacy.noise)
        exclude_pretraining_users(sampler, pretrain_users)
    if not getattr(sampler, "multi_pass", False):
        n_rounds = cfg.rounds if cfg.episodes is None else 1
        sampler.check_capacity(n_rounds)
    if logger is None:
        logger = make_logger(run_dir, **{**to_container(cfg.logger), **({} if dist.is_main else {"console": False})})
    if learner is None:
        sig = inspect.signature(cls.__init__).parameters
        objects = {"env": env, "privacy": privacy, "sampler": sampler, "logger": logger}
        if "policy" in sig:
            if env_given:
                check_env(env)
            objects["policy"] = policy if policy is not None else build_policy(cfg, env, init_state)
            if objects["policy"] is not None:
                check_policy(objects["policy"], env)  # before any user is drawn
        check_memory(cfg, env, objects.get("policy"))
        learner = build_learner(cfg, cls, objects)
    if dist.enabled:
        distributed.attach(learner, dist)
    cb = [instantiate(spec) for spec in (to_container(cfg.callbacks) or {}).values()] + list(callbacks)
    meta = {"algo": _algo_name(cfg), "env_id": getattr(env, "id", type(env).__name__), "seed": cfg.seed}
    hparams = resolved_hparams(cfg, privacy, learner)
    trainer = Trainer(learner, privacy, logger, sampler=sampler, callbacks=cb, run_dir=run_dir,
                      checkpoint_every=cfg.checkpoint_every, eval_episodes=cfg.eval_episodes if dist.is_main else 0,
                      eval_greedy=cfg.eval.greedy, progress=cfg.progress and dist.is_main, meta=meta,
                      fingerprint=fingerprint(cfg), eval_every=cfg.eval_every if dist.is_main else None,
                      hparams=hparams)
    trainer.dist = dist
    logger.log_hparams(hparams)  # remembered only; written with the final metrics at the end of the session
    return trainer


def resolved_hparams(cfg, privacy, learner) -> dict:
    """The run's hyper-parameters as they were used: the accountant and oracle actually built (not null
    defaults), eps = null for a non-private run, the algorithm's name; flattened ``a.b`` keys."""
    hp = _flat(to_container(cfg))
    hp.pop("resume", None)
    hp["algo"] = _algo_name(cfg)
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
