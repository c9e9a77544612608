"""The fused path: the clipped sum of per-user gradients without the (m, d) matrix of per-user gradients.

DP-PG and DP-PPO release S = sum_u c_u g_u + noise, with g_u user u's gradient and c_u = min(1, C / ||g_u||) its
clipping factor (``dppo.privacy.release.clip_scale``). ``per_user_gradients`` materialises every g_u (an (m, d)
matrix: 1024 x 132,096 floats for the linear layers of the tiny LM) and the release then reads it several
times; here only the norms and the clipped sum are formed, from the same one forward and one backward to the
layers' outputs (``capture``: captured inputs x_r and errors e_r of every trainable module, grouped by user,
``Groups``):

* the norms, ||g_u||^2 = sum over parameters of the squared norm of that parameter's part of g_u, per
  ``nn.Linear`` layer by the cheaper of (chosen per layer and bucket of users, by flops)
    blocks: the layer's per-user gradient sum_{r in u} e_r^T x_r for a few users at a time, in a small
            buffer that stays in cache (cost R d_in d_out per user, R = the user's rows), or
    ghost:  ||sum_{r in u} e_r^T x_r||_F^2 = <E_u E_u^T, X_u X_u^T> from the user's rows' Gram matrices
            (cost R^2 (d_in + d_out), computed in float64 against cancellation: counted twice),
  and for every other module (embeddings, norms, the ``torch.func`` fallback, parameters of the root) its
  rule's per-user gradients, which are small;
* the factors c_u = scale(||g_u||) (the caller's function: ``Release.clip_scale``), user by user;
* the clipped sum: for block layers the buffer's rows weighted by c_u (the very vectors whose norms were
  measured), for ghost layers one weighted product per layer, sum_u c_u sum_{r in u} e_r^T x_r =
  (diag(c_{u(r)}) E)^T X (the batch weight gradient's flops), for the other modules their rows weighted.

Equal to clipping the rows of ``per_user_gradients`` and summing them, to float32 rounding (the ghost
layers' sum is taken by a different product than the blocks of the materialised path; the factor's margin,
``dppo.privacy.release.FUSED_MARGIN``, covers that rounding). Every quantity of user u (its norm, its
factor) depends on u's rows only (``Groups``: per-user blocks); the clipped sum mixes users only in the sum.
What the fused path cannot handle (a captured tensor modified in place, a Linear called with a keyword
input) falls back to the materialised per-user gradients, clipped with the same factors.
"""
from __future__ import annotations

import torch

from dppo.policies.base import MIN_ROWS
from dppo.policies.per_user_grads.capture import capture
from dppo.policies.per_user_grads.layout import (PAD_MULTIPLE, Groups, Unsupported, by_length_class, flat_rows,
                                                 user_groups)
from dppo.policies.per_user_grads.materialised import per_user_gradients
from dppo.policies.per_user_grads.plan import plan_for
from dppo.policies.per_user_grads.rules import linear_rule, module_gradients, root_gradients, rule_for

NORM_METHODS = ("auto", "blocks", "ghost")
# elements (float32) of the per-user gradient buffer of the block layers: a few users at a time, in cache
BUFFER_ELEMENTS = 1 << 21


