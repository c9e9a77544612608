"""Audits of the private least-squares oracles' releases, driven through the public mechanism functions.

An oracle's ``solve(users)`` is ``prepare`` (validation, clipping to the bounds, normalization: deterministic),
the statistics it releases, one mechanism of ``dppo.privacy.mechanisms`` (calibration, ledger entry, noise)
and a solve with the released values (post-processing). The audit builds the statistics with the oracle's own
public methods (``prepare(D).gram()``, ``.per_user_moments()``, ``.per_user_grads(w)``) and calls the mechanism
itself, with a ``StackedNoise`` source: one call is ``chunk`` independent releases.

Neighbours (normalized units, ||x|| <= 1, |y| <= 1; the other users are fixed and shared by D and D'):
- ``ssp``: canary (x = e1, y = 1) vs (x = (1/2, sqrt3/2), y = -1), default settings (b_clip = 1,
  gram_share = 1/3, where sigma_S = sigma_b and the two releases are one Gaussian mechanism with
  the joint sensitivity sqrt 4.5 of ``calibration.ssp_calibration``). In v = (diag S, sqrt2
  offdiag S, b) this moves v by sqrt(4.5), the largest change a replaced user can cause (single-row
  users are the extreme points), so the audit meets the calibration's own worst case. The release
  (S~, b~) of ``ssp_release`` is the whole release; the test is the likelihood ratio of the two
  Gaussians, the projection of the whitened release on the whitened difference.
- ``dp_gd``: canary (x = e1, y = 1) vs (x = e1, y = -1), others on e2; with clip C = 1 and radius 0.5
  the canary's gradient 2 (w_1 - y) e1 is clipped to exactly -C e1 vs +C e1 at every iterate of the ball,
  the replace-one worst case (2C) at each of the k steps, and the others' gradients have no e1 component.
  ``DPGDOracle.descend`` runs the oracle's k composed releases (the one release of clipped sums) on the oracle's per-user gradients; the
  test is the sum over steps of each released noisy sum's e1 component (the likelihood ratio of the k
  composed Gaussian releases), which the canary makes the same at every iterate, so the audit evaluates the
  gradients at w = 0 (its ``update`` keeps w and records the released sums).
- ``exp_mech``: one feature, grid cover {-1, +1} (w_max = 1, so Delta = (R + 1)^2 = 4); canary
  (x = 1, y = 1) vs (x = 1, y = -1), changing the score of w by 4 w, the full +-Delta at both
  candidates; k = round(6 / eps) other users with y = -1 balance the two outputs so that the test
  ``output = +1`` sees the normalizer shift too. The output is the whole release (pure DP, delta 0):
  the oracle's public ``solve``, stacked.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.audit.trials import StackedNoise, trial_context

CHUNK = 20_000  # releases per call: the mechanisms broadcast over a stacked noise draw


def _run(release, eps, delta, trials, seed, chunk=CHUNK):
    """Alternate ``release(privacy, side, round)`` on D (side 0) and D' (side 1), ``chunk`` stacked releases a
    call; returns (null, alt, claim)."""
    chunk = max(1, min(chunk, trials // 2))
    privacy = trial_context(eps, delta, StackedNoise(chunk, seed))
    null, alt = [], []
    for r in range(max(1, trials // (2 * chunk))):
        null.append(release(privacy, 0, 2 * r))
        alt.append(release(privacy, 1, 2 * r + 1))
    return np.concatenate(null), np.concatenate(alt), same_claim([privacy.spent()])


def _others(count: int, dim: int, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed + 17)
    out = []
    for _ in range(count):
        x = torch.rand(1, dim, generator=gen, dtype=torch.float64) * 2 - 1
        out.append((x / max(1.0, float(x.norm())), torch.rand(1, generator=gen, dtype=torch.float64) * 2 - 1))
    return out


def ssp_vector(S: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v = (diag S, sqrt2 * upper-offdiag S, b), the coordinates in which SSP's noise is isotropic."""
    iu = torch.triu_indices(S.shape[-1], S.shape[-1], offset=1)
    return torch.cat([torch.diagonal(S, dim1=-2, dim2=-1), math.sqrt(2.0) * S[..., iu[0], iu[1]], b], dim=-1)


