"""``dppo.load(run_dir)``: a finished (or interrupted) run's trained policy, config and summary, in one line.

    run = dppo.load("runs/2026-12-01/10-00-00_dp_pg_s0")
    action = run.policy.predict(obs, deterministic=True)      # numpy in, numpy out; single or batched obs
    run.policy.generate(["123+456="])                          # policy=lm: completions of text prompts
    run.evaluate(episodes=20)                                  # held-out public episodes, as final_return

The learner is rebuilt from ``.hydra/config.yaml`` exactly as training built it (no run directory, no logger
outputs: nothing is written into the run) and its state is loaded from the newest good checkpoint; a checkpoint
written under another configuration is refused. The caller's global RNG states are left as they were.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from omegaconf import DictConfig

from dppo.errors import ConfigError


@dataclass
class SavedRun:
    """What ``dppo.load`` returns.

    Attributes:
        policy: the trained policy (``predict``, ``sample``, ``log_prob``); None for tabular/GFA learners.
        config: the run's composed config.
        summary: ``summary.json`` as a dict (empty if the run never wrote one).
        learner: the rebuilt learner with the checkpoint's state (``evaluate``, ``state_dict``).
        env: the env factory the run used.
        checkpoint: the path of the checkpoint that was loaded.
        run_dir: the run directory.
    """

    policy: object
    config: DictConfig
    summary: dict
    learner: object
    env: object
    checkpoint: str
    run_dir: str
    rounds_done: int = field(default=0)

    def evaluate(self, episodes: int | None = None, greedy: bool | None = None) -> float:
        """Mean return over ``episodes`` held-out episodes (default: the run's ``eval_episodes``; the same
        public reset seeds as the trainer's final evaluation, so the full set reproduces ``final_return``)."""
        n = int(self.config.eval_episodes if episodes is None else episodes)
        g = bool(self.config.eval.greedy if greedy is None else greedy)
        return float(self.learner.evaluate(n, g))


def load(run_dir: str, overrides: list[str] | None = None, *, reward_funcs=None, reward_weights=None,
         train_dataset=None, eval_dataset=None) -> SavedRun:
    """Load a run directory written by ``python train.py`` or ``dppo.train`` (see the module docstring).

    A prompts run trained on rewards or rows passed from Python (``dppo.train(cfg, reward_funcs=...,
    train_dataset=...)``) needs the same objects again (the rows are checked against the recorded SHA-256).
    """
    from dppo.api import load_run_config, python_prompts
    from dppo.build import build, fingerprint
    from dppo.training.checkpoint import check_fingerprint, load_latest_checkpoint, rng_state, set_rng_state
    from dppo.training.logger import Logger

    cfg = load_run_config(run_dir, overrides)
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    state, path = load_latest_checkpoint(ckpt_dir) if os.path.isdir(ckpt_dir) else (None, None)
    if state is None:
        raise ConfigError(f"{run_dir} has no usable checkpoint (checkpoints/ckpt_*.pt); nothing to load")
    saved_rng = rng_state()
    try:
        cfg.progress = False
        env = python_prompts(cfg, reward_funcs=reward_funcs, reward_weights=reward_weights,
                             train_dataset=train_dataset, eval_dataset=eval_dataset)
        trainer = build(cfg, None, logger=Logger([]), env=env)
        check_fingerprint(state["fingerprint"], fingerprint(cfg))
        trainer.learner.load_state_dict(state["learner"])
    finally:
        set_rng_state(saved_rng)
    summary = {}
    spath = os.path.join(run_dir, "summary.json")
    if os.path.isfile(spath):
        with open(spath) as f:
            summary = json.load(f)
    policy = getattr(trainer.learner, "policy", None)
    if policy is not None and hasattr(policy, "eval"):
        policy.eval()
    return SavedRun(policy=policy, config=cfg, summary=summary, learner=trainer.learner,
                    env=getattr(trainer.learner, "env", None), checkpoint=path, run_dir=run_dir,
                    rounds_done=int(state["round"]))