def clipped_gradient_sum(module, inputs: tuple, weights, scale, user_index: torch.Tensor | None = None, *,
                         objective=None, num_users: int | None = None, pad_multiple: int = PAD_MULTIPLE,
                         min_rows: int = MIN_ROWS, chunk: int | None = None,
                         norms: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_u scale(||g_u||)_u g_u, ||g_u||) with g_u the rows of ``per_user_gradients`` (same arguments).

    Args:
        module, inputs, weights, user_index, objective, num_users, pad_multiple, min_rows, chunk: as
            ``dppo.policies.per_user_grads.per_user_gradients``.
        scale: ``scale(norms) -> factors``, (k,) float64 -> (k,) float64, elementwise (a user's factor a
            function of its own norm: it is called on a few users at a time), e.g. ``clip_scale``.
        norms: ``auto`` (per layer, the cheaper of ``blocks`` and ``ghost``), or one of them everywhere.

    Returns:
        ``(P,)`` float64 clipped sum over the trainable parameters (``named_parameters`` order) and
        ``(m,)`` float64 per-user gradient norms (0 for a user without rows).
    """
    if norms not in NORM_METHODS:
        raise ValueError(f"norms must be one of {NORM_METHODS}, got '{norms}'")
    inputs = tuple(inputs)
    padded = user_index is None
    if padded and chunk is not None and weights.shape[0] > chunk:
        parts = [clipped_gradient_sum(module, tuple(t[lo:lo + chunk] for t in inputs), weights[lo:lo + chunk],
                                      scale, objective=objective, pad_multiple=pad_multiple, min_rows=min_rows,
                                      norms=norms)
                 for lo in range(0, weights.shape[0], chunk)]
        return sum(p[0] for p in parts[1:]) + parts[0][0], torch.cat([p[1] for p in parts])
    plan = plan_for(module)
    flat_inputs, flat_w, m, T = flat_rows(inputs, weights, user_index, num_users)
    keep = flat_w != 0
    if not bool(keep.any()):
        return torch.zeros(plan.P, dtype=torch.float64), torch.zeros(m, dtype=torch.float64)
    relabel = None
    if pad_multiple == 1:   # many runs of equal lengths: users laid out by length class (``by_length_class``)
        rows_user = user_index if T is None else torch.arange(m).repeat_interleave(T)
        relabel = by_length_class(rows_user, keep, m)
    if relabel is not None:
        groups = Groups(relabel[0], m, 1, keep, min_rows=min_rows, length_classes=True)
    else:
        groups = user_groups(user_index, m, T, keep, pad_multiple, min_rows)
    # a parameter of two modules (tied weights): its two parts' norms do not add (the cross term), so the
    # per-layer norms would not be ||g_u||: such a policy takes the materialised path
    if groups.buckets and not plan.has_shared_parameter():
        try:
            total, n = _fused(module, objective, plan, tuple(groups.layout(t) for t in flat_inputs),
                              groups.layout_weights(flat_w.to(plan.dtype)), groups, scale, norms)
            return total, (n if relabel is None else n[relabel[1]])
        except Unsupported:
            pass
    g = per_user_gradients(module, inputs, weights, None if padded else user_index, objective=objective,
                           num_users=num_users, pad_multiple=pad_multiple, min_rows=min_rows).double()
    n = torch.linalg.vector_norm(g, dim=1)
    return g.T @ scale(n).double(), n


class _Layer:
    """One ``nn.Linear``: its calls' (input, error) pairs in slot layout and its output columns."""

    def __init__(self, w_cols, b_cols):
        self.w_cols, self.b_cols, self.calls = w_cols, b_cols, []

    def add(self, x, g):
        d_in = x.shape[-1] if x is not None else None
        self.calls.append((None if x is None else x.contiguous().reshape(x.shape[0], -1, d_in),
                           g.contiguous().reshape(g.shape[0], -1, g.shape[-1])))

    @property
    def shape(self):
        x, g = self.calls[0]
        return g.shape[-1], (None if x is None else x.shape[-1])

    def ghost(self, L: int, norms: str) -> bool:
        """Norms from the Gram matrices for a bucket of L slots per user (the cheaper one under ``auto``)."""
        d_out, d_in = self.shape
        if d_in is None or norms == "blocks":
            return False
        if norms == "ghost":
            return True
        R = L * sum(x.shape[1] for x, _ in self.calls)  # rows per user
        return 2 * R * (d_in + d_out) < d_in * d_out  # float64 Gram products counted twice

    def rows(self, groups: Groups, s0: int, n: int, L: int):
        """(X (n, R, d_in) or None, E (n, R, d_out)): the rows of n users from slot s0 on, every call's side
        by side (a layer called on a prompt and then on its completions sees both in one product; joined a
        few users at a time, while they are in cache)."""
        xs = [None if x is None else groups.block(x, s0, n, L).reshape(n, -1, x.shape[-1]) for x, _ in self.calls]
        es = [groups.block(g, s0, n, L).reshape(n, -1, g.shape[-1]) for _, g in self.calls]
        if len(es) == 1:
            return xs[0], es[0]
        return (None if xs[0] is None else torch.cat(xs, 1)), torch.cat(es, 1)


