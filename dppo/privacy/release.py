"""Per-user clipping, shared by every release of clipped per-user sums, private or not: the clipped rows, the
clipped sum of rows or of row blocks, and the clipping factors of a clipped sum formed elsewhere (the fused path of
``dppo.policies.per_user_grads``). The release itself, the one class every learner releases through, is
``dppo.privacy.composed.ComposedGaussianSums``.
"""
from __future__ import annotations

import torch

# relative margin of the clipping factor when the clipped sum is formed by another product than the one the
# norm was measured on (``dppo.policies.per_user_grads``' fused path: a float32 weighted product per layer): it
# covers the float32 rounding between the two (about 1e-7 per row summed), so each user's summed contribution
# stays <= C
FUSED_MARGIN = 1e-5


def clip_scale(norms: torch.Tensor, max_norm: float, margin: float = 1e-9) -> torch.Tensor:
    """The clipping factors min(1, C (1 - margin) / ||g_u||) of per-user norms (float64; 1 for a zero norm)."""
    return (max_norm * (1 - margin) / norms.double().clamp_min(1e-300)).clamp(max=1.0)


def clip_per_user(per_user: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale each row (one user's flattened gradient) to l2 norm <= max_norm.

    Returns the clipped rows (float64) and the pre-clipping norms. Non-finite entries are zeroed (the
    contribution is then bounded too), and the scale carries a 1e-9 relative margin against rounding,
    so the bound holds for any input.
    """
    owned = per_user.dtype != torch.float64  # .double() then makes a copy, which may be scaled in place
    per_user = per_user.double()
    norms = torch.linalg.vector_norm(per_user, dim=1)
    if not bool(torch.isfinite(norms).all()):  # a non-finite entry makes its row's norm non-finite
        per_user, owned = torch.nan_to_num(per_user, nan=0.0, posinf=0.0, neginf=0.0), True
        norms = torch.linalg.vector_norm(per_user, dim=1)
    scale = clip_scale(norms, max_norm)
    return (per_user.mul_(scale[:, None]) if owned else per_user * scale[:, None]), norms


def clipped_total(per_user, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_u clip_C(g_u), the norms ||g_u||): of a (b, P) matrix, or of an iterable of (b_k, P) blocks, each
    clipped here as it comes, so a round's users never need to be in memory at once. A block is one user's rows
    or several: each row is clipped on its own, so a user's contribution is at most C either way."""
    if torch.is_tensor(per_user):
        clipped, norms = clip_per_user(per_user, clip)
        return clipped.sum(0), norms
    total, norms = None, []
    for block in per_user:
        clipped, n = clip_per_user(block, clip)
        total = clipped.sum(0) if total is None else total + clipped.sum(0)
        norms.append(n)
    if total is None:
        raise ValueError("clipped_total: no rows")
    return total, torch.cat(norms)


def clip_fraction(norms: torch.Tensor, clip: float) -> float:
    """The fraction of users whose norm exceeded the clip (a raw diagnostic, ``diag/clip_fraction``)."""
    return float((norms > clip).double().mean()) if len(norms) else 0.0
