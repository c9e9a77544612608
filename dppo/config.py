"""Structured config schema (validated by Hydra/OmegaConf before any work starts) and value checks."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from dppo.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
# below ~1e-300 the analytic Gaussian's delta(sigma) underflows and its solver pins sigma at its upper limit
MIN_DELTA = 1e-100


@dataclass
class PrivacyConfig:
    """privacy group: how releases are accounted and how noise is drawn."""

    accountant: Optional[str] = None  # null = the learner's default (parallel one-pass; rdp if multi_pass)
    multi_pass: bool = False  # users resampled (Poisson) across rounds; needs population_size
    population_size: Optional[int] = None  # finite user population for multi-pass
    secure_rng: bool = True  # noise from the OS CSPRNG; false = seeded, reproducible, not private against the seed
    max_epsilon: Optional[float] = None  # stop cleanly before a release would exceed this total
    composition: str = "advanced"  # GFA only: advanced | zcdp
    allow_over_target: bool = False  # resume even if a crashed attempt's charged releases end the run above eps


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


@dataclass
class TrainConfig:
    """Top-level schema: groups + shortcuts (names fixed; later learners rely on them)."""

    algo: Any = None
    env: Any = None
    policy: Any = None
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    callbacks: Any = field(default_factory=dict)
    eps: Optional[float] = 5.0  # null = non-private
    delta: float = 1e-5
    seed: int = 0
    rounds: int = 100
    users_per_round: int = 10
    group_size: Optional[int] = None  # rollouts per user (one privacy unit); null = the algorithm's default
    max_grad_norm: float = 1.0
    reward_bound: Optional[float] = 1.0
    resume: Optional[str] = None
    episodes: Optional[int] = None  # tabular / GFA learners: total episodes (users)
    batch_size: Optional[int] = None  # GFA: episodes per policy update (null = paper's rule)
    oracle: Optional[str] = None  # NPG/REBEL: private least-squares oracle (null = the algo's default)
    eval_episodes: int = 20
    eval_every: Optional[int] = None  # also log eval/return every this many rounds (null: at the end only)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint_every: int = 10
    progress: bool = True
    device: str = "cpu"  # cpu | cuda | auto (policies that support it, e.g. policy=lm)


def eps_tag(eps, private=True) -> str:
    """Folder tag of a run's privacy level: ``eps5.0``, or ``nonprivate`` when eps is null or the algorithm
    is a non-private twin (``algo=pg`` ignores the top-level eps). Used by ``hydra.sweep.subdir``."""
    if eps is None or str(eps).lower() in ("none", "null") or str(private).lower() in ("false", "0"):
        return "nonprivate"
    return f"eps{eps}"


def register_schema() -> None:
    """Register the schema as ``base_config`` so ``conf/config.yaml`` is typed and closed."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_config", node=TrainConfig)
    if not OmegaConf.has_resolver("dppo_eps_tag"):
        OmegaConf.register_new_resolver("dppo_eps_tag", eps_tag)


def compose(overrides: list[str] | None = None):
    """The packaged config with overrides, without Hydra's run-dir machinery (Python API and tests)."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hcompose(config_name="config", overrides=list(overrides or []))


def validate(cfg) -> None:
    """Value checks the schema's types cannot express; raise ConfigError with a one-line fix."""
    if cfg.eps is not None and not (cfg.eps > 0 and math.isfinite(cfg.eps)):
        raise ConfigError(f"eps must be > 0 (or null for a non-private run), got {cfg.eps}")
    if not (0 < cfg.delta < 1):
        raise ConfigError(f"delta must lie strictly between 0 and 1, got {cfg.delta}")
    if cfg.delta < MIN_DELTA:
        raise ConfigError(f"delta={cfg.delta:g} is below {MIN_DELTA:g}: no guarantee needs it (delta is usually "
                          f"well below 1/users, e.g. 1e-5 to 1e-12), and the noise calibration is exact only above it")
    if cfg.group_size is not None and cfg.group_size < 1:
        raise ConfigError(f"group_size must be >= 1 (or null for the algorithm's default), got {cfg.group_size}")
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
    if cfg.eval_every is not None and cfg.eval_every < 1:
        raise ConfigError(f"eval_every must be >= 1 (or null: evaluate at the end only), got {cfg.eval_every}")
    p = cfg.privacy
    if cfg.device not in ("cpu", "cuda", "auto") and not str(cfg.device).startswith("cuda:"):
        raise ConfigError(f"device must be cpu, cuda or auto, got '{cfg.device}'")
    if p.max_epsilon is not None and not p.max_epsilon > 0:
        raise ConfigError(f"privacy.max_epsilon must be > 0, got {p.max_epsilon}")
    if p.multi_pass and not (p.population_size and p.population_size >= cfg.users_per_round):
        raise ConfigError("privacy.multi_pass=true needs privacy.population_size >= users_per_round")
    if p.population_size is not None and p.population_size < 1:
        raise ConfigError(f"privacy.population_size must be >= 1, got {p.population_size}")
    if p.composition not in ("advanced", "zcdp"):
        raise ConfigError(f"privacy.composition must be 'advanced' or 'zcdp', got '{p.composition}'")
    for group in ("algo", "env"):
        node = cfg[group]
        if node is None or "_target_" not in node:
            raise ConfigError(f"the '{group}' group has no _target_; pick one with {group}=<name>")


def to_container(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
