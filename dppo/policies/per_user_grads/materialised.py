"""The materialised path: every user's gradient as a row of an (m, P) tensor (``per_user_gradients``).

User u's objective is L_u = sum_{r in u} w_r f(r) over its rows r (its steps, the steps of all its G rollouts,
or its prompt with G completions: one privacy unit, contract C5), for any per-row scalar f: a log-probability
log pi(a_r | s_r) (policy gradients, compatible features), a clipped surrogate plus a value loss (actor-critic),
a KL penalty to a reference model, ... From one capture (``capture``: one forward, one backward to the layer
outputs) each trainable module's per-user gradient comes from its rule (``rules``), written into its columns.

Cost: per layer one batched matmul per bucket of users with equal row counts (``Groups``: the flops of the
weight-gradient matmuls the backward skipped). When every trainable module is an ``nn.Linear`` used once (MLP
policies, LoRA adapters) the products run on strided views of the captured tensors into contiguous per-layer
blocks (``_linear_layers``); padded episodes whose kept rows are a prefix of each user's rows (the learners'
layout) are used in place, without gathering rows. A module output or input modified in place after the
forward is detected and the whole computation then falls back to ``method="func"``: a ``torch.func`` vmap over
users of the objective (``per_user_gradients_func``, also the reference the tests compare against).
"""
from __future__ import annotations

import torch
from torch.func import grad, vmap

from dppo.policies.base import MIN_ROWS
from dppo.policies.per_user_grads.capture import capture
from dppo.policies.per_user_grads.layout import PAD_MULTIPLE, Groups, Unsupported, flat_rows, pad_users, user_groups
from dppo.policies.per_user_grads.plan import Plan, plan_for
from dppo.policies.per_user_grads.rules import functional, linear_rule, module_gradients, root_gradients, rule_for

METHODS = ("hooks", "func")
# the fast Linear path builds per-layer blocks and concatenates them (a second copy of the output): above
# this many output elements (users x parameters) the general path writes into the output in place
FAST_PATH_MAX_ELEMENTS = 1 << 22


def per_user_gradients(module, inputs: tuple, weights, user_index: torch.Tensor | None = None, *,
                       objective=None, num_users: int | None = None, method: str = "hooks",
                       pad_multiple: int = PAD_MULTIPLE, min_rows: int = MIN_ROWS,
                       chunk: int | None = None) -> torch.Tensor:
    """Per-user gradients of sum_{rows r of u} w_r f(row r), f = ``objective`` (trainable parameters only).

    Args:
        module: the ``nn.Module`` whose trainable (``requires_grad``) parameters are differentiated.
        inputs: tensors whose leading axis (two axes, padded) is the row: either padded per user,
            ``(m, T, ...)`` each (row (i, t) belongs to user i; padding carries weight 0), or flat rows
            ``(N, ...)`` with ``user_index``.
        weights: ``(m, T)`` or ``(N,)`` row weights w_r.
        user_index: ``(N,)`` user of each flat row (e.g. the steps of a user's G rollouts), in
            ``0..num_users-1`` (default ``max + 1``).
        objective: ``objective(*rows) -> (R,)``, one value per row, each a function of its own row only
            (no batch statistics); default ``module(*rows)`` (a policy's ``forward`` is ``log pi(a | s)``).
            Any per-row scalar works: a weighted log-probability, a clipped surrogate plus a value loss, ...
        method: ``hooks`` (one backward + per-layer rules, the default) or ``func`` (vmap over users).
        pad_multiple: a user's rows are padded to a multiple of it (zero-weight copies).
        min_rows: forward passes run on at least this many rows (zero-weight copies): a row's result then
            never depends on how many rows share the batch (``dppo.policies.base.MIN_ROWS``).
        chunk: padded inputs only: at most this many users per forward pass (memory; results are the same).

    Returns:
        ``(m, P)`` tensor (the parameters' dtype, detached), row u = user u's gradient (zeros for a user
        without rows). Zero-weight rows are skipped (they contribute nothing).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got '{method}'")
    inputs = tuple(inputs)
    if user_index is None and chunk is not None and weights.shape[0] > chunk:
        return torch.cat([per_user_gradients(module, tuple(t[lo:lo + chunk] for t in inputs), weights[lo:lo + chunk],
                                             objective=objective, method=method, pad_multiple=pad_multiple,
                                             min_rows=min_rows)
                          for lo in range(0, weights.shape[0], chunk)])
    inputs, weights, m, T = flat_rows(inputs, weights, user_index, num_users)
    keep = weights != 0  # zero-weight rows (padding) contribute nothing
    plan = plan_for(module)
    weights = weights.to(plan.dtype)
    fast_layout = T is not None and method == "hooks" and pad_multiple == 1  # Groups finds the empty case itself
    if not fast_layout and not bool(keep.any()):
        return torch.zeros(m, plan.P, dtype=plan.dtype)
    if method == "hooks":
        groups = user_groups(user_index, m, T, keep, pad_multiple, min_rows)
        if not groups.buckets:  # no row with a non-zero weight
            return torch.zeros(m, plan.P, dtype=plan.dtype)
        try:
            return _hook_gradients(module, objective, plan, tuple(groups.layout(t) for t in inputs),
                                   groups.layout_weights(weights), groups)
        except Unsupported:
            pass
    if T is not None:
        user_index = torch.arange(m).repeat_interleave(T)
    return _func_over_users(module, objective, inputs, weights, user_index, keep, m)


def per_user_gradients_func(module, inputs: tuple, weights, *, objective=None) -> torch.Tensor:
    """Reference: row i = grad_theta sum_t weights[i, t] objective(inputs[i, t]), by a ``torch.func`` vmap
    over users of the whole objective (trainable parameters only); inputs padded per user, (m, T, ...)."""
    params = plan_for(module).params
    frozen = {k: v.detach() for k, v in module.named_parameters() if k not in params}
    dtype = next(iter(params.values())).dtype

    def user_objective(p, w, *args):
        return (functional(module, objective, {**frozen, **p}, args) * w).sum()

    detached = {k: v.detach() for k, v in params.items()}
    grads = vmap(grad(user_objective), in_dims=(None, 0) + (0,) * len(inputs))(detached, weights.to(dtype), *inputs)
    return torch.cat([grads[k].detach().reshape(weights.shape[0], -1) for k in params], dim=1)


def _func_over_users(module, objective, inputs, weights, user_index, keep, m):
    idx = keep.nonzero().squeeze(1)
    padded = [pad_users(t[idx], user_index[idx], m) for t in inputs]
    return per_user_gradients_func(module, tuple(padded), pad_users(weights[idx], user_index[idx], m),
                                   objective=objective)


def _hook_gradients(module, objective, plan: Plan, inputs: tuple, weights, groups: Groups) -> torch.Tensor:
    """(users, P): every trainable parameter's per-user gradient, added into its columns."""
    m = groups.num_users
    records, err_of = capture(module, objective, plan.hooked, inputs, weights, groups.num_slots)
    errs = [err_of.get(id(rec.output)) for rec in records if rec.output.requires_grad]
    each_layer_once = len(errs) == len(records) == len(plan.linear or ()) == len({id(r.module) for r in records})
    if plan.linear is not None and each_layer_once and all(r.args for r in records) and \
            all(e is not None for e in errs) and m * plan.P <= FAST_PATH_MAX_ELEMENTS:
        return _linear_layers(plan, records, errs, groups)
    flat = torch.zeros(m, plan.P, dtype=plan.dtype)
    columns, owner = plan.columns, plan.owner
    written: set = set()  # ids of the parameters whose columns hold a contribution already
    with torch.no_grad():
        for mod, args, kwargs, out, _, _ in records:
            g = err_of.get(id(out))
            if g is None:
                continue
            _, names = owner[mod]
            if rule_for(mod) is linear_rule and args and id(mod.weight) not in written and \
                    (mod.bias is None or id(mod.bias) not in written):  # first use: write in place
                cols = {n: columns[id(getattr(mod, n))] for n in names}
                w_cols, b_cols = cols.get("weight"), cols.get("bias")
                groups.linear_into(g, args[0], None if w_cols is None else flat[:, w_cols[0]:w_cols[1]],
                                   None if b_cols is None else flat[:, b_cols[0]:b_cols[1]])
                written.update(id(getattr(mod, n)) for n in names)
                continue
            for n, v in module_gradients(mod, names, args, kwargs, out, g, groups).items():
                lo, hi = columns[id(getattr(mod, n))]
                groups.add_into(flat[:, lo:hi], v)
                written.add(id(getattr(mod, n)))
    if module in owner:  # parameters used directly by the module: vmap over users for those only
        with torch.no_grad():
            for p, v in root_gradients(module, objective, owner[module][1], inputs, weights, groups).items():
                lo, hi = columns[id(p)]
                groups.add_into(flat[:, lo:hi], v)
    return flat.detach()


