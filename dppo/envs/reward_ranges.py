"""The reward range an env declares: public knowledge of the env, never a statistic of users' episodes.

A private run's sensitivities assume every reward lies in a known range, and the rollout enforces it by
clipping. The range comes, in this order, from ``reward_bound`` / ``env.reward_range`` in the config, from the
env itself (a finite ``reward_range`` attribute on the unwrapped env, as gymnasium < 1.0 envs and many user
envs carry), or from ``DOCUMENTED``: the ranges the envs' own documentation states. Where none exists a private
run is refused before round 0 (``dppo.envs.reward_probe`` tells the user the scale it sees on public seeds).
"""
from __future__ import annotations

import math
import re

from dppo.errors import ConfigError

# id pattern -> (low, high), from each env's documentation (gymnasium's classic-control and toy-text pages,
# ICU-Sepsis's README: reward 1 on survival, else 0).
DOCUMENTED = {
    r"(dppo/)?CartPole(Physics)?-v\d+": (0.0, 1.0),          # +1 every step
    r"Acrobot-v\d+": (-1.0, 0.0),                           # -1 every step, 0 on reaching the goal
    r"MountainCar-v\d+": (-1.0, 0.0),                       # -1 every step
    r"MountainCarContinuous-v\d+": (-0.1, 100.0),          # -0.1 a^2 (|a| <= 1), +100 at the goal
    r"Pendulum-v\d+": (-(math.pi ** 2 + 0.1 * 8 ** 2 + 0.001 * 2 ** 2), 0.0),   # -(theta^2 + .1 w^2 + .001 u^2)
    r"FrozenLake(8x8)?-v\d+": (0.0, 1.0),
    r"CliffWalking(Slippery)?-v\d+": (-100.0, -1.0),
    r"Taxi-v\d+": (-10.0, 20.0),
    r"Blackjack-v\d+": (-1.0, 1.5),                         # 1.5 for a natural with natural=True
    r"Sepsis/ICU-Sepsis-v\d+": (0.0, 1.0),                  # 1 if the patient survives, else 0
}


def check_reward_range(value, key: str = "env.reward_range") -> tuple[float, float]:
    """``value`` as (low, high) with finite low < high, or a one-line error naming ``key``."""
    try:
        low, high = (float(v) for v in value)
    except Exception:  # noqa: BLE001 - not a pair of numbers
        raise ConfigError(f"{key} must be [low, high], got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ConfigError(f"{key} must be finite with low < high, got [{low}, {high}]")
    return low, high


def declared_reward_range(env_id: str, env=None) -> tuple[float, float] | None:
    """The env's own declared range (its finite ``reward_range``), else the documented one, else None."""
    declared = getattr(getattr(env, "unwrapped", env), "reward_range", None) if env is not None else None
    if declared is not None:
        try:
            low, high = (float(v) for v in declared)
            if math.isfinite(low) and math.isfinite(high) and low < high:
                return low, high
        except Exception:  # noqa: BLE001 - a malformed attribute declares nothing
            pass
    for pattern, bounds in DOCUMENTED.items():
        if re.fullmatch(pattern, str(env_id)):
            return bounds
    return None


def bound_of(reward_range: tuple[float, float] | None) -> float | None:
    """The symmetric bound max(|low|, |high|) of a range (the learners' ``reward_bound``)."""
    return None if reward_range is None else max(abs(reward_range[0]), abs(reward_range[1]))


PROBE_EPISODES = 16
_OUR_ENVS_BOUND = 1.0   # the envs of this package that carry no reward_range document their rewards in [-1, 1]


def probe_rewards(factory, seed: int, episodes: int = PROBE_EPISODES) -> tuple[float, float]:
    """(min, max) reward of ``episodes`` uniformly random episodes on public seeds (never a user's): the scale
    a user is told when the env declares no range."""
    import numpy as np

    from dppo.data import streams

    env = factory.make()
    rng = np.random.default_rng(int(seed))
    low, high = math.inf, -math.inf
    try:
        env.action_space.seed(int(rng.integers(2 ** 31)))
        for s in streams.public_reset_seeds(seed, "reward_probe", 0, episodes):
            env.reset(seed=int(s))
            for _ in range(int(factory.horizon)):
                _, r, term, trunc, _ = env.step(env.action_space.sample())
                low, high = min(low, float(r)), max(high, float(r))
                if term or trunc:
                    break
    finally:
        env.close()
    return low, high


def resolve_reward_bound(reward_bound, env, *, private: bool, needs_bound: bool, seed: int, algo: str):
    """The learners' ``reward_bound``: the config's; else the symmetric bound of the env's ``reward_range``; for
    an env of this package without one, 1 (its documented range). Where the env declares no range a private
    run (or a learner that needs a bound, ``needs_bound``) is refused with the scale a public probe sees; a
    non-private run gets None (nothing clipped)."""
    if reward_bound is not None:
        return float(reward_bound)
    if not hasattr(env, "reward_range"):
        return _OUR_ENVS_BOUND
    if env.reward_range is not None:
        return bound_of(env.reward_range)
    if not (private or needs_bound):
        return None
    name = getattr(env, "id", type(env).__name__)
    try:
        low, high = probe_rewards(env, seed)
        seen = f"; {PROBE_EPISODES} random episodes on public seeds saw rewards in [{low:.4g}, {high:.4g}]"
    except Exception:  # noqa: BLE001 - the probe only informs the message
        seen = ""
    why = "a private run" if private else f"algo={algo}"
    raise ConfigError(f"{why} needs a reward range and {name} declares none{seen}: set env.reward_range=[low, high] "
                      f"or reward_bound=B (rewards are clipped to it)")


def clipping_warning(reward_bound, env) -> str | None:
    """A public warning when ``reward_bound`` cuts into the env's declared range (rewards will be clipped)."""
    declared = getattr(env, "declared_reward_range", None) or getattr(env, "reward_range", None)
    if reward_bound is None or declared is None:
        return None
    if max(abs(declared[0]), abs(declared[1])) > float(reward_bound) * (1 + 1e-9):
        return (f"reward_bound={reward_bound:g} is inside {getattr(env, 'id', 'the env')}'s declared reward range "
                f"[{declared[0]:.4g}, {declared[1]:.4g}]: rewards beyond +-{reward_bound:g} are clipped")
    return None
