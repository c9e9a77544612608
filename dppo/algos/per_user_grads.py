"""Per-user gradients of a policy-gradient objective from ONE backward pass (per-layer rules).

User u's objective is L_u = sum_{r in u} w_r log pi(a_r | s_r) over its rows r (its steps, or the steps of
all its G rollouts: one privacy unit, contract C5). Rows do not interact in a policy's forward pass (no
batch statistics), so the error backpropagated to any layer output in row r of the summed objective
L = sum_u L_u equals the one of L_u alone. For a layer whose parameter gradient is a product of its
input and that error, the per-user gradient follows from the activations and errors of one backward
of L, grouped by user (the book-keeping / Opacus grad-sample idea, summed per user instead of per row):

    Linear     y = x W^T + b:             dL_u/dW = sum_{r in u} g_r^T x_r,   dL_u/db = sum_{r in u} g_r
    Embedding  y = E[i]:                  dL_u/dE[v] = sum_{r in u, t: i_rt = v} g_rt
    LayerNorm  y = xhat * gamma + beta:   dL_u/dgamma = sum_{r in u} g_r * xhat_r,   dL_u/dbeta = sum g_r
    RMSNorm    y = xhat * gamma:          dL_u/dgamma = sum_{r in u} g_r * xhat_r

(g_r = dL/dy_r; sums run over the row's inner positions too, e.g. tokens). LoRA adapters (peft's
``lora.Linear``) are two ``nn.Linear`` modules around a frozen base layer, so the Linear rule covers
them. A module with trainable parameters of its own and no rule falls back, for that module only, to
``torch.func``: a vmap over users of the vector-Jacobian product of that module alone at the captured
inputs and errors; parameters owned by the policy module itself (e.g. the log-linear policy's theta, a
Gaussian head's log-std) use a vmap over users of the whole objective restricted to those parameters.
``method="func"`` computes everything with the original vmap over users (the reference).

Only parameters with ``requires_grad`` get gradients; rows are their concatenation in
``named_parameters()`` order. Assumption (as in Opacus): a parameter is used only inside the forward of
the module that owns it; a module output or input modified in place after the forward is detected and
the whole computation then falls back to ``method="func"``.
"""
from __future__ import annotations

import weakref
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dppo.policies.base import MIN_ROWS

METHODS = ("hooks", "func")

# module type (or class name, for classes of optional packages) ->
#   rule(module, inputs, output, grad_output, groups, names) -> {param name: (users + 1, *shape)}
RULES: dict[type | str, Callable] = {}


def register_rule(*types: type | str):
    """Register a per-user gradient rule for the given module types or class names (decorator)."""
    def deco(fn):
        for t in types:
            RULES[t] = fn
        return fn
    return deco


class Unsupported(Exception):
    """A module the hook path cannot handle (in-place edit of a captured tensor, non-tensor output...)."""


PAD_MULTIPLE = 1  # a user's rows are padded to a multiple of this (1: none; larger: fewer distinct lengths)


