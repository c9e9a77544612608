"""Audits of the private least-squares oracles built by ``make_oracle(name)``, one private solve per trial.

``solve(users) = to_original(_solve_private(prepare(users), ...))``: ``prepare`` (validation, clipping to
the bounds, normalization) is deterministic, so it runs once per input and every trial runs
``_solve_private`` on its output: the part that calibrates the noise, records the release (the
accountant's claim) and draws the noise; ``to_original`` is a fixed rescaling (post-processing).

Neighbours (normalized units, ||x|| <= 1, |y| <= 1; the other users are fixed and shared by D and D'):
- ``ssp``: canary (x = e1, y = 1) vs (x = (1/2, sqrt3/2), y = -1), default settings (b_clip = 1,
  gram_share = 1/3, where sigma_S = sigma_b and the two releases are one Gaussian mechanism with
  the joint sensitivity sqrt 4.5 of ``SSPOracle.joint_sensitivity_sq``). In v = (diag S, sqrt2
  offdiag S, b) this moves v by sqrt(4.5), the largest change a replaced user can cause (single-row
  users are the extreme points), so the audit meets the calibration's own worst case. White-box: S~, b~ are read where they enter ``psd_ridge_solve``;
  the test is the likelihood ratio of the two Gaussians, the projection of the whitened release
  on the whitened difference (sigma_S, sigma_b from the oracle's own ``noise_stds``).
- ``dp_gd``: canary (x = e1, y = 1) vs (x = e1, y = -1), others on e2; with clip C = 1 and radius 0.5
  the canary's gradient 2 (w_1 - y) e1 is clipped to exactly -C e1 vs +C e1 at every step, the
  replace-one worst case (2C) at each of the k steps. White-box: each step's noisy gradient sum is
  recovered from the iterate entering ``project_ball``; the test is the sum over steps of its e1
  component (the likelihood ratio of the k composed Gaussian releases).
- ``exp_mech``: one feature, grid cover {-1, +1} (w_max = 1, so Delta = (R + 1)^2 = 4); canary
  (x = 1, y = 1) vs (x = 1, y = -1), changing the score of w by 4 w, the full +-Delta at both
  candidates; k = round(6 / eps) other users with y = -1 balance the two outputs so that the test
  ``output = +1`` sees the normalizer shift too. The output is the whole release (pure DP, delta 0).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.audit.trials import StackedNoise, tap, trial_context

CHUNK = 20_000  # releases per call: the oracles broadcast over a stacked noise draw


def _run(oracle, users_null, users_alt, eps, delta, trials, seed, observe, chunk=CHUNK):
    """Alternate private solves on D and D', each drawing ``chunk`` stacked noises; returns (null, alt, claim).

    The project's ``_solve_private`` runs unchanged; with a ``StackedNoise`` source its output carries a
    leading trial dimension (every oracle broadcasts over it), so one call is ``chunk`` independent releases.
    """
    chunk = max(1, min(chunk, trials // 2))
    data_null, data_alt = oracle.prepare(users_null), oracle.prepare(users_alt)
    privacy = trial_context(eps, delta, StackedNoise(chunk, seed))
    null, alt = [], []
    for r in range(max(1, trials // (2 * chunk))):
        null.append(observe(lambda: oracle._solve_private(data_null, privacy, 2 * r, eps, delta)))
        alt.append(observe(lambda: oracle._solve_private(data_alt, privacy, 2 * r + 1, eps, delta)))
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
    """SSP oracle (default settings); ``oracle`` overrides it (broken variants in the tests)."""
    from dppo.oracles import make_oracle

    started = time.perf_counter()
    oracle = oracle or make_oracle("ssp")
    others = _others(3, 2, seed)
    d_null = [(torch.tensor([[1.0, 0.0]]), torch.tensor([1.0]))] + others
    d_alt = [(torch.tensor([[0.5, math.sqrt(3.0) / 2]]), torch.tensor([-1.0]))] + others
    v0 = ssp_vector(oracle.prepare(d_null).gram(), oracle.prepare(d_null).moment())
    v1 = ssp_vector(oracle.prepare(d_alt).gram(), oracle.prepare(d_alt).moment())
    sigma_s, sigma_b = oracle.noise_stds(eps, delta)
    whiten = torch.cat([torch.full((3,), 1.0 / sigma_s), torch.full((2,), 1.0 / sigma_b)]).double()
    direction = (v1 - v0) * whiten ** 2          # LLR of N(v0, W^-2) vs N(v1, W^-2) is linear in v . direction
    seen = []

    def observe(call):
        seen.clear()
        with tap("dppo.oracles.ssp", "psd_ridge_solve", lambda args, out: seen.append(args[:2])):
            call()
        return (ssp_vector(*seen[0]) @ direction).numpy()

    null, alt, claim = _run(oracle, d_null, d_alt, eps, delta, trials, seed, observe)
    return conclude("ssp", "make_oracle('ssp')._solve_private(prepare(D)) (S~, b~ read at psd_ridge_solve)", claim, null, alt, started)


def audit_dp_gd(eps: float, delta: float = 1e-5, trials: int = 20_000, *, seed: int = 0, steps: int = 20,
                oracle=None) -> MechanismAudit:
    """Noisy projected GD oracle with k = ``steps`` composed releases, clip 1, radius 0.5."""
    from dppo.oracles import make_oracle

    started = time.perf_counter()
    oracle = oracle or make_oracle("dp_gd", steps=steps, clip=1.0, radius=0.5)
    others = [(torch.tensor([[0.0, 1.0]]), y[None]) for y in torch.linspace(-1, 1, 3, dtype=torch.float64)]
    d_null = [(torch.tensor([[1.0, 0.0]]), torch.tensor([1.0]))] + others
    d_alt = [(torch.tensor([[1.0, 0.0]]), torch.tensor([-1.0]))] + others
    m, seen = len(d_null), []

    def observe(call):
        seen.clear()
        with tap("dppo.oracles.dp_gd", "project_ball", lambda args, out: seen.append((args[0], out))):
            call()
        w_prev, total = torch.zeros(2, dtype=torch.float64), 0.0
        for pre, out in seen:  # pre = w - lr (sum_i clip(g_i) + noise + 2 ridge w) / m, one row per trial
            total = total + ((w_prev - pre) * m / oracle.lr - 2.0 * oracle.ridge * w_prev)[..., 0]
            w_prev = out
        return total.numpy()

    null, alt, claim = _run(oracle, d_null, d_alt, eps, delta, trials, seed, observe)
    return conclude("dp_gd", f"make_oracle('dp_gd', steps={oracle.steps})._solve_private(prepare(D)) (each step's noisy sum "
                    "read at project_ball)", claim, null, alt, started)


def audit_exp_mech(eps: float, delta: float = 0.0, trials: int = 100_000, *, seed: int = 0,
                   others: int | None = None) -> MechanismAudit:
    """Exponential-mechanism oracle on the grid cover {-1, +1}; the score is the released w itself."""
    from dppo.oracles import make_oracle

    started = time.perf_counter()
    oracle = make_oracle("exp_mech", cover="grid", grid_points=2, w_max=1.0)
    k = max(1, round(6.0 / eps)) if others is None else others
    rest = [(torch.tensor([[1.0]]), torch.tensor([-1.0]))] * k
    d_null = [(torch.tensor([[1.0]]), torch.tensor([1.0]))] + rest
    d_alt = [(torch.tensor([[1.0]]), torch.tensor([-1.0]))] + rest
    null, alt, claim = _run(oracle, d_null, d_alt, eps, delta, trials, seed, lambda call: call()[..., 0].numpy())
    return conclude("exp_mech", "make_oracle('exp_mech', cover='grid')._solve_private(prepare(D))", claim, null, alt, started)
