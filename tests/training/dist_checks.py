"""Run under ``torchrun --nproc_per_node=2``: exercises dppo.training.distributed on gloo and writes each
rank's observations to ``$OUT/rank<r>.json`` (tests/training/test_distributed.py reads them).

Mode ``collectives``: shards, gather order, error propagation, and a sharded Gaussian-sum release
compared with the single-process release of the same rows. Mode ``dead_rank``: rank 1 exits before
the gather; rank 0 must fail within the timeout without recording a release.
"""
import json
import os
import sys
import time

import torch

from dppo.errors import BudgetExhausted
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.clipping import GaussianSumPrivatizer
from dppo.training import distributed


def rows(n=7, p=5):
    return torch.randn(n, p, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2


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
    # a sharded release against the single-process one (same seeded noise)
    privacy = PrivacyContext(3.0, 1e-5, noise=NoiseSource(11, secure=False))
    priv = GaussianSumPrivatizer(privacy, max_grad_norm=1.0)
    release = distributed.ShardedRelease(info)
    release.n_total = len(full)
    priv.shards = release
    vec, stats = priv.release_mean(full[lo:hi], round_idx=0)
    single = GaussianSumPrivatizer(PrivacyContext(3.0, 1e-5, noise=NoiseSource(11, secure=False)), 1.0)
    ref, ref_stats = single.release_mean(full, round_idx=0)
    out["release_equal"] = bool(torch.equal(vec, ref)) and stats == ref_stats
    out["ledger"] = privacy.ledger.entries
    out["ref_ledger"] = single.privacy.ledger.entries


def dead_rank(info, out):
    privacy = PrivacyContext(3.0, 1e-5, noise=NoiseSource(0, secure=False))
    priv = GaussianSumPrivatizer(privacy, max_grad_norm=1.0)
    release = distributed.ShardedRelease(info)
    release.n_total = 4
    priv.shards = release
    if info.rank == 1:
        os._exit(0)  # dies before its contribution arrives (no clean shutdown)
    t0 = time.time()
    try:
        priv.release_mean(rows(2), round_idx=0)
        out["released"] = True
    except Exception as err:  # noqa: BLE001 - the collective's timeout or the peer's disappearance
        out["released"] = False
        out["error"] = type(err).__name__
    out["seconds"] = time.time() - t0
    out["ledger"] = privacy.ledger.entries


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], sys.argv[2]
    info = distributed.init()
    out = {"rank": info.rank, "world": info.world_size}
    {"collectives": collectives, "dead_rank": dead_rank}[mode](info, out)
    with open(os.path.join(out_dir, f"rank{info.rank}.json"), "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    os._exit(0)  # skip destroying a process group whose peer may be gone
