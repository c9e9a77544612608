"""Audit of the correlated-noise stream (``dppo.privacy.correlated``): ``ComposedGaussianSums`` with ``Correlated`` noise with each user in
one release (DP-PG's) or in the E consecutive releases of its round (each of DP-PPO's parts), driven through
``composed_sums`` with the ``CorrelatedNoise`` option, on the released values.

One trial is one whole stream (``StackedNoise``: every draw is ``trials`` independent streams). Neighbours: the
audited user, in the first round, contributes +C (D) or -C (D') to each of its releases (1-dimensional,
the largest change replace-one allows: 2C); every other user's contributions are fixed and the same in D
and D'. All releases of the stream are observed. Un-normalizing them and applying C gives
``y = C (x_user) + sigma z`` (the other users' known sums removed), so the likelihood-ratio test thresholds
``<C 1_S, y>`` (1_S: the user's releases), Neyman-Pearson optimal for this pair; with c >= 0 and consecutive
releases the pair attains the stream's sensitivity, so a correct calibration shows eps_LB close to the claim.
Claimed eps: what the run's accountant reports after the stream (``privacy.spent()``).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.audit.trials import StackedNoise

DELTA = 1e-5
ENTRY = "dppo.privacy.composed.ComposedGaussianSums.release_sum (Correlated) (one stream per trial)"


def _dense(c, T: int) -> np.ndarray:
    C = np.zeros((T, T))
    for k, ck in enumerate(c):
        C += ck * np.eye(T, k=-k)
    return C


def _stream(eps, n, seed, sign, *, participations, bands, kind, rounds, users, sigma_scale, clip, others):
    """(released sums minus the other users' sums: the user's +-C plus the noise, shape (T, n); the
    coefficients; the claimed (eps, delta))."""
    from dppo.privacy.composed import composed_sums
    from dppo.privacy.context import PrivacyContext
    from dppo.privacy.correlated import CorrelatedNoise

    privacy = PrivacyContext(eps, DELTA, noise=StackedNoise(n, seed),
                             noise_correlation=CorrelatedNoise(kind, bands, rounds=rounds))
    E = participations
    rel = composed_sums(privacy, parts={"actor": (E, 1.0)})   # E = 1: DP-PG's release; E > 1: each of DP-PPO's parts
    if sigma_scale != 1:   # the broken variant: less noise than the calibration (the ledger's claim unchanged)
        calibrated = rel.sigma
        rel.sigma = lambda c, part=None: calibrated(c, part) * sigma_scale
    out = []
    for r in range(rounds):
        ids = list(range(r * users, (r + 1) * users))
        rel.open_round(r, ids, (clip,))
        for j in range(E):
            rows = torch.tensor(others[r * E + j][:users], dtype=torch.float64)[:, None]
            if r == 0:
                rows[0, 0] = sign * clip
            noisy, _ = rel.release_sum(rows, ids, clip, part="actor")
            out.append(noisy[:, 0] - rows[1:].sum(0)[0])
    return torch.stack(out).numpy(), rel.coefficients["actor"], privacy.spent()


def audit_correlated_noise(eps: float, trials: int = 200_000, *, participations: int = 1, bands: int = 4,
                           kind: str = "banded", rounds: int = 6, users: int = 3, seed: int = 0,
                           sigma_scale: float = 1.0) -> MechanismAudit:
    """``trials`` streams (half on each neighbour) of ``rounds`` rounds, each user in ``participations``
    consecutive releases; ``sigma_scale`` < 1 is a broken variant (the claim stays the correct one)."""
    started = time.perf_counter()
    n, clip = trials // 2, 1.0
    T = rounds * participations
    gen = np.random.default_rng(seed + 5)
    others = gen.uniform(-clip, clip, size=(T, users))   # the other users' (fixed, clipped) contributions
    scores, claims = [], []
    for k, sign in enumerate((1.0, -1.0)):
        u, coeffs, claim = _stream(eps, n, seed * 2 + k, sign, participations=participations, bands=bands, kind=kind,
                                   rounds=rounds, users=users, sigma_scale=sigma_scale, clip=clip, others=others)
        C = _dense(coeffs, T)
        direction = C[:, :participations].sum(1)           # C 1_S: the user's releases are the first E
        scores.append(direction @ (C @ u))
        claims.append(claim)
    claimed = same_claim(claims)
    name = f"correlated_noise_{kind}_b{bands}_E{participations}"
    name += "" if sigma_scale == 1 else f" (sigma x {sigma_scale})"
    return conclude(name, ENTRY, claimed, scores[0], scores[1], started)
