"""Audit of the binary-tree continual counter ``dppo.privacy.tree_counter.TreeCounter`` (PUCB's statistics).

One trial is one counter stream: the counter is vectorized over streams, each with its own Laplace
noise, so a counter with n streams runs n independent trials of the mechanism in one pass.
Neighbours: every other time step carries a fixed increment (the same in D and D'); the user of
step 1 adds Delta (D) or 0 (D'), the largest change one user can make to a stream. With capacity
T = 2^L - 1 the L nodes containing step 1 all close, and the release at t = 2^j is exactly the noisy
node of level j covering [1, 2^j]. With y_j = c~(2^j) - (the other users' count), the y_j are
independent Laplace(b) shifted by Delta under D: the likelihood-ratio test thresholds
sum_j |y_j| - |y_j - Delta| (it does not need b). Claimed eps: the counter's per-stream eps
(``eps_stream``), which PUCB's ledger composes over the streams a user touches.

Floating point: the likelihood ratio has atoms at +-L (all y_j beyond the shift), and the float64
rounding of ``count + noise`` differs between D and D' at those atoms (the low-order-bit leak of
textbook floating-point Laplace noise, Mironov 2012). By default the score is rounded to 1e-9,
which audits the mechanism's real-number calibration on the exact noisy values (before snapping);
``float_bits=True`` keeps the raw bits of what is actually released (snapped to a power-of-two grid
>= b and clamped, Mironov's defence) and so tests the floating-point release itself.
"""
from __future__ import annotations

import time

import torch

from dppo.audit.result import MechanismAudit, conclude
from dppo.privacy.noise import NoiseSource

ENTRY = "dppo.privacy.tree_counter.TreeCounter.step (one stream per trial)"


def _released_nodes(counter, first: float, others: torch.Tensor, n: int, raw: bool = False) -> torch.Tensor:
    """Feed ``first`` then ``others`` to every stream; return (n, L) node releases minus the others' count.

    ``raw``: read the exact noisy values before snapping (``counts + noise_total``, the sum the release snaps;
    the real-number calibration),
    else what a learner can read (``released``: snapped and clamped)."""
    idx = torch.arange(n)
    counter.reserve(counter.capacity)
    rows, running = [], 0.0
    for t in range(1, counter.capacity + 1):
        value = first if t == 1 else float(others[t - 2])
        counter.step(idx, torch.full((n,), value, dtype=torch.float64))
        running += 0.0 if t == 1 else min(max(value, 0.0), counter.sensitivity)
        if t & (t - 1) == 0:                        # t = 2^j: the release is the level-j node over [1, t]
            out = counter.counts + counter.noise_total if raw and counter.private else counter.released
            rows.append(out.clone() - running)
    return torch.stack(rows, 1)


def audit_tree_counter(eps: float, trials: int = 1_000_000, *, levels: int = 6, sensitivity: float = 1.0,
                       seed: int = 0, counter_cls=None, float_bits: bool = False) -> MechanismAudit:
    """``trials`` streams (half with the canary), capacity 2^levels - 1; ``counter_cls`` for broken variants."""
    from dppo.privacy.tree_counter import TreeCounter

    started = time.perf_counter()
    counter_cls = counter_cls or TreeCounter
    n, capacity = trials // 2, 2 ** levels - 1
    others = (torch.rand(capacity - 1, generator=torch.Generator().manual_seed(seed + 5)) < 0.5).double() * sensitivity
    noise = NoiseSource(seed)
    scores, claims = [], []
    for first in (sensitivity, 0.0):
        counter = counter_cls(n, capacity, eps, sensitivity=sensitivity, noise=noise)
        y = _released_nodes(counter, first, others, n, raw=not float_bits)
        llr = (y.abs() - (y - counter.sensitivity).abs()).sum(1).numpy()
        scores.append(llr if float_bits else llr.round(9))
        claims.append(counter.eps_stream)
    assert claims[0] == claims[1]
    name = "tree_counter (raw float64 bits)" if float_bits else "tree_counter"
    return conclude(name, ENTRY, (claims[0], 0.0), scores[0], scores[1], started)
