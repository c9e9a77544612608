"""``python -m dppo.evaluate RUN [--episodes N] [--greedy] [--video DIR]``: evaluate a saved policy.

RUN is a run directory (its newest checkpoint, or, with only the shareable files, its ``policy.pt``) or a
``policy.pt`` on its own. Runs the trained policy on held-out public episodes (the reset seeds of the
trainer's final evaluation, disjoint from every training user's) and prints the mean return +/- its std
(the mean alone for a learner without per-episode returns: tabular, GFA, UCB, prompts); nothing is
written into the run directory. ``--video DIR`` also records episodes through gymnasium's ``RecordVideo``
(needs the ``video`` extra, ``pip install -e ".[video]"``: moviepy and pygame; the directory must lie
outside the run's logs or be named by you). Errors: one line, exit 2.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np

from dppo.errors import ConfigError, DPPOError


VIDEO_EXTRA = ("--video needs moviepy: pip install -e \".[video]\" (moviepy and pygame; gymnasium's RecordVideo "
               "writes with them)")


def evaluation_seeds(run, n: int) -> list[int]:
    """The reset seeds of the trainer's held-out evaluation episodes (``dppo.data.streams``' public ``eval``
    stream, round 0; mapped by the env when it has public seeds of its own): never a training user's."""
    from dppo.data import streams

    seeds = streams.public_reset_seeds(int(run.config.seed), "eval", 0, int(n))
    env = run.env
    return [env.public_seed(s) for s in seeds] if hasattr(env, "public_seed") else seeds


def record_video(run, video_dir: str, episodes: int, greedy: bool) -> list[float]:
    """Record ``episodes`` held-out episodes of ``run.policy`` to ``video_dir``; their returns."""
    if importlib.util.find_spec("moviepy") is None:
        raise ConfigError(VIDEO_EXTRA)
    import gymnasium as gym
    import torch
    from gymnasium.wrappers import RecordVideo

    env_factory, policy = run.env, run.policy
    if policy is None or not hasattr(env_factory, "id") or not hasattr(env_factory, "horizon"):
        raise ConfigError("--video needs a gymnasium env (env.id=...) and a policy learner (pg/npg/rebel)")
    try:
        env = gym.make(env_factory.id, render_mode="rgb_array", max_episode_steps=env_factory.horizon,
                       **getattr(env_factory, "kwargs", {}))
        env.reset(seed=0)
        env.render()
    except gym.error.DependencyNotInstalled as err:  # e.g. pygame for the classic-control renderers
        raise ConfigError(f"--video: {str(err).splitlines()[0]}") from None
    os.makedirs(video_dir, exist_ok=True)
    env = RecordVideo(env, video_folder=video_dir, episode_trigger=lambda _: True,
                      name_prefix=os.path.basename(os.path.normpath(run.run_dir)) or "dppo")
    gen = torch.Generator().manual_seed(int(run.config.seed) + 99991)
    returns = []
    try:
        for seed in evaluation_seeds(run, episodes):
            obs, _ = env.reset(seed=int(seed))
            total, done = 0.0, False
            while not done:
                obs, r, term, trunc, _ = env.step(policy.predict(np.asarray(obs), deterministic=greedy,
                                                                 generator=gen))
                total += float(r)
                done = term or trunc
            returns.append(total)
    finally:
        env.close()
    return returns


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m dppo.evaluate``."""
    p = argparse.ArgumentParser(prog="python -m dppo.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", metavar="RUN", help="a run directory, or a policy.pt")
    p.add_argument("--episodes", type=int, default=None, help="held-out episodes (default: the run's eval_episodes)")
    p.add_argument("--greedy", action="store_true", help="act with the mode (argmax / Gaussian mean)")
    p.add_argument("--video", metavar="DIR", default=None,
                   help='record episodes to DIR (needs the video extra: pip install -e ".[video]")')
    p.add_argument("--video-episodes", type=int, default=1, help="how many episodes to record (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.episodes is not None and args.episodes < 1:
            raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
        if args.video is not None and importlib.util.find_spec("moviepy") is None:
            raise ConfigError(VIDEO_EXTRA)
        from dppo.saved_run import load

        run = load(args.run_dir)
        n = int(run.config.eval_episodes if args.episodes is None else args.episodes) or 1
        greedy = bool(args.greedy or run.config.eval.greedy)
        try:
            mean, std = run.evaluate(n, greedy, return_std=True)
            spread = f" +/- {std:.6g} (std)"
        except ConfigError:            # a learner that evaluates to a mean only (tabular, GFA, UCB, prompts)
            mean, spread = run.evaluate(n, greedy), ""
        final = run.summary.get("final_return")
        ref = f" (summary final_return {final:.6g})" if isinstance(final, (int, float)) else ""
        print(f"{run.summary.get('algo', run.config.algo.get('name'))} on {getattr(run.env, 'id', '?')}: "
              f"mean return {mean:.6g}{spread} over {n} held-out episodes ({'greedy' if greedy else 'stochastic'}), "
              f"from {os.path.basename(run.checkpoint)}{ref}")
        if args.video is not None:
            rets = record_video(run, args.video, max(1, args.video_episodes), greedy)
            print(f"video: {len(rets)} episode(s) in {args.video} (returns {', '.join(f'{r:.4g}' for r in rets)})")
    except DPPOError as err:
        print(f"dppo: error: {str(err).splitlines()[0]}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
