"""Per-user random streams (contract C4): every random number a user's rollouts consume comes from
that user's own stream, so one user's data never depends on who else is in its round.

* ``user_reset_seeds(run_seed, u, G)``: the reset seeds of user u's G rollouts, a function of
  (run seed, user id) only. All G rollouts of a user start from the same start state (the user's one
  "context", as in the bandit form of [PO] and in GRPO): the group then compares G responses to it.
* ``user_generator(run_seed, u, r)``: the torch.Generator of user u's action sampling in round r.
* ``public_reset_seeds`` / ``public_generator``: evaluation and public (e.g. Fisher-state) rollouts, and
  public draws that are not rollouts (``minibatch``: DP-PPO's partition of a round's users;
  ``user_minibatches``: a multi-pass round's per-user minibatch draws).

Disjointness, by construction rather than by luck of a hash: every user reset seed lies in
[0, 2^31) and every public reset seed in [2^31, 2^32) (the top bit of a 32-bit seed is the domain);
generator seeds likewise carry the domain in bit 63. So no evaluation or public rollout can ever be
reset like a user's, whatever the run seed, user id or round.
"""
from __future__ import annotations

import numpy as np
import torch

_USER_RESET, _USER_SAMPLING, _PUBLIC_RESET, _PUBLIC_SAMPLING = 0x5EED, 0x5A3B, 0x9B1C, 0x9A3B
PUBLIC_SEED_BASE = 2**31  # public reset seeds are >= this, user reset seeds < this
_STREAMS = {"eval": 1, "fisher": 2, "bench": 3, "minibatch": 4, "reward_probe": 5, "select": 6}


def _hash(*words: int) -> int:
    """A 64-bit hash of non-negative integers (numpy's SeedSequence mixing)."""
    lo, hi = np.random.SeedSequence([int(w) for w in words]).generate_state(2, dtype=np.uint32)
    return (int(hi) << 32) | int(lo)


# numpy's SeedSequence constants (its hashmix / mix, pool of 4 words): ``_hash_many`` replays them on arrays
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4


def _hash_many(before: tuple, varying, after: tuple = ()) -> np.ndarray:
    """``_hash(*before, x, *after)`` for every x of ``varying`` at once (a uint64 array): numpy's SeedSequence
    mixing replayed on uint32 arrays, word for word (``tests/data/test_streams.py`` checks it against ``_hash``).
    Every word must be < 2^32 (one uint32 each, as SeedSequence splits it): ``_hashes`` checks and falls back."""
    u32 = np.uint32
    x = np.asarray(varying, dtype=np.int64).astype(u32)
    entropy = [np.full(x.shape, w, dtype=u32) for w in before] + [x] + [np.full(x.shape, w, dtype=u32)
                                                                      for w in after]
    with np.errstate(over="ignore"):
        const = [u32(_INIT_A)]

        def hashmix(v):
            v = v ^ const[0]
            const[0] = u32(const[0] * u32(_MULT_A))
            v = v * const[0]
            return v ^ (v >> u32(16))

        def mix(a, b):
            r = u32(_MIX_L) * a - u32(_MIX_R) * b
            return r ^ (r >> u32(16))

        pool = [hashmix(entropy[i] if i < len(entropy) else np.zeros(x.shape, dtype=u32)) for i in range(_POOL)]
        for i_src in range(_POOL):
            for i_dst in range(_POOL):
                if i_src != i_dst:
                    pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))
        for i_src in range(_POOL, len(entropy)):
            for i_dst in range(_POOL):
                pool[i_dst] = mix(pool[i_dst], hashmix(entropy[i_src]))
        out, h = [], u32(_INIT_B)
        for i in range(2):
            v = pool[i] ^ h
            h = u32(h * u32(_MULT_B))
            v = v * h
            out.append(v ^ (v >> u32(16)))
    return (out[1].astype(np.uint64) << np.uint64(32)) | out[0].astype(np.uint64)


