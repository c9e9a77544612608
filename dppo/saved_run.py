"""``dppo.load(path)``: a finished (or interrupted) run's trained policy, config and summary, in one line.

    run = dppo.load("runs/2026-12-01/10-00-00_dp_pg_s0")     # a run directory, or a policy.pt on its own
    action = run.policy.predict(obs, deterministic=True)      # numpy in, numpy out; single or batched obs
    action, _ = run.predict(obs, deterministic=True)          # Stable-Baselines3's contract: (actions, state)
    run.policy.generate(["123+456="])                          # policy=lm: completions of text prompts
    run.evaluate(episodes=20)                                  # held-out public episodes, as final_return
    mean, std = run.evaluate(episodes=20, return_std=True)     # SB3's evaluate_policy: (mean, std) of the returns
    print(run)                                                 # a few lines: run, algo, env, eps spent, final_return

From a run directory with checkpoints, the learner is rebuilt from ``.hydra/config.yaml`` exactly as training
built it (no run directory, no logger outputs: nothing is written into the run) and its state is loaded from
the newest good checkpoint; a checkpoint written under another configuration is refused. From the shareable
files alone - ``policy.pt`` (with or without ``summary.json`` and ``.hydra/``), or a ``policy.pt`` given on
its own - the learner is rebuilt from the config inside ``policy.pt`` (or ``.hydra/config.yaml``) and the
released policy's weights are loaded: what acting and evaluating need, and nothing secret. (Tabular and
GFA learners have no ``policy.pt``: their policy is rebuilt from a checkpoint.) The caller's global RNG
states are left as they were.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field

import numpy as np
from omegaconf import DictConfig

from dppo.errors import ConfigError

POLICY_FILE = "policy.pt"


@dataclass(repr=False)
class SavedRun:
    """What ``dppo.load`` returns.

    Attributes:
        policy: the trained policy (``predict``, ``sample``, ``log_prob``); None for tabular/GFA learners.
        config: the run's composed config.
        summary: ``summary.json`` as a dict; from a ``policy.pt`` with no ``summary.json`` beside it, the public part
            the file carries (eps and delta spent, accountant, adjacency, noise source, rounds, the public
            evaluation ``final_return``); empty for a checkpoint with no ``summary.json``.
        learner: the rebuilt learner with the trained state (``evaluate``; from ``policy.pt``: the policy's
            weights only, no optimizer or learner statistics).
        env: the env factory the run used.
        checkpoint: the path of the file that was loaded (a checkpoint, or ``policy.pt``).
        run_dir: the run directory (the folder holding ``policy.pt`` when a file was given).
        provenance: which users the policy's training consumed (``dppo/training/provenance.py``), if recorded.
    """

    policy: object
    config: DictConfig
    summary: dict
    learner: object
    env: object
    checkpoint: str
    run_dir: str
    rounds_done: int = field(default=0)
    provenance: dict | None = field(default=None)

    def evaluate(self, episodes: int | None = None, greedy: bool | None = None, *, return_std: bool = False,
                 return_episode_rewards: bool = False):
        """Mean return over ``episodes`` held-out episodes (default: the run's ``eval_episodes``; the same
        public reset seeds as the trainer's final evaluation, so the full set reproduces ``final_return``).

        As SB3's ``evaluate_policy``: ``return_std=True`` returns ``(mean, std)`` of the episodes' returns (numpy's
        population std, as SB3's), ``return_episode_rewards=True`` the lists ``(returns, lengths)`` of the
        episodes (it takes precedence). Both need per-episode returns, which the learners evaluating through the
        env's episode collector give (pg / npg / ppo / rebel and their dp_ versions); one that evaluates otherwise
        (tabular, GFA, UCB, prompts) may give the mean only: then a ConfigError names the learner.
        """
        n = int(self.config.eval_episodes if episodes is None else episodes)
        g = bool(self.config.eval.greedy if greedy is None else greedy)
        if not (return_std or return_episode_rewards):
            return float(self.learner.evaluate(n, g))
        mean, returns, lengths = self._episodes(n, g)
        if returns is None:
            raise ConfigError(f"the {type(self.learner).__name__} learner evaluates to a mean only (no per-episode "
                              f"returns): call evaluate() without return_std / return_episode_rewards")
        if return_episode_rewards:
            return [float(r) for r in returns], [int(t) for t in lengths]
        return mean, float(np.std(returns))

    def _episodes(self, n: int, greedy: bool):
        """(mean, per-episode returns, lengths) of the learner's own ``evaluate`` (``Learner.evaluate_episodes``: the
        held-out episodes it averages, so the mean is ``evaluate()``'s); (mean, None, None) for a learner that scores
        otherwise."""
        played = self.learner.evaluate_episodes(n, greedy)
        if played is None:
            return float(self.learner.evaluate(n, greedy)), None, None
        returns, lengths = played
        return float(returns.mean()), returns.double().numpy(), lengths.numpy()

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False, action_masks=None):
        """Stable-Baselines3's ``model.predict``: ``(actions, state)``, so ``a, _ = run.predict(obs)`` works.

        ``observation``: one observation or a batch, in the env's own form (``PredictMixin.predict``: an int for
        a Discrete space, an array of ints for a batch of them; an array of the Box's shape, or (N, *shape)). The
        actions: an integer (one Discrete observation) or an array (a batch; a Box or MultiDiscrete action).
        ``action_masks`` (A,) or (N, A): sb3-contrib's ``MaskablePPO.predict``, for a run whose env gave masks
        (its policy is a ``MaskedPolicy``). dppo's policies keep no recurrent state: the returned state is always
        ``None`` (``state`` and ``episode_start`` are accepted and ignored, as SB3's feed-forward policies do).
        ``run.policy.predict`` returns the actions alone.
        """
        if self.policy is None:
            raise ConfigError("this run's learner has no neural policy (tabular / GFA): nothing to predict with")
        if action_masks is None:
            return self.policy.predict(observation, deterministic=deterministic), None
        if not getattr(self.policy, "masked", False):
            raise ConfigError("this run's policy takes no action masks (its env gave none in training): "
                              "call predict without action_masks")
        return self.policy.predict(observation, deterministic=deterministic, action_masks=action_masks), None

    def __repr__(self) -> str:
        """A few lines: where the run is, what it trained, what it spent and how it did (the ledger and the rest of
        the summary are in ``run.summary``)."""
        s, cfg = self.summary or {}, self.config
        algo = s.get("algo") or str(cfg.algo.get("_target_", "?")).rsplit(".", 1)[-1]
        env = s.get("env_id") or getattr(self.env, "id", None) or cfg.env.get("id", "?")
        policy = type(self.policy).__name__ if self.policy is not None else None
        loaded = os.path.relpath(self.checkpoint, self.run_dir) if self.checkpoint.startswith(
            os.path.join(self.run_dir, "")) else self.checkpoint
        eps, delta = s.get("eps", cfg.get("eps")), s.get("delta", cfg.get("delta"))
        if "epsilon_spent" in s:
            spent = (f"eps spent {_num(s['epsilon_spent'])} of {_num(eps)}, "
                     f"delta spent {_num(s.get('delta_spent'))} of {_num(delta)}")
        else:
            spent = f"eps {_num(eps)}, delta {_num(delta)} (budget; no summary.json)"
        if eps is None:
            spent = "none (non-private: eps null)"
        rounds = f"{self.rounds_done} of {cfg.get('rounds', '?')}"
        final = s.get("final_return")
        lines = [f"SavedRun({algo} on {env}" + (f", policy {policy})" if policy else ")"),
                 f"  run_dir: {self.run_dir}", f"  loaded: {loaded}", f"  privacy: {spent}",
                 f"  rounds: {rounds}" + (" (complete)" if s.get("complete") else ""),
                 f"  final_return: {_num(final)}" + (f" over {cfg.get('eval_episodes')} held-out episodes"
                                                   if final is not None else "")]
        return "\n".join(lines)


def _num(x) -> str:
    return "-" if x is None else (f"{x:.6g}" if isinstance(x, (int, float)) else str(x))


def load(path: str, overrides: list[str] | None = None, *, reward_funcs=None, reward_weights=None,
         train_dataset=None, eval_dataset=None) -> SavedRun:
    """Load a run directory written by ``python train.py`` or ``dppo.train``, or a ``policy.pt`` file.

    A prompts run (``policy=lm``) loads to generate without its private prompts: rows passed from Python and
    not given again, or an ``env.path`` file no longer there, build it on ``WithheldPromptsEnv``
    (``dppo/envs/prompts_withheld.py``), and ``evaluate`` then takes public prompts (``eval_dataset=``, and
    ``reward_funcs=`` for a reward defined in the training session). Rows given (``train_dataset=``) must be the
    run's own: from a run directory they are checked against its keyed fingerprint (in its checkpoint, never in
    a shareable file).
    """
    from dppo.training.checkpoint import load_latest_checkpoint

    inputs = {"reward_funcs": reward_funcs, "reward_weights": reward_weights, "train_dataset": train_dataset,
              "eval_dataset": eval_dataset}
    if os.path.isfile(path):
        return _load_policy_file(path, os.path.dirname(os.path.abspath(path)), overrides, inputs)
    if not os.path.isdir(path):
        raise ConfigError(f"{path} is neither a run directory nor a policy.pt file")
    ckpt_dir = os.path.join(path, "checkpoints")
    state, ckpt = load_latest_checkpoint(ckpt_dir) if os.path.isdir(ckpt_dir) else (None, None)
    if state is not None and os.path.isfile(os.path.join(path, ".hydra", "config.yaml")):
        return _load_checkpoint(path, state, ckpt, overrides, inputs)
    if os.path.isfile(os.path.join(path, POLICY_FILE)):
        return _load_policy_file(os.path.join(path, POLICY_FILE), path, overrides, inputs)
    raise ConfigError(f"{path} is not a run directory to load: it has neither a usable checkpoint "
                      f"(checkpoints/ckpt_*.pt) nor a {POLICY_FILE}")


def _load_checkpoint(run_dir: str, state: dict, path: str, overrides, inputs=None) -> SavedRun:
    from dppo.api import load_run_config
    from dppo.build import fingerprint
    from dppo.training.checkpoint import check_fingerprint

    cfg = load_run_config(run_dir, overrides)
    check_fingerprint(state["fingerprint"], fingerprint(cfg))
    trainer = _build(_without_init_source(copy.deepcopy(cfg)), inputs)   # the checkpoint holds the weights
    if not getattr(trainer.population.env, "withheld", False):   # no rows at hand (generation only): none to check
        trainer.adopt_secret(state.get("secret"))   # rows passed again must be the run's own (keyed fingerprint)
    trainer.learner.load_state_dict(state["learner"])
    return _saved(trainer, cfg, run_dir, path, int(state["round"]), state.get("provenance"))


def _load_policy_file(path: str, folder: str, overrides, inputs=None) -> SavedRun:
    """Rebuild the policy of a ``policy.pt``: its own config (else the folder's ``.hydra/config.yaml``)."""
    import torch
    from omegaconf import OmegaConf

    from dppo.api import load_run_config, validate_dictconfig

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - not a torch file, or one that would need to run code
        raise ConfigError(f"{path} is not a policy file dppo can read ({type(err).__name__})") from None
    if not (isinstance(saved, dict) and saved.get("format") == "dppo-policy-1"):
        raise ConfigError(f"{path} is a bare state_dict without its config; load the run directory it came from, "
                          f"or rebuild the policy yourself and call load_state_dict")
    if isinstance(saved.get("config"), dict):
        cfg = validate_dictconfig(OmegaConf.create(saved["config"]))
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    elif os.path.isfile(os.path.join(folder, ".hydra", "config.yaml")):
        cfg = load_run_config(folder, overrides)
    else:
        raise ConfigError(f"{path} carries no config and {folder} has no .hydra/config.yaml; nothing to rebuild from")
    trainer = _build(_without_init_source(cfg), inputs)
    released = trainer.learner.released_modules()     # what the learner releases, as it declares it
    policy = released.get("policy")
    if policy is None:
        raise ConfigError(f"the config in {path} builds a learner without a neural policy")
    try:
        policy.load_state_dict(saved["policy"])
        if isinstance(saved.get("critic"), dict) and "critic" in released:
            released["critic"].load_state_dict(saved["critic"])   # an actor-critic's released critic, as saved
    except (RuntimeError, TypeError, KeyError) as err:
        raise ConfigError(f"{path}: the weights do not fit the policy its config builds: "
                          f"{str(err).splitlines()[0]}") from None
    return _saved(trainer, cfg, folder, path, int(saved.get("rounds_done") or 0), saved.get("provenance"),
                  saved.get("summary"))


def _without_init_source(cfg):
    """The weights come from the loaded file: do not read the pretraining source (``policy.init_from``) again."""
    from omegaconf import OmegaConf

    for key in ("init_from", "init_users_offset", "init_provenance", "init_data_disjoint"):
        if OmegaConf.select(cfg, f"policy.{key}", default=None) is not None:
            cfg.policy[key] = None
    return cfg


def _build(cfg, inputs=None):
    """The learner of ``cfg``, built exactly as training builds it, writing nothing; global RNGs untouched
    (``inputs``: a prompts env's Python objects, ``dppo.build.build_env``)."""
    from dppo.build import build
    from omegaconf import OmegaConf

    from dppo.build.env import load_env
    from dppo.training.checkpoint import rng_state, set_rng_state
    from dppo.training.logger import Logger

    saved_rng = rng_state()
    try:
        cfg.progress = False
        env, inputs = load_env(cfg, inputs)   # an LM run without its private prompts: built to generate
        if env is not None and OmegaConf.select(cfg, "eval.select", default=None) == "best":
            cfg = copy.deepcopy(cfg)   # training made that choice; a load selects nothing and may have no public
            cfg.eval.select = "last"   # prompts (the run's config, as returned, keeps its value)
        return build(cfg, None, logger=Logger([]), env=env, env_inputs=inputs)
    finally:
        set_rng_state(saved_rng)


def _saved(trainer, cfg, folder: str, path: str, rounds: int, provenance, carried: dict | None = None) -> SavedRun:
    """``summary``: the folder's ``summary.json``, else the public part a ``policy.pt`` carries (``carried``)."""
    summary = dict(carried) if isinstance(carried, dict) else {}
    spath = os.path.join(folder, "summary.json")
    if os.path.isfile(spath):
        with open(spath) as f:
            summary = json.load(f)
    policy = trainer.learner.released_modules().get("policy")   # None: a learner whose policy is no module
    if policy is not None:
        policy.eval()
    return SavedRun(policy=policy, config=cfg, summary=summary, learner=trainer.learner,
                    env=trainer.population.env, checkpoint=path, run_dir=folder,   # the env the build made
                    rounds_done=rounds, provenance=provenance)