def audit_ssp(eps: float, delta: float = 1e-5, trials: int = 100_000, *, seed: int = 0, oracle=None) -> MechanismAudit:
    """The ssp oracle's release (default settings); ``oracle`` another ssp oracle's settings."""
    from dppo.oracles import make_oracle
    from dppo.privacy.calibration import ssp_calibration
    from dppo.privacy.mechanisms import ssp_release

    started = time.perf_counter()
    oracle = oracle or make_oracle("ssp", x_bound=1.0, y_bound=1.0, b_clip=1.0, gram_share=1.0 / 3.0)
    others = _others(3, 2, seed)
    data = [oracle.prepare(d) for d in ([(torch.tensor([[1.0, 0.0]]), torch.tensor([1.0]))] + others,
                                        [(torch.tensor([[0.5, math.sqrt(3.0) / 2]]), torch.tensor([-1.0]))] + others)]
    v0, v1 = (ssp_vector(d.gram(), d.moment()) for d in data)
    cal = ssp_calibration(eps, delta, gram_share=oracle.gram_share, b_clip=oracle.b_clip)
    whiten = torch.cat([torch.full((3,), 1.0 / cal.sigma_gram), torch.full((2,), 1.0 / cal.sigma_moment)]).double()
    direction = (v1 - v0) * whiten ** 2          # LLR of N(v0, W^-2) vs N(v1, W^-2) is linear in v . direction

    def release(privacy, side, r):
        d = data[side]
        S, b, _ = ssp_release(privacy, d.gram(), d.per_user_moments(), round=r, eps=eps, delta=delta,
                              gram_share=oracle.gram_share, b_clip=oracle.b_clip)
        return (ssp_vector(S, b) @ direction).numpy()

    null, alt, claim = _run(release, eps, delta, trials, seed)
    return conclude("ssp", "ssp_release(prepare(D).gram(), prepare(D).per_user_moments()) (the oracle's S~, b~)",
                    claim, null, alt, started)


def audit_dp_gd(eps: float, delta: float = 1e-5, trials: int = 20_000, *, seed: int = 0, steps: int = 20,
                oracle=None) -> MechanismAudit:
    """The noisy projected GD oracle's k = ``steps`` composed releases, clip 1, radius 0.5."""
    from dppo.oracles import make_oracle

    started = time.perf_counter()
    oracle = oracle or make_oracle("dp_gd", steps=steps, clip=1.0, radius=0.5)
    others = [(torch.tensor([[0.0, 1.0]]), y[None]) for y in torch.linspace(-1, 1, 3, dtype=torch.float64)]
    data = [oracle.prepare([(torch.tensor([[1.0, 0.0]]), torch.tensor([y]))] + others) for y in (1.0, -1.0)]
    w0 = torch.zeros(2, dtype=torch.float64)

    def release(privacy, side, r):
        released = []

        def record(w, noisy_sum):  # keeps w (the canary's clipped gradient is the same at every iterate)
            released.append(noisy_sum[..., 0])
            return w

        oracle.descend(data[side], privacy, r, list(range(data[side].users)), record, w0)
        return sum(released).numpy()

    null, alt, claim = _run(release, eps, delta, trials, seed)
    return conclude("dp_gd", f"DPGDOracle.descend(prepare(D), steps={oracle.steps}) (each step's "
                    "released noisy sum)", claim, null, alt, started)


def audit_exp_mech(eps: float, delta: float = 0.0, trials: int = 100_000, *, seed: int = 0,
                   others: int | None = None) -> MechanismAudit:
    """Exponential-mechanism oracle on the grid cover {-1, +1}; the released w itself is the test."""
    from dppo.oracles import make_oracle

    started = time.perf_counter()
    # unit bounds (no rescaling: the canary's rows are the normalized units' extreme points) and no ridge (the
    # class's defaults are DP-NPG's bounds 0.5 / 3, under which this canary would move the scores by a fraction
    # of Delta only)
    oracle = make_oracle("exp_mech", cover="grid", grid_points=2, w_max=1.0, x_bound=1.0, y_bound=1.0, ridge=0.0)
    k = max(1, round(6.0 / eps)) if others is None else others
    rest = [(torch.tensor([[1.0]]), torch.tensor([-1.0]))] * k
    users = [[(torch.tensor([[1.0]]), torch.tensor([y]))] + rest for y in (1.0, -1.0)]

    def release(privacy, side, r):
        return oracle.solve(users[side], privacy=privacy, round=r)[..., 0].numpy()

    null, alt, claim = _run(release, eps, delta, trials, seed)
    return conclude("exp_mech", "make_oracle('exp_mech', cover='grid').solve(D)", claim, null, alt, started)