class _IndexLayer:
    """One ``IndexLinear`` (``dppo.policies.observations``): a Linear fed column indices. User u's weight gradient
    is nonzero only in the columns its rows read: its entries are the sums of u's errors per (user, column) key,
    formed once for the whole batch by an index add (O(rows x out), never the (out, in) matrix per user); its
    squared norm is the sum of those entries' squares, and the clipped sum adds each entry, weighted by its
    user's factor, into its column. Each entry sums one user's rows in their order: it depends on that user
    alone."""

    def __init__(self, module, w_cols, b_cols):
        self.module, self.w_cols, self.b_cols, self.calls = module, w_cols, b_cols, []

    def add(self, x, g):
        self.calls.append((self.module.columns(x.reshape(x.shape[0], -1)), g.reshape(g.shape[0], -1)))

    def squared_norms(self, groups: Groups) -> torch.Tensor:
        """(users,) float64 squared norms of the layer's per-user gradients (keeps the entries for ``add_sum``)."""
        m, D, out_f = groups.num_users, self.module.in_features, self.module.out_features
        su = groups.slot_user
        sq = torch.zeros(m + 1, dtype=torch.float64)
        self.bias = None
        if self.w_cols is not None:
            key = torch.cat([(su[:, None] * (D + 1) + c).reshape(-1) for c, _ in self.calls])
            rows = torch.cat([g[:, None, :].expand(-1, c.shape[1], -1).reshape(-1, out_f) for c, g in self.calls])
            uniq, inv = torch.unique(key, return_inverse=True)
            self.entries = torch.zeros(len(uniq), out_f, dtype=torch.float64).index_add_(0, inv, rows.double())
            self.user, self.col = uniq // (D + 1), uniq % (D + 1)
            self.entries[self.col == D] = 0.0   # invalid indices read nothing
            sq.index_add_(0, self.user, self.entries.square().sum(1))
        if self.b_cols is not None:
            self.bias = torch.zeros(m + 1, out_f, dtype=torch.float64)
            for _, g in self.calls:
                self.bias.index_add_(0, su, g.double())
            sq += self.bias.square().sum(1)
        return sq[:m]

    def add_sum(self, total: torch.Tensor, factor: torch.Tensor) -> None:
        """total[columns] += sum_u factor_u g_u (the phantom user's factor 0)."""
        f = torch.cat([factor, factor.new_zeros(1)])
        D = self.module.in_features
        if self.w_cols is not None:
            W = torch.zeros(D + 1, self.module.out_features, dtype=torch.float64)
            W.index_add_(0, self.col, self.entries * f[self.user][:, None])
            lo, hi = self.w_cols
            total[lo:hi] += W[:D].T.reshape(-1)
        if self.bias is not None:
            lo, hi = self.b_cols
            total[lo:hi] += f @ self.bias


def _fused(module, objective, plan, inputs: tuple, weights, groups: Groups, scale, norms: str):
    records, err_of = capture(module, objective, plan.hooked, inputs, weights, groups.num_slots)
    layers: dict = {}
    indexed: dict = {}
    other: dict = {}  # parameter -> (m, numel) per-user gradients of the modules handled by their rules
    with torch.no_grad():
        for mod, args, kwargs, out, _, _ in records:
            g = err_of.get(id(out))
            if g is None:
                continue
            _, names = plan.owner[mod]
            if getattr(mod, "indexed_input", False) and args:
                if mod not in indexed:
                    indexed[mod] = _IndexLayer(mod, *(plan.columns[id(getattr(mod, n))] if n in names else None
                                                      for n in ("weight", "bias")))
                indexed[mod].add(args[0], g)
                continue
            if rule_for(mod) is linear_rule and args:
                if mod not in layers:
                    layers[mod] = _Layer(*(plan.columns[id(getattr(mod, n))] if n in names else None
                                           for n in ("weight", "bias")))
                layers[mod].add(args[0] if "weight" in names else None, g)
                continue
            for n, v in module_gradients(mod, names, args, kwargs, out, g, groups).items():
                _add_rows(other, getattr(mod, n), v, groups)
        if module in plan.owner:  # parameters used directly by the module: vmap over users for those only
            for p, v in root_gradients(module, objective, plan.owner[module][1], inputs, weights, groups).items():
                _add_rows(other, p, v, groups)
        return _norms_and_sum(plan, layers, other, groups, scale, norms, list(indexed.values()))


def _add_rows(other: dict, param, v, groups: Groups) -> None:
    """other[param] (m, numel) += a rule's per-user gradients of ``param`` ((m, ...) or ``BucketParts``)."""
    if param not in other:
        other[param] = torch.zeros(groups.num_users, param.numel(), dtype=param.dtype)
    groups.add_into(other[param], v)


