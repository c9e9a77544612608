"""Refuse, before anything is allocated, a population or a round whose arrays cannot fit in this machine's memory."""
from __future__ import annotations

import math

from omegaconf import OmegaConf

from dppo.envs.memory import physical_memory_bytes
from dppo.errors import ConfigError

ROUND_MEMORY_FRACTION = 0.5   # refuse a round (or population) whose arrays would need more than this share of RAM


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
    obs = math.prod(space.shape) if space.shape else 1
    group = OmegaConf.select(cfg, "group_size", default=None) or 1
    m = int(cfg.users_per_round) * int(group)
    need = 8 * m * int(horizon) * (obs + 3)
    if policy is not None and hasattr(policy, "parameters"):
        need += 8 * 3 * int(cfg.users_per_round) * sum(p.numel() for p in policy.parameters())
    if need > limit:
        raise ConfigError(f"one round (users_per_round={cfg.users_per_round}, horizon {horizon}) needs "
                          f"~{need / 2**30:.3g} GiB, more than {ROUND_MEMORY_FRACTION:.0%} of this machine's "
                          f"memory; lower users_per_round or env.horizon")