class Groups:
    """The layout of one forward pass, chosen so that a user's result depends on that user alone.

    Each user's rows, in their order, are padded with zero-weight copies of the user's first row to a
    multiple ``L_u`` of ``pad_multiple``; users follow in id order, and runs of consecutive users with
    equal ``L_u`` form buckets. A per-user sum of row products is one batched matmul per bucket with
    inner length ``L_u``, a per-user sum a reduction over the bucket's (L_u, ...) blocks: every float
    operation a user's result sees depends only on that user's own rows, never on which other users
    share the batch or how much data they have (so a user's gradient is bit-identical whichever process
    or batch computes it; CPU kernels are invariant to the batch count at fixed shapes, checked in
    tests/algos/test_per_user_grads.py). A phantom user ``num_users`` (never summed) pads tiny batches
    to ``MIN_ROWS`` rows.
    """

    def __init__(self, user: torch.Tensor, num_users: int, pad_multiple: int = PAD_MULTIPLE,
                 keep: torch.Tensor | None = None):
        user = np.asarray(user, dtype=np.int64)  # index book-keeping in numpy: cheaper on small arrays
        n_all = len(user)
        rows = np.arange(n_all) if keep is None else np.flatnonzero(np.asarray(keep))  # rows that take part
        user = user[rows]
        m, B, N = int(num_users), int(pad_multiple), len(user)
        counts = np.bincount(user, minlength=m)[:m] if N else np.zeros(m, dtype=np.int64)
        lens = (counts + B - 1) // B * B
        phantom = max(0, -(-(MIN_ROWS - int(lens.sum())) // B) * B)
        counts, lens = np.append(counts, 0), np.append(lens, phantom)
        ends = np.cumsum(lens)  # users laid out in id order (the phantom last)
        start = ends - lens
        self.num_users, self.num_slots = m, int(ends[-1])
        is_sorted = N < 2 or bool(np.all(user[1:] >= user[:-1]))
        rorder = np.arange(N) if is_sorted else np.argsort(user, kind="stable")
        cstart = np.cumsum(counts) - counts
        pos = np.empty_like(user)
        pos[rorder] = np.arange(N) - cstart[user[rorder]]
        slot_of_row = start[user] + pos
        slot_user = np.searchsorted(ends, np.arange(self.num_slots), side="right")
        # rows already in slot order (sorted by user, nothing padded or left out): no gather needed
        self.identity = is_sorted and self.num_slots == n_all == N
        first_row = np.zeros(m + 1, dtype=np.int64)
        has = counts > 0
        first_row[has] = rorder[cstart[has]]
        src = first_row[slot_user]  # padding slots repeat their user's first row ...
        src[slot_of_row] = np.arange(N)
        weight_src = np.full(self.num_slots, n_all, dtype=np.int64)  # ... with weight 0
        weight_src[slot_of_row] = rows
        src = rows[src] if N else np.zeros(self.num_slots, dtype=np.int64)
        self.slot_user, self.src, self.weight_src = (torch.from_numpy(a) for a in (slot_user, src, weight_src))
        self.buckets = []  # runs of consecutive users with equal padded length: (first slot, users, length)
        active = np.flatnonzero(lens[:m])  # the phantom user's slots are computed but never summed
        if len(active):
            change = np.flatnonzero(np.diff(lens[active])) + 1
            for lo, hi in zip(np.r_[0, change], np.r_[change, len(active)]):
                users = active[lo:hi]
                self.buckets.append((int(start[users[0]]), torch.from_numpy(users.copy()), int(lens[users[0]])))

    def layout(self, t: torch.Tensor) -> torch.Tensor:
        """Rows (N, ...) in slot layout (slots, ...)."""
        return t if self.identity else t[self.src]

    def layout_weights(self, w: torch.Tensor) -> torch.Tensor:
        """Row weights in slot layout, 0 on padding slots (and for rows left out)."""
        return w if self.identity else torch.cat([w, w.new_zeros(1)])[self.weight_src]

    def per_user(self, fn, *tensors) -> torch.Tensor:
        """(users, ...) from ``fn(*bucket views)``, each view (users of the bucket, L * ..., ...)."""
        out = None
        for s0, users, L in self.buckets:
            n = len(users)
            r = fn(*[t[s0:s0 + n * L].reshape(n, L, *t.shape[1:]) for t in tensors])
            if n == self.num_users:  # one bucket holds every user, in order
                return r
            if out is None:
                out = r.new_zeros((self.num_users,) + tuple(r.shape[1:]))
            out[users] = r
        return out

    def block_matmul(self, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per user: sum over its slots and inner positions of g^T x, for g (slots, *inner, out), x (slots, *inner, in)."""
        def mm(gb, xb):
            n = gb.shape[0]
            gb, xb = gb.reshape(n, -1, gb.shape[-1]), xb.reshape(n, -1, xb.shape[-1])
            if xb.shape[-1] < gb.shape[-1]:  # the faster orientation: the wider factor last
                return torch.bmm(xb.transpose(1, 2), gb).transpose(1, 2)
            return torch.bmm(gb.transpose(1, 2), xb)
        return self.per_user(mm, g, x)

    def sum(self, t: torch.Tensor, inner: int = 1) -> torch.Tensor:
        """Per-user sum over slots (and ``inner`` dims after the first) of (slots, *inner, ...) -> (users, ...)."""
        return self.per_user(lambda tb: tb.reshape(tb.shape[0], -1, *tb.shape[1 + inner:]).sum(1), t)


def pad_users(t: torch.Tensor, user: torch.Tensor, num_users: int) -> torch.Tensor:
    """Flat rows (N, ...) -> (users, max rows, ...), zero-padded (the layout of the vmap over users)."""
    user = user.long()
    counts = torch.bincount(user, minlength=num_users) if len(user) else torch.zeros(num_users, dtype=torch.long)
    L = max(1, int(counts.max())) if num_users else 1
    order = torch.sort(user, stable=True).indices
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.empty_like(user)
    pos[order] = torch.arange(len(user)) - starts[user[order]]
    out = t.new_zeros((num_users * L,) + tuple(t.shape[1:]))
    out[user * L + pos] = t
    return out.reshape(num_users, L, *t.shape[1:])


# ---- rules ------------------------------------------------------------------------------------------
@register_rule(nn.Linear)
def _linear(module, inputs, output, g, groups: Groups, names) -> dict:
    if not inputs:
        raise Unsupported("Linear called with keyword input")
    out = {}
    if "weight" in names:
        out["weight"] = groups.block_matmul(g, inputs[0])  # per user: sum_r g_r^T x_r
    if "bias" in names:
        out["bias"] = groups.sum(g, inner=g.dim() - 1)
    return out


@register_rule(nn.Embedding)
def _embedding(module, inputs, output, g, groups: Groups, names) -> dict:
    if module.scale_grad_by_freq or module.max_norm is not None:
        raise Unsupported("Embedding with scale_grad_by_freq/max_norm")
    idx = inputs[0]
    V, D = module.weight.shape
    flat = (groups.slot_user.reshape(-1, *([1] * (idx.dim() - 1))) * V + idx).reshape(-1)
    gf = g.reshape(-1, D)
    if module.padding_idx is not None:  # the padding row gets no gradient (nn.Embedding's semantics)
        gf = gf * (idx.reshape(-1) != module.padding_idx).to(gf.dtype)[:, None]
    w = gf.new_zeros((groups.num_users + 1) * V, D).index_add_(0, flat, gf)  # row block m: the phantom user
    return {"weight": w.reshape(groups.num_users + 1, V, D)[: groups.num_users]}


def _norm_rule(xhat, g, groups: Groups, names, shape) -> dict:
    out = {}
    inner = g.dim() - len(shape)  # the slot dim and the positions inside a row
    if "weight" in names:
        out["weight"] = groups.sum(g * xhat, inner=inner)
    if "bias" in names:
        out["bias"] = groups.sum(g, inner=inner)
    return out


@register_rule(nn.LayerNorm)
def _layer_norm(module, inputs, output, g, groups: Groups, names) -> dict:
    x = inputs[0]
    xhat = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
    return _norm_rule(xhat, g, groups, names, tuple(module.normalized_shape))


if hasattr(nn, "RMSNorm"):
    @register_rule(nn.RMSNorm)
    def _rms_norm(module, inputs, output, g, groups: Groups, names) -> dict:
        x = inputs[0]
        xhat = F.rms_norm(x, module.normalized_shape, None, module.eps)
        return _norm_rule(xhat, g, groups, names, tuple(module.normalized_shape))


@register_rule(*(name for name in ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")))
def _hf_rms_norm(module, inputs, output, g, groups: Groups, names) -> dict:
    """transformers' T5-style RMSNorm: y = weight * (x * rsqrt(mean(x^2) + eps)) computed in float32."""
    if not inputs or not hasattr(module, "variance_epsilon"):
        raise Unsupported(f"{type(module).__name__} without the expected signature")
    x = inputs[0]
    x32 = x.to(torch.float32)
    xhat = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)).to(x.dtype)
    return _norm_rule(xhat, g, groups, names, tuple(module.weight.shape))


# ---- the torch.func paths ---------------------------------------------------------------------------
def per_user_gradients_func(policy, obs, actions, weights) -> torch.Tensor:
    """Reference: row i = grad_theta sum_t weights[i, t] log pi(actions[i, t] | obs[i, t]), by a
    ``torch.func`` vmap over users of the whole objective (trainable parameters only)."""
    params = _trainable(policy)
    frozen = {k: v.detach() for k, v in policy.named_parameters() if k not in params}
    dtype = next(iter(params.values())).dtype

    def user_objective(p, o, a, w):
        return (functional_call(policy, {**frozen, **p}, (o, a)) * w).sum()

    detached = {k: v.detach() for k, v in params.items()}
    grads = vmap(grad(user_objective), in_dims=(None, 0, 0, 0))(detached, obs, actions, weights.to(dtype))
    return torch.cat([grads[k].detach().reshape(obs.shape[0], -1) for k in params], dim=1)


def _block_func(fn, params: dict, slot_args: list, groups: Groups) -> dict:
    """Per user: grad_params fn(params, *that user's padded slots), by a vmap over each bucket's users."""
    names = list(params)
    g = vmap(grad(fn), in_dims=(None,) + (0,) * len(slot_args))

    def flat(*views):
        d = g(params, *views)
        return torch.cat([d[k].reshape(views[0].shape[0], -1) for k in names], dim=1)

    out = groups.per_user(flat, *slot_args)
    sizes = [params[k].numel() for k in names]
    return {k: v.reshape(-1, *params[k].shape) for k, v in zip(names, out.split(sizes, dim=1))}


def _module_vjp(module, names, args, kwargs, g, groups: Groups) -> dict:
    """Fallback for one module without a rule: per bucket, a vmap over users of the VJP of that module
    alone, at its captured inputs and backpropagated errors."""
    R = g.shape[0]
    batched = [isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == R for a in args]
    if any(isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == R for v in kwargs.values()):
        raise Unsupported(f"{type(module).__name__}: batched keyword inputs")
    params = {n: p.detach() for n, p in module.named_parameters(recurse=False) if n in names}
    fixed = list(args)
    where = [i for i, b in enumerate(batched) if b]

    def objective(p, g_b, *block_args):
        full = list(fixed)
        for i, a in zip(where, block_args):
            full[i] = a
        return (functional_call(module, p, tuple(full), kwargs) * g_b).sum()

    return _block_func(objective, params, [g.detach()] + [args[i].detach() for i in where], groups)


class _Capture:
    """Forward hooks that record (module, inputs, output) of every module with trainable parameters."""

    def __init__(self, modules):
        self.records: list = []
        self.active = True
        self.handles = [m.register_forward_hook(self._hook, with_kwargs=True) for m in modules]

    def _hook(self, module, args, kwargs, output):
        if self.active:
            if not isinstance(output, torch.Tensor):
                raise Unsupported(f"{type(module).__name__} returns {type(output).__name__}, not a tensor")
            self.records.append((module, args, kwargs, output,
                                 [a._version if isinstance(a, torch.Tensor) else None for a in args], output._version))

    def remove(self):
        for h in self.handles:
            h.remove()


def per_user_gradients(policy, obs, actions, weights, user_index: torch.Tensor | None = None, *,
                       num_users: int | None = None, method: str = "hooks",
                       pad_multiple: int = PAD_MULTIPLE) -> torch.Tensor:
    """Per-user gradients of sum_{rows of u} w log pi(a | s) (flattened, trainable parameters only).

    Args:
        policy: a module whose ``forward(obs, actions)`` is the per-row ``log pi(a | s)``.
        obs, actions, weights: either padded per user, ``(m, T, ...)``, ``(m, T)``, ``(m, T)`` (row i =
            user i; padding carries weight 0), or flat rows ``(N, ...)``, ``(N,)``, ``(N,)`` with
            ``user_index``.
        user_index: ``(N,)`` user of each flat row (e.g. the steps of a user's G rollouts), in
            ``0..num_users-1`` (default ``max + 1``).
        method: ``hooks`` (one backward + per-layer rules, the default) or ``func`` (vmap over users).
        pad_multiple: a user's rows are padded to a multiple of it (zero-weight copies), e.g. the group
            size when rows are whole completions.

    Returns:
        ``(m, P)`` tensor (the parameters' dtype, detached), row u = user u's gradient (zeros for a user
        without rows). Zero-weight rows are skipped (they contribute nothing).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got '{method}'")
    if user_index is None:
        m, T = weights.shape[:2]
        user_index = torch.arange(m).repeat_interleave(T)
        obs, actions, weights = obs.reshape(m * T, *obs.shape[2:]), actions.reshape(m * T, *actions.shape[2:]), \
            weights.reshape(m * T)
    else:
        m = int(num_users) if num_users is not None else int(user_index.max()) + 1 if len(user_index) else 0
    keep = weights != 0  # zero-weight rows (padding) contribute nothing
    params = _trainable(policy)
    P = sum(p.numel() for p in params.values())
    dtype = next(iter(params.values())).dtype
    weights = weights.to(dtype)
    if not bool(keep.any()):
        return torch.zeros(m, P, dtype=dtype)
    if method == "func":
        return _func_over_users(policy, obs, actions, weights, user_index, keep, m)
    groups = Groups(user_index, m, pad_multiple, keep)
    try:
        grads = _hook_gradients(policy, params, groups.layout(obs), groups.layout(actions),
                                groups.layout_weights(weights), groups)
    except Unsupported:
        return _func_over_users(policy, obs, actions, weights, user_index, keep, m)
    return torch.cat([grads[k].detach().reshape(m, -1) for k in params], dim=1)


def _func_over_users(policy, obs, actions, weights, user_index, keep, m):
    idx = keep.nonzero().squeeze(1)
    return per_user_gradients_func(policy, *(pad_users(t[idx], user_index[idx], m) for t in (obs, actions, weights)))


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _plan(policy, params: dict) -> tuple[dict, list]:
    """{module: trainable direct parameter names} and the modules to hook (cached per policy)."""
    key = tuple((k, id(p)) for k, p in params.items())
    cached = _PLANS.get(policy)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    owner = {}
    for mod_name, mod in policy.named_modules():
        names = {n for n, p in mod.named_parameters(recurse=False) if p.requires_grad}
        if names:
            owner[mod] = (mod_name, names)
    hooked = [mod for mod in owner if mod is not policy]
    _PLANS[policy] = (key, owner, hooked)
    return owner, hooked


def _hook_gradients(policy, params: dict, obs, actions, weights, groups: Groups) -> dict:
    owner, hooked = _plan(policy, params)
    cap = _Capture(hooked)
    try:
        with torch.enable_grad():
            logp = policy(obs, actions)
        cap.active = False
        for mod, args, _, out, versions, out_version in cap.records:
            if out._version != out_version or any(v is not None and a._version != v for a, v in zip(args, versions)):
                raise Unsupported(f"{type(mod).__name__}: a captured tensor was modified in place")
        outputs = [rec[3] for rec in cap.records]
        needed = [o for o in outputs if o.requires_grad]
        errs = torch.autograd.grad((logp * weights).sum(), needed, allow_unused=True) if needed else []
        err_of = dict(zip([id(o) for o in needed], errs))
        by_param: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for mod, args, kwargs, out, _, _ in cap.records:
                g = err_of.get(id(out))
                if g is None:
                    continue
                mod_name, names = owner[mod]
                rule = RULES.get(type(mod)) or RULES.get(type(mod).__name__)
                contrib = rule(mod, args, out, g, groups, names) if rule is not None else None
                if contrib is None:
                    with torch.enable_grad():
                        contrib = _module_vjp(mod, names, args, kwargs, g, groups)
                for n, v in contrib.items():
                    key = id(getattr(mod, n))
                    by_param[key] = v if key not in by_param else by_param[key] + v
        if policy in owner:  # parameters used directly by the policy: vmap over users for those only
            _, names = owner[policy]
            direct = {n: getattr(policy, n) for n in names}
            for n, v in _root_func(policy, direct, obs, actions, weights, groups).items():
                key = id(direct[n])
                by_param[key] = v if key not in by_param else by_param[key] + v
    finally:
        cap.remove()
    return {k: by_param.get(id(p), torch.zeros((groups.num_users,) + tuple(p.shape), dtype=p.dtype))
            for k, p in params.items()}


def _root_func(policy, direct: dict, obs, actions, weights, groups: Groups) -> dict:
    """Parameters the policy module uses directly: per bucket, a vmap over users of the objective for those only."""
    detached = {n: p.detach() for n, p in direct.items()}

    def objective(p, o, a, w):
        return (functional_call(policy, p, (o, a)) * w).sum()

    return _block_func(objective, detached, [obs, actions, weights], groups)


def _trainable(policy) -> dict:
    return {k: p for k, p in policy.named_parameters() if p.requires_grad}
