"""Run under ``torchrun --nproc_per_node=2``: exercises dppo.training.distributed on gloo and writes each
rank's observations to ``$OUT/rank<r>.json`` (tests/training/test_distributed.py reads them).

Mode ``collectives``: shards, gather order, error propagation, and a sharded round of DP-PG's release (each rank
clips and sums its users, rank 0 adds the sums and draws the noise once) compared with the single-process
release of the same sums; in its second round the ranks take different paths (rows, a clipped sum formed
elsewhere). Mode ``dead_rank``: rank 1 exits after the round opens, before its sum arrives; rank 0 must fail
within the timeout without releasing a noisy sum. Mode ``teardown``: a run's order (join, build an optimizer,
which makes torch import its lazily loaded modules, collectives of pickled objects, ``shutdown``): the gloo
threads this process runs before and after ``shutdown``.
"""
import json
import os
import sys
import time

import torch

from dppo.errors import BudgetExhausted
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.composed import composed_sums
from dppo.privacy.release import clipped_total
from dppo.training import distributed

PART = {"actor": (1, 1.0)}   # DP-PG's release: one sum per user and round


def rows(n=7, p=5):
    return torch.randn(n, p, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2


class _Users:
    """A sampler whose round k is the fresh users k n .. (k + 1) n - 1 (one-pass: the release refuses a user twice)."""

    def __init__(self, n):
        self.n, self.round = n, 0

    def next_round(self):
        self.round += 1
        return list(range((self.round - 1) * self.n, self.round * self.n))


def sharded(info, privacy, n):
    sampler = distributed.ShardedSampler(_Users(n), info)
    return distributed.ShardedSums(composed_sums(privacy, parts=PART), sampler, info), sampler


def collectives(info, out):
    full = rows()
    lo, hi = distributed.shard_bounds(len(full), info.world_size, info.rank)
    out["shard"] = [lo, hi]
    gathered = distributed.gather_rows(full[lo:hi], len(full), info)
    out["gather_in_order"] = None if gathered is None else bool(torch.equal(gathered, full))
    out["broadcast"] = distributed.broadcast_object({"r": info.rank}, info)

    def refuse():
        raise BudgetExhausted("spent")

    try:
        distributed.on_main(refuse, info)
        out["error_raised"] = False
    except BudgetExhausted as err:
        out["error_raised"] = str(err)
    # two sharded rounds against the single-process release of the ranks' sums added in rank order (same noise)
    privacy = PrivacyContext(3.0, 1e-5, noise=NoiseSource(11, secure=False))
    release, sampler = sharded(info, privacy, len(full))
    single = composed_sums(PrivacyContext(3.0, 1e-5, noise=NoiseSource(11, secure=False)), parts=PART)
    bounds = [distributed.shard_bounds(len(full), info.world_size, r) for r in range(info.world_size)]
    equal, close = [], []
    for round_idx in range(2):
        ours = sampler.next_round()
        everyone, offset = release.round_users(ours)
        release.open_round(round_idx, everyone, (1.0,), dim=full.shape[1])
        if round_idx == 1 and info.rank == 1:   # this rank's clipped sum formed elsewhere (the fused path)
            vec, stats = release.release_clipped_sum(*clipped_total(full[lo:hi], 1.0), ours, 1.0, part="actor")
        else:
            vec, stats = release.release_sum(full[lo:hi], ours, 1.0, part="actor")
        single.open_round(round_idx, everyone, (1.0,), dim=full.shape[1])
        sums = [clipped_total(full[a:b], 1.0) for a, b in bounds]
        total = sums[0][0].clone()
        for t, _ in sums[1:]:
            total += t
        ref, ref_stats = single.release_clipped_sum(total, torch.cat([n for _, n in sums]), everyone, 1.0,
                                                    part="actor")
        equal.append(bool(torch.equal(vec, ref)) and stats == ref_stats and offset == lo and ours == everyone[lo:hi])
        close.append(bool(torch.allclose(vec - (ref - total), clipped_total(full, 1.0)[0], rtol=1e-12, atol=1e-12)))
    out["release_equal"] = all(equal)   # bit-identical to the single process's release of the same sums
    out["sum_close"] = all(close)       # and to one process's sum of every row, to float64 rounding
    out["ledger"] = privacy.ledger.entries
    out["ref_ledger"] = single.privacy.ledger.entries


def dead_rank(info, out):
    privacy = PrivacyContext(3.0, 1e-5, noise=NoiseSource(0, secure=False))
    release, sampler = sharded(info, privacy, 4)
    ours = sampler.next_round()
    release.open_round(0, release.round_users(ours)[0], (1.0,))
    if info.rank == 1:
        os._exit(0)  # dies before its contribution arrives (no clean shutdown)
    t0 = time.time()
    try:
        release.release_sum(rows(2), ours, 1.0, part="actor")
        out["released"] = True
    except Exception as err:  # noqa: BLE001 - the collective's timeout or the peer's disappearance
        out["released"] = False
        out["error"] = type(err).__name__
    out["seconds"] = time.time() - t0
    out["ledger"] = privacy.ledger.entries


def gloo_threads() -> list[str]:
    """Names of this process's threads that gloo started (Linux: /proc/self/task/*/comm)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(n for n in names if "gloo" in n)


def teardown(info, out):
    torch.optim.Adam(torch.nn.Linear(3, 1).parameters())  # the trainer builds its optimizers after joining
    out["gathered"] = distributed.gather_objects({"rank": info.rank}, info)
    out["broadcast"] = distributed.broadcast_object([1, 2], info)
    out["threads_before"] = gloo_threads()
    distributed.shutdown(info, clean=True)
    out["threads_after"] = gloo_threads()


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], sys.argv[2]
    info = distributed.init()
    out = {"rank": info.rank, "world": info.world_size}
    {"collectives": collectives, "dead_rank": dead_rank, "teardown": teardown}[mode](info, out)
    with open(os.path.join(out_dir, f"rank{info.rank}.json"), "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    os._exit(0)  # skip destroying a process group whose peer may be gone
