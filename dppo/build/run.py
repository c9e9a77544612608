"""The run's objects from its config, in one place and in order: env -> privacy -> sampler -> logger -> policy ->
space -> oracle -> learner -> trainer (``build``); each job's rules live in its own module of this package."""
from __future__ import annotations

import os

import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from dppo.algos.base import Learner
from dppo.build.checks import algo_name, check_config_values, check_shortcuts, warn_renamed_keys
from dppo.build.env import build_env
from dppo.build.extension import extension_rules
from dppo.build.learner import build_learner
from dppo.build.memory import check_memory
from dppo.build.policy import build_policy, build_space, check_policy_fits_env, read_init_source
from dppo.policies.masked import wrap_for_env
from dppo.build.pretraining import exclude_pretraining_users, inherited_provenance
from dppo.build.privacy import build_privacy, build_sampler, check_passed_privacy, check_passed_sampler
from dppo.build.record import fingerprint, public_config, resolved_hparams
from dppo.config import to_container, validate
from dppo.data import UserSampler
from dppo.errors import ConfigError
from dppo.policies.check import check_env, check_policy
from dppo.privacy.users import GatedSampler
from dppo.training import distributed, secret
from dppo.training.logger import Logger, make_logger
from dppo.training.provenance import Population
from dppo.training.threads import choose_threads
from dppo.training.trainer import Trainer


def check_passed_objects(sampler, logger) -> None:
    """A sampler or a logger passed in (``dppo.train(sampler=..., logger=...)``) is one of the declared interfaces
    the trainer and the learners read directly: a ``dppo.data.UserSampler``, a ``dppo.training.logger.Logger``."""
    for name, obj, base, hint in (("sampler", sampler, UserSampler, "dppo.data.UserSampler: subclass it"),
                                  ("logger", logger, Logger, "dppo.training.logger.Logger: give it your outputs")):
        if obj is not None and not isinstance(obj, base):
            raise ConfigError(f"{name}= takes a {hint}, or leave {name}= out for the config's; got a "
                              f"{type(obj).__name__}")


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def learner_class(cfg):
    """The class ``algo._target_`` names: a ``Learner``, which declares what the builder and the trainer need."""
    try:
        cls = get_class(cfg.algo._target_)
    except Exception:  # noqa: BLE001
        raise ConfigError(f"algo target '{cfg.algo._target_}' cannot be imported; check conf/algo/") from None
    if not (isinstance(cls, type) and issubclass(cls, Learner)):
        raise ConfigError(f"algo target '{cfg.algo._target_}' is not a dppo.algos.base.Learner: subclass it and "
                          f"declare what it needs (Learner.needs)")
    return cls


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


