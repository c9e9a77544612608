"""How many live env instances a machine holds: the size of one instance, measured, against a share of memory.

``num_envs=auto`` (``dppo.envs.gym_env.GymEnvFactory``) sizes the rollout's pool of instances to
``instance_memory()`` bytes: ``INSTANCE_SHARE`` of this machine's physical memory, at most ``INSTANCE_CAP``.
An env that loads 200 MB of tables per instance (ICU-Sepsis) then gets 1 instance, and
CartPole (a few KB each) ``MAX_INSTANCES``.
"""
from __future__ import annotations

import os
import tracemalloc

MAX_INSTANCES = 1024          # live instances at most, however small
INSTANCE_SHARE = 1 / 32       # of physical memory, for env instances
INSTANCE_CAP = 256 * 2 ** 20  # bytes, whatever the machine


def physical_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def instance_memory() -> int:
    """Bytes the live env instances of one rollout engine may hold."""
    total = physical_memory_bytes()
    return INSTANCE_CAP if total is None else int(min(INSTANCE_CAP, total * INSTANCE_SHARE))


def measured(make):
    """(``make()``, bytes it allocated in Python and numpy): the size of one env instance."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    try:
        obj = make()
        size = max(0, tracemalloc.get_traced_memory()[0] - before)
    finally:
        if started:
            tracemalloc.stop()
    return obj, size
