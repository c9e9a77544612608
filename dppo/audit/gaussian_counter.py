"""Audit of the Gaussian continual counters (``dppo.privacy.gaussian_counter``): tree and square-root
factorization, on the released values.

One trial is one counter stream (the counters are vectorized over streams, each with its own noise).
Neighbours: every other step carries a fixed increment (the same in D and D'); the user of step 1
adds Delta (D) or 0 (D'), the largest change one user makes to a stream. All T releases of the stream
are observed. The release vector is ``Y = A x + B z``, so ``u = B^{-1} (Y - A x_others)`` equals
``Delta c + z`` under D and ``z`` under D' (``c`` = first column of the encoder ``C = B^{-1} A``,
``z ~ N(0, sigma^2 I)``): the likelihood-ratio test thresholds ``c . u`` (the Neyman-Pearson optimal
test; for the tree with capacity ``2^L - 1`` the releases at ``t = 2^j`` are the L nodes containing
step 1, and the score is their sum). Claimed eps: the (eps, delta) of one stream with sensitivity
Delta, ``rho = (Delta kappa)^2 / (2 sigma^2)`` converted with the zCDP accountant - the counter is
calibrated here for a target eps at delta = 1e-5 exactly as the tabular learners calibrate it
(``rho_for_target``, ``sigma_for_rho``).

``float_bits=False`` scores the exact noisy values ``counts + noise`` (the real-number calibration);
``float_bits=True`` scores what a learner reads (``released``: the counts plus the noise rounded to
the 2^-16 grid, added exactly) without any rounding of the score, so a leak through the low-order
bits of the released floats would show.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from dppo.audit.result import MechanismAudit, conclude
from dppo.privacy.noise import NoiseSource

DELTA = 1e-5


def _dense_decoder(counter) -> np.ndarray:
    """The T x T lower-triangular Toeplitz decoder B of a ``SqrtFactorizationCounter``."""
    T, b = counter.capacity, counter._b
    B = np.zeros((T, T))
    for k in range(T):
        B[np.arange(k, T), np.arange(0, T - k)] = b[k]
    return B


def audit_gaussian_counter(eps: float, trials: int = 200_000, *, kind: str = "gaussian_sqrt", levels: int = 6,
                           sensitivity: float = 1.0, seed: int = 0, counter_cls=None, float_bits: bool = False,
                           sigma_scale: float = 1.0, first_release_only: bool = False) -> MechanismAudit:
    """``trials`` streams (half with the canary), capacity ``2^levels - 1``; ``counter_cls`` or
    ``sigma_scale`` for broken variants (the claim stays the correct one). ``first_release_only``
    scores the release at t = 1 alone (a valid, weaker test for the correct counter; the one that
    exposes a noise-free leaf level of the tree)."""
    from dppo.privacy.accountants.zcdp import rho_for_target, zcdp_to_dp
    from dppo.privacy.gaussian_counter import COUNTERS, sigma_for_rho
    from dppo.privacy.tabular_counters import counter_kappa

    started = time.perf_counter()
    cls = counter_cls or COUNTERS[kind]
    n, T = trials // 2, 2 ** levels - 1
    rho = rho_for_target(eps, DELTA)
    kappa = counter_kappa(kind, T)
    sigma = sigma_for_rho(rho, sensitivity, kappa)
    claimed = zcdp_to_dp((sensitivity * kappa) ** 2 / (2 * sigma ** 2), DELTA)
    others = (torch.rand(T - 1, generator=torch.Generator().manual_seed(seed + 5)) < 0.5).double() * sensitivity
    noise = NoiseSource(seed)
    scores = []
    for first in (sensitivity, 0.0):
        counter = cls(n, T, sigma * sigma_scale, noise=noise, groups=np.zeros(n, np.int64),
                      group_mass=np.array([float(n) * sensitivity]), stream_max=sensitivity)
        counter.reserve(T)
        idx = np.arange(n)
        Y = np.empty((T, n))
        running = 0.0
        for t in range(1, T + 1):
            value = first if t == 1 else float(others[t - 2])
            counter.step(idx, np.full(n, value))
            running += 0.0 if t == 1 else value
            out = counter.released if float_bits else counter.counts + counter.noise_now
            Y[t - 1] = out.numpy() - running
        if first_release_only:
            score = Y[0]
        elif kind == "gaussian_tree":
            rows = [(1 << j) - 1 for j in range(counter.levels)]     # t = 2^j: the nodes holding step 1
            score = Y[rows].sum(0)
        else:
            from scipy.linalg import solve_triangular

            u = solve_triangular(_dense_decoder(counter), Y, lower=True)
            score = counter._c[:T] @ u
        scores.append(score)
    name = f"{kind}_counter" + (" (raw float64 bits)" if float_bits else "")
    entry = f"dppo.privacy.gaussian_counter.{cls.__name__}.step (one stream per trial)"
    return conclude(name, entry, (claimed, DELTA), scores[0], scores[1], started)