def _norms_and_sum(plan, layers: dict, other: dict, groups: Groups, scale, norms: str, indexed=()):
    """The norms, the factors and the clipped sum from the captured layers (module docstring)."""
    m = groups.num_users
    total = torch.zeros(plan.P, dtype=torch.float64)
    sq = torch.zeros(m, dtype=torch.float64)
    for rows in other.values():  # small per-user gradients: their squared norms first
        sq += torch.linalg.vector_norm(rows, dim=1, dtype=torch.float64) ** 2
    for lay in indexed:   # layers fed indices: their sparse per-user gradients' norms, for every user at once
        sq += lay.squared_norms(groups)
    factor = torch.zeros(m, dtype=torch.float64)
    for s0, users, L in groups.buckets:
        n, u0 = len(users), users.start
        ghost = [lay for lay in layers.values() if lay.ghost(L, norms)]
        blocks = [lay for lay in layers.values() if lay.w_cols is not None and lay not in ghost]
        biased = [lay for lay in layers.values() if lay.b_cols is not None]
        width = sum(lay.shape[0] * lay.shape[1] for lay in blocks) + sum(lay.shape[0] for lay in biased)
        step = max(1, min(n, BUFFER_ELEMENTS // max(width, 1)))
        # per layer, a contiguous (users, out, in) buffer, (users, in, out) when in < out (the faster
        # orientation of the product: the wider factor last), and its clipped sum over the bucket's users
        W = {lay: torch.empty(step, *(lay.shape[::-1] if lay.shape[1] < lay.shape[0] else lay.shape),
                              dtype=plan.dtype) for lay in blocks}
        Wsum = {lay: torch.zeros(W[lay].shape[1:], dtype=torch.float64) for lay in blocks}
        Bsum = {lay: torch.zeros(lay.shape[0], dtype=torch.float64) for lay in biased}
        for i in range(0, n, step):
            k = min(step, n - i)
            s, us = groups.user_start(s0, i, L), slice(u0 + i, u0 + i + k)
            sq_k = sq[us].clone()
            parts = []
            for lay in layers.values():
                in_w, in_b, in_g = lay in W, lay in Bsum, lay in ghost
                if not (in_w or in_b or in_g):
                    continue
                X, E = lay.rows(groups, s, k, L)  # every call's rows of these k users
                if in_w:
                    wide_last = lay.shape[1] < lay.shape[0]
                    torch.bmm(*((X.transpose(1, 2), E) if wide_last else (E.transpose(1, 2), X)), out=W[lay][:k])
                    parts.append((Wsum[lay], W[lay][:k].reshape(k, -1)))
                if in_b:
                    parts.append((Bsum[lay], E.sum(1)))
                if in_g:
                    X, E = X.double(), E.double()
                    sq_k += (torch.bmm(X, X.transpose(1, 2)) * torch.bmm(E, E.transpose(1, 2))).sum((1, 2))
            for _, rows in parts:  # squared norms (float32 pairwise sums: ~1e-7 relative)
                sq_k += rows.square().sum(1).double()
            norm_k = sq_k.clamp_min(0).sqrt()
            c = scale(norm_k).double()
            sq[us], factor[us] = norm_k ** 2, c
            for acc, rows in parts:
                acc += (c.to(rows.dtype) @ rows).double().view(acc.shape)
        for lay in blocks:  # the buckets' clipped sums into the output's columns
            lo, hi = lay.w_cols
            total[lo:hi] += (Wsum[lay].T if lay.shape[1] < lay.shape[0] else Wsum[lay]).reshape(-1)
        for lay in biased:
            lo, hi = lay.b_cols
            total[lo:hi] += Bsum[lay]
        for lay in ghost:  # (diag(c) E)^T X per layer, the bucket's users at once
            c = factor[u0:u0 + n]
            lo, hi = lay.w_cols
            for x, g in lay.calls:
                X = groups.block(x, s0, n, L).reshape(-1, x.shape[-1])
                E = (groups.block(g, s0, n, L).reshape(n, -1, g.shape[-1]) * c.to(g.dtype)[:, None, None])
                total[lo:hi] += (E.reshape(-1, g.shape[-1]).T @ X).double().reshape(-1)
    for p, rows in other.items():
        lo, hi = plan.columns[id(p)]
        total[lo:hi] += (factor.to(rows.dtype) @ rows).double()
    for lay in indexed:
        lay.add_sum(total, factor)
    return total, sq.sqrt()
