"""The Python API: everything the CLI does, without Hydra's command line."""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from dppo.build import build
from dppo.config import compose
from dppo.errors import ConfigError
from dppo.training import distributed


def make_config(overrides: list[str] | dict | None = None) -> DictConfig:
    """The packaged default config with overrides (a list of ``key=value`` or a nested dict)."""
    if isinstance(overrides, dict):
        cfg = compose([f"algo={overrides['algo']}"] if isinstance(overrides.get("algo"), str) else [])
        rest = {k: v for k, v in overrides.items() if not (k == "algo" and isinstance(v, str))}
        OmegaConf.set_struct(cfg, False)
        cfg = OmegaConf.merge(cfg, OmegaConf.create(rest))
        OmegaConf.set_struct(cfg, True)
        return cfg
    return compose(overrides or [])


def train(cfg=None, run_dir: str | None = None, *, resume: bool = False, callbacks=(), **objects) -> dict:
    """Train from a config (DictConfig, dict of overrides, or list of ``key=value``); returns the summary.

    Any of ``policy``, ``env``, ``privacy``, ``logger``, ``sampler``, ``learner`` may be passed in to
    replace the object the config would build (e.g. your own ``nn.Module`` policy).
    """
    if not isinstance(cfg, DictConfig):
        cfg = make_config(cfg)
    dist = distributed.init()  # a torchrun launch: join the process group (dppo/training/distributed.py)
    try:
        trainer = build(cfg, run_dir, callbacks=callbacks, **objects)
        if resume:
            def load():
                if not trainer.try_resume():
                    raise ConfigError(f"no usable checkpoint in {run_dir}/checkpoints; start a new run instead")
            distributed.on_main(load, dist)  # rank 0 loads; fit() hands the state to the other ranks
        return trainer.fit()
    finally:
        distributed.shutdown(dist)


def load_run_config(run_dir: str, overrides: list[str] | None = None) -> DictConfig:
    """The saved config of a run directory (``.hydra/config.yaml``) with extra overrides applied."""
    path = os.path.join(run_dir, ".hydra", "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"resume={run_dir} is not a run directory (no .hydra/config.yaml); "
                          f"pass the directory of an earlier run")
    from dppo.config import TrainConfig

    cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(path))
    cfg.resume = None
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return cfg