def _linear_layers(plan: Plan, records: list, errs, groups: Groups) -> torch.Tensor:
    """The fast path: every recorded module is a distinct ``nn.Linear`` owning its columns. Per layer, one
    batched matmul and one sum per bucket of users, on strided views of the layer's captured input and
    error (one view op each), into a contiguous (users, out, in) block; the blocks are concatenated in
    parameter order at the end. The same products, on the same views, as ``Groups.linear_into``."""
    m = groups.num_users
    alloc = torch.empty if groups.covers_all else torch.zeros  # users without rows keep zero rows
    pieces = {}
    with torch.no_grad():
        for (mod, args, _, _, _, _), g in zip(records, errs):
            w_cols, b_cols = plan.linear[mod]
            d_out = g.shape[-1]
            g = g.contiguous()
            x = args[0].contiguous() if w_cols is not None else None
            d_in = x.shape[-1] if x is not None else None
            wide_last = d_in is not None and d_in < d_out  # the faster orientation: the wider factor last
            W = None if x is None else alloc((m, d_in, d_out) if wide_last else (m, d_out, d_in), dtype=g.dtype)
            B = None if b_cols is None else alloc((m, d_out), dtype=g.dtype)
            for s0, users, L in groups.buckets:
                n, u0 = len(users), users.start
                gT = groups.rows_view(g, s0, n, L, transpose=True)  # (n, out, rows)
                if x is not None:
                    if wide_last:
                        torch.bmm(groups.rows_view(x, s0, n, L, transpose=True), gT.transpose(1, 2),
                                  out=W[u0:u0 + n])
                    else:
                        torch.bmm(gT, groups.rows_view(x, s0, n, L), out=W[u0:u0 + n])
                if B is not None:
                    torch.sum(gT, 2, out=B[u0:u0 + n])
            if W is not None:
                pieces[w_cols] = (W.transpose(1, 2) if wide_last else W).reshape(m, -1)
            if B is not None:
                pieces[b_cols] = B
    parts = [pieces[c] for c in sorted(pieces)]
    return (torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]).to(plan.dtype)