def _hashes(before: tuple, varying: list, after: tuple = ()) -> list[int]:
    """``[_hash(*before, x, *after) for x in varying]``, vectorized when every word fits in 32 bits."""
    before, after, varying = tuple(int(w) for w in before), tuple(int(w) for w in after), [int(x) for x in varying]
    if all(0 <= w < 2 ** 32 for w in (*before, *after, *varying)):
        return [int(v) for v in _hash_many(before, varying, after)]
    return [_hash(*before, x, *after) for x in varying]


def _check(run_seed: int, user_id: int) -> None:
    if int(run_seed) < 0 or int(user_id) < 0:
        raise ValueError(f"run seed and user id must be >= 0, got {run_seed}, {user_id}")


def user_seed(run_seed: int, user_id: int) -> int:
    """The reset seed of user ``user_id`` of run ``run_seed``, in [0, 2^31)."""
    _check(run_seed, user_id)
    return _hash(_USER_RESET, run_seed, user_id) % PUBLIC_SEED_BASE


def user_seeds(run_seed: int, users) -> list[int]:
    """``[user_seed(run_seed, u) for u in users]``, hashed in one vectorized pass."""
    users = [int(u) for u in users]
    for u in users:
        _check(run_seed, u)
    return [h % PUBLIC_SEED_BASE for h in _hashes((_USER_RESET, run_seed), users)]


def user_generators(run_seed: int, users, round_idx: int) -> list[torch.Generator]:
    """``[user_generator(run_seed, u, round_idx) for u in users]``, their seeds hashed in one vectorized pass."""
    users = [int(u) for u in users]
    for u in users:
        _check(run_seed, u)
    return [torch.Generator().manual_seed(h >> 1) for h in _hashes((_USER_SAMPLING, run_seed), users, (round_idx,))]


def user_reset_seeds(run_seed: int, user_id: int, group_size: int) -> list[int]:
    """Reset seeds of user ``user_id``'s ``group_size`` rollouts: its one start state, G times."""
    return [user_seed(run_seed, user_id)] * int(group_size)


def user_generator(run_seed: int, user_id: int, round_idx: int) -> torch.Generator:
    """The generator of user ``user_id``'s action sampling in round ``round_idx`` (bit 63 clear)."""
    _check(run_seed, user_id)
    return torch.Generator().manual_seed(_hash(_USER_SAMPLING, run_seed, user_id, round_idx) >> 1)


def public_reset_seeds(run_seed: int, stream: str, round_idx: int, n: int) -> list[int]:
    """``n`` reset seeds of a public stream (``eval``, ``fisher``), in [2^31, 2^32): never a user's."""
    tag = _STREAMS[stream]
    return [PUBLIC_SEED_BASE + _hash(_PUBLIC_RESET, run_seed, tag, round_idx, i) % PUBLIC_SEED_BASE for i in range(n)]


def public_generator(run_seed: int, stream: str, round_idx: int) -> torch.Generator:
    """The sampling generator of a public stream (bit 63 set: never a user's generator seed)."""
    return torch.Generator().manual_seed((1 << 63) | (_hash(_PUBLIC_SAMPLING, run_seed, _STREAMS[stream], round_idx) >> 1))


def user_minibatches(run_seed: int, round_idx: int, epoch: int, user_ids, minibatches: int) -> torch.Tensor:
    """Each user's minibatch in (round, epoch) of the ``minibatch`` stream, one per id of ``user_ids``: user u's is
    hash(run seed, round, epoch, u) mod ``minibatches``, a function of those four public numbers only (so who
    else is in the round moves no user), uniform over the minibatches to within minibatches / 2^64 and
    independent across users as far as the hash's outputs are. int64, in the ids' order."""
    tag, b = _STREAMS["minibatch"], int(minibatches)
    if b < 1 or int(round_idx) < 0 or int(epoch) < 0:
        raise ValueError(f"minibatches must be >= 1, round and epoch >= 0, got {minibatches}, {round_idx}, {epoch}")
    for u in user_ids:
        _check(run_seed, u)
    if b == 1:   # every draw mod 1 is 0
        return torch.zeros(len(user_ids), dtype=torch.int64)
    return torch.tensor([_hash(_PUBLIC_SAMPLING, run_seed, tag, round_idx, epoch, u) % b for u in user_ids],
                        dtype=torch.int64)
