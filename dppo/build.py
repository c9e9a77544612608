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
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant
from dppo.training.logger import make_logger
from dppo.training.trainer import Trainer

INJECTABLE = ("policy", "env", "privacy", "sampler", "logger", "seed", "rounds", "users_per_round", "episodes",
              "batch_size", "max_grad_norm", "reward_bound", "eps", "delta", "oracle", "group_size")
FINGERPRINT_KEYS = ("algo", "env", "policy", "eps", "delta", "seed", "users_per_round", "max_grad_norm",
                    "reward_bound", "episodes", "batch_size", "oracle", "group_size")


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


def build_env(cfg):
    try:
        return instantiate(cfg.env, _convert_="all")
    except Exception as err:  # noqa: BLE001 - hydra wraps the real error
        raise _unwrap(err, "env") from None


def build_policy(cfg, env):
    """Instantiate cfg.policy for the env's spaces; ``init_from`` loads pretrained weights (fine-tuning)."""
    spec = dict(to_container(cfg.policy) or {})
    if "_target_" not in spec:
        return None
    init_from = spec.pop("init_from", None)
    try:
        policy = instantiate(spec, observation_space=env.observation_space, action_space=env.action_space,
                             _convert_="all")
    except Exception as err:  # noqa: BLE001
        raise _unwrap(err, "policy") from None
    if init_from:
        if not os.path.isfile(init_from):
            raise ConfigError(f"policy.init_from={init_from} is not a file")
        state = torch.load(init_from, map_location="cpu", weights_only=True)
        policy.load_state_dict(state.get("policy", state) if isinstance(state, dict) else state)
    return policy


def build_privacy(cfg, cls) -> PrivacyContext:
    p = cfg.privacy
    name = p.accountant
    if name is None:
        name = cls.accountant_name(p) if hasattr(cls, "accountant_name") else ("rdp" if p.multi_pass else "parallel")
    if p.multi_pass and name not in ("rdp", "prv"):
        raise ConfigError("privacy.multi_pass=true needs privacy.accountant=rdp or prv (users are reused)")
    return PrivacyContext(cfg.eps, cfg.delta, accountant=make_accountant(name),
                          noise=NoiseSource(cfg.seed, secure=p.secure_rng), max_epsilon=p.max_epsilon,
                          multi_pass=p.multi_pass, population_size=p.population_size)


def build_sampler(cfg):
    p = cfg.privacy
    if p.multi_pass:
        return PoissonUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed)
    sampler = OnePassUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed)
    return sampler


def build_learner(cfg, cls, objects: dict):
    """Call the learner with its own algo keys plus the injectable objects its signature names."""
    params = dict(to_container(cfg.algo))
    params.pop("_target_")
    params.pop("name", None)
    private = params.pop("private", True)
    oracle_name = params.pop("oracle", None)
    oracle_kwargs = params.pop("oracle_kwargs", None) or {}
    sig = inspect.signature(cls.__init__).parameters
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in sig.values())
    unknown = [k for k in params if k not in sig and not accepts_any]
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} for algo {cls.__name__}; valid: "
                          f"{sorted(k for k in sig if k not in INJECTABLE and k != 'self')}")
    if not private:
        objects["privacy"].eps = None
    available = {"seed": cfg.seed, "rounds": cfg.rounds, "users_per_round": cfg.users_per_round,
                 "episodes": cfg.episodes, "batch_size": cfg.batch_size, "max_grad_norm": cfg.max_grad_norm,
                 "reward_bound": cfg.reward_bound, "eps": objects["privacy"].eps, "delta": cfg.delta,
                 "group_size": cfg.group_size, **objects}
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


def fingerprint(cfg) -> str:
    """Hash of everything a resumed run must share with the original (rounds and logging may change)."""
    c = to_container(cfg)
    keep = {k: c.get(k) for k in FINGERPRINT_KEYS}
    keep["privacy"] = {k: v for k, v in (c.get("privacy") or {}).items() if k != "max_epsilon"}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build(cfg, run_dir: str | None = None, *, callbacks=(), policy=None, env=None, privacy=None, logger=None,
          sampler=None, learner=None) -> Trainer:
    """Build every object of a run from ``cfg``; any object passed in is used instead of being built."""
    validate(cfg)
    if run_dir is not None:
        check_writable(run_dir)
    seed_everything(cfg.seed)
    cls = learner_class(cfg)
    env = env if env is not None else build_env(cfg)
    if getattr(env, "kind", None) == "prompts":  # language-model prompts: the algorithm family's LM learner
        from dppo.algos.prompt_po import prompt_twin

        cls = prompt_twin(cls)
    privacy = privacy if privacy is not None else build_privacy(cfg, cls)
    sampler = sampler if sampler is not None else build_sampler(cfg)
    if not getattr(sampler, "multi_pass", False):
        n_rounds = cfg.rounds if cfg.episodes is None else 1
        sampler.check_capacity(n_rounds)
    if logger is None:
        logger = make_logger(run_dir, **to_container(cfg.logger))
    if learner is None:
        sig = inspect.signature(cls.__init__).parameters
        objects = {"env": env, "privacy": privacy, "sampler": sampler, "logger": logger}
        if "policy" in sig:
            objects["policy"] = policy if policy is not None else build_policy(cfg, env)
        learner = build_learner(cfg, cls, objects)
    cb = [instantiate(spec) for spec in (to_container(cfg.callbacks) or {}).values()] + list(callbacks)
    meta = {"algo": _algo_name(cfg), "env_id": getattr(env, "id", type(env).__name__), "seed": cfg.seed}
    trainer = Trainer(learner, privacy, logger, sampler=sampler, callbacks=cb, run_dir=run_dir,
                      checkpoint_every=cfg.checkpoint_every, eval_episodes=cfg.eval_episodes,
                      eval_greedy=cfg.eval.greedy, progress=cfg.progress, meta=meta, fingerprint=fingerprint(cfg))
    logger.log_hparams(_flat(to_container(cfg)))
    return trainer


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
    """Hydra wraps constructor errors; surface our own ConfigError, or say which group failed."""
    e = err
    while e is not None:
        if isinstance(e, ConfigError):
            return e
        e = e.__cause__ or e.__context__
    return ConfigError(f"cannot build the '{group}' group: {str(err).splitlines()[0]}")