def build(cfg, run_dir: str | None = None, *, callbacks=(), policy=None, env=None, privacy=None, logger=None,
          sampler=None, learner=None, env_inputs: dict | None = None) -> Trainer:
    """Build every object of a run from ``cfg``, once and in order (env -> privacy -> sampler -> logger ->
    policy -> space -> oracle -> learner -> trainer); any object passed in is used instead of being built.
    Nothing is written before every object is built and checked: the run directory is made last.
    ``env_inputs``: a prompts env's objects from Python (``build_env``; ``cfg.env`` records them)."""
    validate(cfg)
    check_config_values(cfg)
    check_passed_objects(sampler, logger)
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
    if privacy is not None:
        check_passed_privacy(cfg, cls, privacy)
    privacy = privacy if privacy is not None else build_privacy(cfg, cls)
    init_state, init_record, init_critic = read_init_source(OmegaConf.select(cfg, "policy.init_from", default=None))
    if sampler is None:
        sampler = build_sampler(cfg, privacy.noise)
    else:
        check_passed_sampler(cfg, sampler, privacy)
    held = None if learner is None else learner.sampler
    if isinstance(sampler, GatedSampler):            # a run's own sampler handed back: gate its inner sampler anew
        sampler = sampler.inner
    if learner is not None and (learner.privacy is not privacy or
                                (held is not sampler and not (isinstance(held, GatedSampler) and held.inner is sampler))):
        raise ConfigError("learner= releases through its own privacy context and sampler: pass those two as privacy= "
                          "and sampler= too, so they are checked against the config")
    sampler = GatedSampler(sampler, privacy.users)   # every take checked (one-pass) and journalled here
    if learner is not None:
        learner.sampler = sampler
    key = secret.new_key()   # the run's secret (dppo/training/secret.py): a resume adopts the stored one
    population = Population(env, sampler, key)
    inherited = inherited_provenance(cfg, init_record, population, init_state)
    exclude_pretraining_users(sampler, population, inherited)
    if logger is None:
        logger = make_logger(run_dir, **{**to_container(cfg.logger), **({} if dist.is_main else {"console": False})})
    if learner is None:
        objects = {"env": env, "privacy": privacy, "sampler": sampler, "logger": logger}
        if init_critic is not None and "init_critic" in cls.needs:   # an actor-critic source: its critic too
            objects["init_critic"] = init_critic
        if "policy" in cls.needs:
            if env_given:
                check_env(env)
            cls.check_env(env)
            if policy is None:
                check_policy_fits_env(cfg, env)
            objects["policy"] = policy if policy is not None else build_policy(cfg, env, init_state)
            if objects["policy"] is not None:
                check_policy(objects["policy"], env)  # before any user is drawn
                objects["policy"] = wrap_for_env(objects["policy"], env)   # the env's action masks, if it has any
                if "space" in cls.needs:
                    objects["space"] = build_space(cfg, objects["policy"], cls.space_defaults)
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
    if cfg.eval.select == "best":
        check_selection(cfg, env, learner)
    trainer = Trainer(learner, privacy, logger, sampler=sampler, callbacks=cb, run_dir=run_dir,
                      checkpoint_every=cfg.checkpoint_every, eval_episodes=cfg.eval_episodes if evaluates else 0,
                      eval_greedy=cfg.eval.greedy, eval_select=cfg.eval.select, progress=cfg.progress and dist.is_main, meta=meta,
                      fingerprint=fingerprint(cfg), eval_every=cfg.eval_every if dist.is_main else None,
                      hparams=hparams, population=population, inherited=inherited, config=public_config(cfg),
                      extend_refusal=extension_rules(cfg, type(learner), privacy),
                      allow_over_target=bool(OmegaConf.select(cfg, "privacy.allow_over_target", default=False)),
                      capacity_limit=env_population if isinstance(env_population, int) else None,
                      key=key, data_parts=getattr(env, "data_parts", None))
    trainer.dist = dist
    trainer.threads = choose_threads(cfg.threads, *learner.released_modules().values())   # the networks size the work
    if dist.is_main:
        trainer.check_capacity()   # the population covers the run, before any user is drawn
    if run_dir is not None:
        check_writable(run_dir)    # the first thing written: after every object is built and checked
    warn_renamed_keys(cfg)     # after every check: a refused config is its one error line
    logger.log_hparams(hparams)  # remembered only; written with the final metrics at the end of the session
    return trainer


def check_selection(cfg, env, learner) -> None:
    """``eval.select=best`` needs a learner that can score and put back its released network, and public episodes to
    score on beside the reported ones; one line otherwise, before any user is drawn."""
    if not learner.selects_final:
        learner.evaluate_candidate(0)   # its one line
    if cfg.eval_episodes < 1 or not getattr(env, "evaluates", True):
        raise ConfigError("eval.select=best chooses among the run's releases on held-out public episodes: it needs "
                          "eval_episodes >= 1 and an env with public episodes (a simulator, or public prompts)")
    public = getattr(env, "public", None)
    if isinstance(public, list) and len(public) < 2 * cfg.eval_episodes:
        raise ConfigError(f"eval.select=best scores the releases on held-out public prompts other than the "
                          f"{cfg.eval_episodes} it reports on: give at least {2 * cfg.eval_episodes} public prompts "
                          f"(or lower eval_episodes), or eval.select=last")
