"""The noise-adding steps of every mechanism, in one place: callers compute the sensitivity and the scale
(``dppo.privacy.calibration``), record the release (``PrivacyContext.release``) and call these to perturb.

* ``perturb_statistics``: sufficient-statistics perturbation (the ssp oracle): S + E with E symmetric,
  diagonal N(0, sigma_S^2) and off-diagonal N(0, sigma_S^2 / 2) (so ||E||_F is the Gaussian mechanism on
  the vector (diag S, sqrt2 offdiag S)), and b + N(0, sigma_b^2 I).
* ``noisy_clipped_sum``: one step of noisy gradient descent (the dp_gd oracle): sum_i clip_C(g_i) +
  N(0, s^2 I) (replace-one sensitivity 2C).
* ``exponential_mechanism``: sample argmax_k beta * score_k + Gumbel_k, an exact draw from
  P(k) ~ exp(beta score_k) (McSherry & Talwar 2007); shared by the exp_mech oracle and DP-GFA, recorded
  under one ledger name, ``exponential`` (eps-DP and eps-bounded-range: the zcdp accountant knows it).
(The Gaussian sum of per-user vectors, DP-PG's release, is ``dppo.privacy.clipping``.)
Every function draws through the context's ``NoiseSource``; a stacked source (the audit) gives a leading
trial dimension, which each function broadcasts over.
"""
from __future__ import annotations

import math

import torch

EXPONENTIAL = "exponential"


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


def exponential_mechanism(privacy, scores: torch.Tensor, *, beta: float, round: int, users: int, eps: float,
                          sensitivity: float, **extra) -> tuple[torch.Tensor, dict]:
    """Record one exponential-mechanism release and draw its index (Gumbel-max over the last axis)."""
    entry = privacy.release(EXPONENTIAL, round=round, users=users, eps=eps, delta=0.0, beta=beta,
                            sensitivity=sensitivity, adjacency="replace_one", **extra)
    logits = beta * scores + privacy.noise.gumbel((scores.shape[-1],))  # (..., K) if stacked
    return torch.argmax(logits, dim=-1), entry
