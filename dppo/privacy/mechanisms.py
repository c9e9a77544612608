"""The mechanisms, in one place: each public function calibrates its noise (``dppo.privacy.calibration``),
records the release (``PrivacyContext.release``: ledger, accountant, journal) and draws the noise from the
context's ``NoiseSource``. Oracles and learners compute what is released (statistics, per-user gradients,
scores) and post-process the result; the audit (``dppo.audit``) drives these same functions.

* ``ssp_release``: sufficient-statistics perturbation (the ssp oracle): S + E with E symmetric, diagonal
  N(0, sigma_S^2) and off-diagonal N(0, sigma_S^2 / 2) (so ||E||_F is the Gaussian mechanism on the vector
  (diag S, sqrt2 offdiag S)), and sum_i clip(b_i) + N(0, sigma_b^2 I); with a public Gram matrix, the moment
  alone.
* ``exponential_mechanism``: sample argmax_k beta * score_k + Gumbel_k, an exact draw from
  P(k) ~ exp(beta score_k) (McSherry & Talwar 2007); shared by the exp_mech oracle and DP-GFA, recorded
  under one ledger name, ``exponential`` (eps-DP and eps-bounded-range: the zcdp accountant knows it).
* ``perturb_statistics``, ``noisy_clipped_sum``, ``clip_rows``: the noise-adding steps they are made of.
(The Gaussian sums of per-user vectors, DP-PG's, DP-PPO's and the dp_gd oracle's k steps, are the one release of
``dppo.privacy.composed``.)
A stacked noise source (the audit's) gives every draw a leading trial dimension, which each step
broadcasts over.
"""
from __future__ import annotations

import math
import torch

from dppo.privacy.calibration import analytic_gaussian_sigma, exp_mech_beta, ssp_calibration

EXPONENTIAL = "exponential"


def clip_rows(rows: torch.Tensor, bound: float) -> torch.Tensor:
    """Each row (one user's vector) scaled to l2 norm <= ``bound``."""
    return rows * torch.clamp(bound / rows.norm(dim=1).clamp_min(1e-300), max=1.0)[:, None]


def perturb_statistics(noise, S: torch.Tensor, b: torch.Tensor, sigma_s: float, sigma_b: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(S + E, b + e): E symmetric with N(0, sigma_s^2) diagonal and N(0, sigma_s^2 / 2) off-diagonal entries."""
    d = S.shape[-1]
    raw = noise.gaussian((d, d), sigma_s)  # (..., d, d) from a stacked source
    upper = torch.triu(raw, diagonal=1) / math.sqrt(2.0)
    S_noisy = S + torch.diag_embed(torch.diagonal(raw, dim1=-2, dim2=-1)) + upper + upper.mT
    return S_noisy, b + noise.gaussian((d,), sigma_b)


def noisy_clipped_sum(noise, per_user: torch.Tensor, clip: float, sigma: float) -> torch.Tensor:
    """sum_i clip_C(g_i) + N(0, sigma^2 I) over the user axis -2 of ``per_user`` (..., m, d)."""
    scale = torch.clamp(clip / per_user.norm(dim=-1).clamp_min(1e-300), max=1.0)
    return (per_user * scale[..., None]).sum(-2) + noise.gaussian((per_user.shape[-1],), sigma)


def ssp_release(privacy, S: torch.Tensor | None, b_users: torch.Tensor, *, round: int, eps: float, delta: float,
                gram_share: float, b_clip: float, public_gram: bool = False, **extra
                ) -> tuple[torch.Tensor | None, torch.Tensor, dict]:
    """One SSP release of a round's statistics (normalized units, rows ||x|| <= 1, |y| <= 1 enforced by the
    caller): S = sum_i (1/n_i) X_i^T X_i and the per-user moments ``b_users`` (m, d), each clipped here to
    ``b_clip``. With ``public_gram`` nothing is spent on S (it is not released: ``S`` may be None) and
    sigma_b = analytic(eps, delta, 2 b_clip); otherwise the joint calibration of ``ssp_calibration``.

    Returns (S~ or None, b~, the ledger entry).
    """
    users, dim = int(b_users.shape[0]), int(b_users.shape[-1])
    clipped = clip_rows(b_users, b_clip)
    if public_gram:
        sens = 2.0 * b_clip
        sigma_b = analytic_gaussian_sigma(eps, delta, sens)
        entry = privacy.release("ssp", round=round, users=users, eps=eps, delta=delta, sigma=sigma_b, sensitivity=sens,
                                noise_multiplier=sigma_b / sens, sigma_moment=sigma_b, sensitivity_moment=sens,
                                dim=dim, gram="public", adjacency="replace_one", **extra)
        return None, noisy_clipped_sum(privacy.noise, clipped, b_clip, sigma_b), entry
    cal = ssp_calibration(eps, delta, gram_share=gram_share, b_clip=b_clip)
    entry = privacy.release("ssp", round=round, users=users, eps=eps, delta=delta, sigma=cal.sigma_gram,
                            sensitivity=cal.sensitivity, noise_multiplier=cal.sigma_gram / cal.sensitivity,
                            sigma_moment=cal.sigma_moment, sensitivity_gram=cal.sensitivity_gram,
                            sensitivity_moment=cal.sensitivity_moment, joint_sensitivity_sq=cal.joint_sensitivity_sq,
                            dim=dim, adjacency="replace_one", **extra)
    S_noisy, b_noisy = perturb_statistics(privacy.noise, S, clipped.sum(0), cal.sigma_gram, cal.sigma_moment)
    return S_noisy, b_noisy, entry


def exponential_mechanism(privacy, scores: torch.Tensor, *, eps: float, sensitivity: float, round: int, users: int,
                          beta: float | None = None, **extra) -> tuple[torch.Tensor, dict]:
    """Record one exponential-mechanism release and draw its index (Gumbel-max over the last axis).

    ``beta`` defaults to ``exp_mech_beta(eps, sensitivity)`` = eps / (2 Delta), which makes it eps-DP; a
    schedule of composed releases passes its own (``calibration.ExponentialSchedule``).
    """
    beta = exp_mech_beta(eps, sensitivity) if beta is None else float(beta)
    entry = privacy.release(EXPONENTIAL, round=round, users=users, eps=eps, delta=0.0, beta=beta,
                            sensitivity=sensitivity, adjacency="replace_one", **extra)
    logits = beta * scores + privacy.noise.gumbel((scores.shape[-1],))  # (..., K) if stacked
    return torch.argmax(logits, dim=-1), entry
