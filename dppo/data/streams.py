"""Per-user random streams (contract C4): a user's sampling randomness is its own.

``user_generator(run_seed, user_id, round_idx)`` is the torch.Generator of user ``user_id``'s sampling in
round ``round_idx``; ``public_generator(run_seed, stream, round_idx)`` a public stream (evaluation).
Seeds come from numpy's SeedSequence over distinct domain tags, so no public stream equals a user's.
"""
from __future__ import annotations

import numpy as np
import torch

_USER_SAMPLING, _PUBLIC_SAMPLING = 0x5A3B, 0x9A3B
_STREAMS = {"eval": 1, "fisher": 2, "bench": 3}


def _hash(*words: int) -> int:
    lo, hi = np.random.SeedSequence([int(w) for w in words]).generate_state(2, dtype=np.uint32)
    return (int(hi) << 32) | int(lo)


def user_generator(run_seed: int, user_id: int, round_idx: int) -> torch.Generator:
    """The generator of user ``user_id``'s sampling in round ``round_idx`` (bit 63 clear)."""
    if int(run_seed) < 0 or int(user_id) < 0:
        raise ValueError(f"run seed and user id must be >= 0, got {run_seed}, {user_id}")
    return torch.Generator().manual_seed(_hash(_USER_SAMPLING, run_seed, user_id, round_idx) >> 1)


def public_generator(run_seed: int, stream: str, round_idx: int) -> torch.Generator:
    """The generator of a public stream (bit 63 set: never a user's generator seed)."""
    return torch.Generator().manual_seed((_hash(_PUBLIC_SAMPLING, run_seed, _STREAMS[stream], round_idx) >> 1)
                                         | (1 << 62))
