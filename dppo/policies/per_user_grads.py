"""The per-user-gradient engine: gradients of any per-row objective, grouped by user, from ONE backward pass.

User u's objective is L_u = sum_{r in u} w_r f(r) over its rows r (its steps, the steps of all its G rollouts,
or its prompt with G completions: one privacy unit, contract C5), for any per-row scalar f: a log-probability
log pi(a_r | s_r) (policy gradients, compatible features), a clipped surrogate plus a value loss (actor-critic),
a KL penalty to a reference model, ... Rows do not interact in the forward pass (no batch statistics), so the
error backpropagated to any layer output in row r of the summed objective L = sum_u L_u equals the one of L_u
alone. For a layer whose parameter gradient is a product of its input and that error, the per-user gradient
follows from the activations and errors of one backward of L, grouped by user (the book-keeping / Opacus
grad-sample idea, summed per user instead of per row):

    Linear     y = x W^T + b:             dL_u/dW = sum_{r in u} g_r^T x_r,   dL_u/db = sum_{r in u} g_r
    Embedding  y = E[i]:                  dL_u/dE[v] = sum_{r in u, t: i_rt = v} g_rt
    LayerNorm  y = xhat * gamma + beta:   dL_u/dgamma = sum_{r in u} g_r * xhat_r,   dL_u/dbeta = sum g_r
    RMSNorm    y = xhat * gamma:          dL_u/dgamma = sum_{r in u} g_r * xhat_r

(g_r = dL/dy_r; sums run over the row's inner positions too, e.g. tokens). A layer may see k rows per row of
the objective (a prompt's KV cache repeated for its G completions): its rows are then grouped k at a time,
slot-major. LoRA adapters (peft's ``lora.Linear``) are two ``nn.Linear`` modules around a frozen base layer,
so the Linear rule covers them. A module with trainable parameters of its own and no rule falls back, for
that module only, to ``torch.func``: a vmap over users of the vector-Jacobian product of that module alone at
the captured inputs and errors; parameters owned by the differentiated module itself (e.g. the log-linear
policy's theta, a Gaussian head's log-std) use a vmap over users of the whole objective restricted to those
parameters. ``method="func"`` computes everything with a vmap over users of the objective (the reference).

One engine for every parameter space of ``dppo.policies.spaces``: an MLP's head features come in closed
form, but all-parameter gradients of any policy and the adapter gradients of a language model come from here.

Cost: one forward with hooks on the parameter-owning modules (registered once per module and kept:
outside a capture they return at once), one ``torch.autograd.grad`` to the layer outputs only (the
engine then skips every parameter-gradient product of an ordinary backward), and per layer one batched
matmul per bucket of users with equal row counts (``Groups``: the flops of the weight-gradient matmuls
the backward skipped). When every trainable module is an ``nn.Linear`` used once (MLP policies, LoRA
adapters) the products run on strided views of the captured tensors into contiguous per-layer blocks
(``_linear_layers``); padded episodes whose kept rows are a prefix of each user's rows (the learners'
layout) are used in place, without gathering rows. What the computation needs to know about a policy
is cached (``_Plan``) and rebuilt when a parameter is added, replaced, frozen or unfrozen.

Only parameters with ``requires_grad`` get gradients; rows are their concatenation in
``named_parameters()`` order. Assumption (as in Opacus): a parameter is used only inside the forward of
the module that owns it; a module output or input modified in place after the forward is detected and
the whole computation then falls back to ``method="func"``.
"""
from __future__ import annotations

import threading
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


# the fast Linear path builds per-layer blocks and concatenates them (a second copy of the output): above
# this many output elements (users x parameters) the general path writes into the output in place
FAST_PATH_MAX_ELEMENTS = 1 << 22
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
    tests/policies/test_per_user_grads.py). A phantom user ``num_users`` (never summed) pads tiny batches
    to ``min_rows`` rows (default ``MIN_ROWS``).
    """

    def __init__(self, user: torch.Tensor, num_users: int, pad_multiple: int = PAD_MULTIPLE,
                 keep: torch.Tensor | None = None, sorted_users: bool = False, rows_per_user: int | None = None,
                 min_rows: int = MIN_ROWS):
        m, B = int(num_users), int(pad_multiple)
        self.num_users, self.min_rows = m, int(min_rows)
        self._slot_user = None
        self._stride = None  # set by _init_strided: users' slots are rows u * stride .. of the padded input
        if B == 1 and self._init_sorted(user, m, keep, sorted_users, rows_per_user):
            return
        user = np.asarray(user, dtype=np.int64)  # index book-keeping in numpy: cheaper on small arrays
        n_all = len(user)
        rows = np.arange(n_all) if keep is None else np.flatnonzero(np.asarray(keep))  # rows that take part
        user = user[rows]
        N = len(user)
        counts = np.bincount(user, minlength=m)[:m] if N else np.zeros(m, dtype=np.int64)
        lens = (counts + B - 1) // B * B
        phantom = max(0, -(-(self.min_rows - int(lens.sum())) // B) * B)
        counts, lens = np.append(counts, 0), np.append(lens, phantom)
        ends = np.cumsum(lens)  # users laid out in id order (the phantom last)
        start = ends - lens
        self.num_slots = int(ends[-1])
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
        self._slot_user, self.src, self.weight_src = (torch.from_numpy(a) for a in (slot_user, src, weight_src))
        self._set_buckets(lens[:m].tolist(), start.tolist())

    def _init_sorted(self, user, m: int, keep, known_sorted: bool, rows_per_user: int | None = None) -> bool:
        """The common layout without padding (``pad_multiple=1``), users' rows already in id order: slots
        are the kept rows themselves (plus phantom rows up to ``min_rows``), built with a few tensor ops.
        Returns False (nothing set) when the rows are not sorted by user."""
        n_all = m * rows_per_user if rows_per_user is not None else len(user)
        counts = None
        if rows_per_user is not None and keep is not None:  # padded users (m, T): rows u*T .. (u+1)*T-1
            kv = keep.view(m, rows_per_user)
            counts = kv.sum(1)
            lens = counts.tolist()
            if min(lens, default=rows_per_user) == rows_per_user:
                keep = None  # every row kept
            elif n_all >= self.min_rows and self._init_strided(keep, kv, counts, lens):
                return True
        elif keep is not None and bool(keep.all()):
            keep = None
        rows = None if keep is None else keep.nonzero().squeeze(1)
        if rows_per_user is not None:
            if keep is None:
                counts = torch.full((m,), rows_per_user, dtype=torch.long)
            N = n_all if rows is None else rows.shape[0]
        else:
            user = torch.as_tensor(user)
            kept_user = user if rows is None else user[rows]
            N = kept_user.shape[0]
            if not known_sorted and N > 1 and not bool((kept_user[1:] >= kept_user[:-1]).all()):
                return False
            counts = torch.bincount(kept_user, minlength=m)[:m] if N else torch.zeros(m, dtype=torch.long)
        phantom = max(0, self.min_rows - N)
        self.num_slots = N + phantom
        self.identity = rows is None and phantom == 0
        if not self.identity:
            base = torch.arange(n_all) if rows is None else rows
            first = base[:1] if N else torch.zeros(1, dtype=torch.long)
            self.src = torch.cat([base, first.expand(phantom)]) if phantom else base
            self.weight_src = torch.cat([base, torch.full((phantom,), n_all, dtype=torch.long)]) if phantom else base
        self._counts, self._phantom = counts, phantom
        lens = counts.tolist()
        start, acc = [], 0
        for n in lens:
            start.append(acc)
            acc += n
        self._set_buckets(lens, start)
        return True

    def _init_strided(self, keep, kv, counts, lens: list) -> bool:
        """Padded users (m, T) whose kept rows are a prefix of each user's T rows (the learners' padded
        episodes; ``kv`` = keep as (m, T), ``counts`` its row sums, ``lens`` as a list): the slots are the
        padded rows themselves, nothing is gathered, and a bucket's block is the strided view of its
        users' first L rows (user u's rows start at slot u * T). Returns False (nothing set) when some
        user's kept rows are not a prefix."""
        m, T = kv.shape
        if not torch.equal(kv, torch.arange(T) < counts[:, None]):
            return False
        self.num_slots, self.identity, self._stride, self._keep = m * T, True, T, keep
        self._counts, self._phantom = counts, 0
        self._set_buckets(lens, list(range(0, m * T, T)))
        return True

    def _block(self, t: torch.Tensor, s0: int, n: int, L: int) -> torch.Tensor:
        """The (n, L, ...) block of a bucket's n users, their L slots each, starting at slot s0."""
        if self._stride is None:
            return t.narrow(0, s0, n * L).reshape(n, L, *t.shape[1:])
        T = self._stride
        return t.narrow(0, s0, n * T).reshape(n, T, *t.shape[1:])[:, :L]

    def rows_view(self, t: torch.Tensor, s0: int, n: int, L: int, transpose: bool = False) -> torch.Tensor:
        """``_block`` of a contiguous (slots, *inner, d) tensor with the inner positions merged into rows,
        as one strided view: (n, L * inner, d), or (n, d, L * inner) with ``transpose``."""
        d = t.shape[-1]
        q = t.stride(0) if t.dim() > 1 else 1  # elements per slot
        rows = L * q // d
        user_stride = (self._stride or L) * q
        off = t.storage_offset() + s0 * q
        if transpose:
            return t.as_strided((n, d, rows), (user_stride, 1, d), off)
        return t.as_strided((n, rows, d), (user_stride, d, 1), off)

    def _set_buckets(self, lens: list, start: list) -> None:
        """Runs of consecutive users (skipping users without rows) with equal padded length, as
        ``(first slot, range of user ids, length)``: every bucket is a range of consecutive users."""
        self.buckets = []
        u0 = None
        for u, L in enumerate(lens):
            if u0 is not None and L != lens[u0]:
                self.buckets.append((start[u0], range(u0, u), lens[u0]))
                u0 = None
            if u0 is None and L:
                u0 = u
        if u0 is not None:
            self.buckets.append((start[u0], range(u0, len(lens)), lens[u0]))
        self.covers_all = sum(len(users) for _, users, _ in self.buckets) == self.num_users  # all have rows

    @property
    def slot_user(self) -> torch.Tensor:
        """User of each slot (``num_users`` on the phantom user's slots)."""
        if self._slot_user is None and self._stride is not None:  # padding slots: the phantom user
            m, T = self.num_users, self._stride
            self._slot_user = torch.arange(m).repeat_interleave(T).masked_fill_(~self._keep, m)
        if self._slot_user is None:
            m = self.num_users
            self._slot_user = torch.repeat_interleave(torch.arange(m + 1),
                                                      torch.cat([self._counts, torch.tensor([self._phantom])]))
        return self._slot_user

    def layout(self, t: torch.Tensor) -> torch.Tensor:
        """Rows (N, ...) in slot layout (slots, ...)."""
        return t if self.identity else t.index_select(0, self.src)

    def layout_weights(self, w: torch.Tensor) -> torch.Tensor:
        """Row weights in slot layout, 0 on padding slots (and for rows left out)."""
        return w if self.identity else torch.cat([w, w.new_zeros(1)])[self.weight_src]

    def per_user(self, fn, *tensors) -> torch.Tensor:
        """(users, ...) from ``fn(*bucket views)``, each view (users of the bucket, L * ..., ...)."""
        out = None
        for s0, users, L in self.buckets:
            n = len(users)
            r = fn(*[self._block(t, s0, n, L) for t in tensors])
            if n == self.num_users:  # one bucket holds every user, in order
                return r
            if out is None:
                out = r.new_zeros((self.num_users,) + tuple(r.shape[1:]))
            out[users.start:users.stop] = r
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

    def linear(self, g: torch.Tensor, x: torch.Tensor | None) -> tuple:
        """Per user: (sum of g^T x, sum of g) over its slots and inner positions, in one pass over the
        buckets (``x=None``: the bias part only). g (slots, *inner, out), x (slots, *inner, in)."""
        d_out = g.shape[-1]
        d_in = None if x is None else x.shape[-1]
        wide_last = d_in is not None and d_in < d_out  # the faster orientation: the wider factor last
        ws, bs = [], []
        for s0, users, L in self.buckets:
            n = len(users)
            gb = self._block(g, s0, n, L).reshape(n, -1, d_out)
            if d_in is not None:
                xb = self._block(x, s0, n, L).reshape(n, -1, d_in)
                ws.append(torch.bmm(xb.transpose(1, 2), gb).transpose(1, 2) if wide_last
                          else torch.bmm(gb.transpose(1, 2), xb))
            bs.append(gb.sum(1))
        return (None if d_in is None else self.parts(ws)), self.parts(bs)

    def linear_into(self, g: torch.Tensor, x: torch.Tensor | None, w_out: torch.Tensor | None,
                    b_out: torch.Tensor | None) -> None:
        """``linear`` written straight into the output columns: w_out (users, out * in), b_out (users, out)
        (either may be None). Every bucket is a range of consecutive users (``_set_buckets``)."""
        d_out = g.shape[-1]
        d_in = x.shape[-1] if w_out is not None else None
        wide_last = d_in is not None and d_in < d_out  # the faster orientation: the wider factor last
        for s0, users, L in self.buckets:
            u0, u1 = users.start, users.stop
            n = u1 - u0
            gb = self._block(g, s0, n, L).reshape(n, -1, d_out)
            if w_out is not None:
                xb = self._block(x, s0, n, L).reshape(n, -1, d_in)
                dst = w_out[u0:u1].view(n, d_out, d_in)
                if wide_last:
                    torch.bmm(xb.transpose(1, 2), gb, out=dst.transpose(1, 2))
                else:
                    torch.bmm(gb.transpose(1, 2), xb, out=dst)
            if b_out is not None:
                torch.sum(gb, 1, out=b_out[u0:u1])

    def parts(self, parts: list):
        """The buckets' results as (users, ...) when one bucket holds every user, else as ``BucketParts``
        (added into the output where they belong, without materializing a zero-padded copy)."""
        if len(parts) == 1 and parts[0].shape[0] == self.num_users:
            return parts[0]
        return BucketParts(parts)

    def add_into(self, out: torch.Tensor, v) -> None:
        """out (users, k) += v, a (users, ...) tensor or ``BucketParts``."""
        if not isinstance(v, BucketParts):
            out += v.reshape(out.shape)
            return
        for (_, users, _), r in zip(self.buckets, v.parts):
            out[users.start:users.stop] += r.reshape(len(users), -1)

    def sum(self, t: torch.Tensor, inner: int = 1) -> torch.Tensor:
        """Per-user sum over slots (and ``inner`` dims after the first) of (slots, *inner, ...) -> (users, ...)."""
        return self.per_user(lambda tb: tb.reshape(tb.shape[0], -1, *tb.shape[1 + inner:]).sum(1), t)


class BucketParts:
    """Per-bucket results of a rule (rows = the bucket's users), in ``Groups.buckets`` order."""

    __slots__ = ("parts",)

    def __init__(self, parts: list):
        self.parts = parts

    def full(self, groups: "Groups") -> torch.Tensor:
        out = self.parts[0].new_zeros((groups.num_users,) + tuple(self.parts[0].shape[1:]))
        groups.add_into(out.view(groups.num_users, -1), self)
        return out

    def __add__(self, other):
        raise TypeError("BucketParts are added into an output with Groups.add_into")


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
    # per user: sum_r g_r^T x_r and sum_r g_r
    w, b = groups.linear(g, inputs[0] if "weight" in names else None)
    out = {}
    if "weight" in names:
        out["weight"] = w
    if "bias" in names:
        out["bias"] = b
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
class _Objective(nn.Module):
    """``objective`` as a module holding ``module``, so ``functional_call`` can substitute ``module``'s
    parameters (as ``module.<name>``) while the objective runs."""

    def __init__(self, module, objective):
        super().__init__()
        self.module, self.objective = module, objective

    def forward(self, *args):
        return self.objective(*args)


def functional(module, objective, params: dict, args: tuple):
    """``objective(*args)`` (``module(*args)`` when None) with ``module``'s parameters ``params`` (name -> tensor)."""
    if objective is None:
        return functional_call(module, params, args)
    return functional_call(_Objective(module, objective), {f"module.{k}": v for k, v in params.items()}, args)


def per_user_gradients_func(module, inputs: tuple, weights, *, objective=None) -> torch.Tensor:
    """Reference: row i = grad_theta sum_t weights[i, t] objective(inputs[i, t]), by a ``torch.func`` vmap
    over users of the whole objective (trainable parameters only); inputs padded per user, (m, T, ...)."""
    params = _trainable(module)
    frozen = {k: v.detach() for k, v in module.named_parameters() if k not in params}
    dtype = next(iter(params.values())).dtype

    def user_objective(p, w, *args):
        return (functional(module, objective, {**frozen, **p}, args) * w).sum()

    detached = {k: v.detach() for k, v in params.items()}
    grads = vmap(grad(user_objective), in_dims=(None, 0) + (0,) * len(inputs))(detached, weights.to(dtype), *inputs)
    return torch.cat([grads[k].detach().reshape(weights.shape[0], -1) for k in params], dim=1)


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
    if R != groups.num_slots:
        raise Unsupported(f"{type(module).__name__}: called on {R} rows for {groups.num_slots} slots")
    batched = [isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == R for a in args]
    if any(isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == R for v in kwargs.values()):
        raise Unsupported(f"{type(module).__name__}: batched keyword inputs")
    params = {n: p.detach() for n, p in module.named_parameters(recurse=False) if n in names}
    fixed = list(args)
    where = [i for i, b in enumerate(batched) if b]

    def vjp(p, g_b, *block_args):
        full = list(fixed)
        for i, a in zip(where, block_args):
            full[i] = a
        return (functional_call(module, p, tuple(full), kwargs) * g_b).sum()

    return _block_func(vjp, params, [g.detach()] + [args[i].detach() for i in where], groups)


def _per_slot(t: torch.Tensor, slots: int) -> torch.Tensor:
    """A layer's input or error with ``k * slots`` leading rows, slot-major (e.g. the G completions of
    each user's row after a prompt's KV cache was repeated for them), as ``slots`` rows of k times
    the inner positions; unchanged when it has ``slots`` rows."""
    if t.dim() == 0 or t.shape[0] == slots:
        return t
    if slots == 0 or t.shape[0] % slots:
        raise Unsupported(f"a layer was called on {t.shape[0]} rows, not a multiple of the {slots} slots")
    k = t.shape[0] // slots
    if t.dim() == 1:
        return t.reshape(slots, k)
    return t.reshape(slots, k * t.shape[1], *t.shape[2:])

# ---- capturing the layers' inputs and outputs ------------------------------------------------------
# One forward hook per parameter-owning module, registered the first time a policy's per-user gradients
# are computed and kept (registering and removing hooks on every call cost about as much as a small
# layer's gradient). The hook records only while a capture of that module is in progress, so outside
# ``per_user_gradients`` (sampling, evaluation) it returns at once; it is a plain module-level function,
# so a copied or pickled policy carries nothing that refers back to a capture.
class _Captures(threading.local):
    """The captures in progress in this thread: a stack of (modules to record, their records)."""

    def __init__(self):
        self.stack: list = []


_CAPTURES = _Captures()


def _capture_hook(module, args, kwargs, output):
    stack = _CAPTURES.stack
    if stack:
        modules, records = stack[-1]
        if module in modules:
            if not isinstance(output, torch.Tensor):
                raise Unsupported(f"{type(module).__name__} returns {type(output).__name__}, not a tensor")
            records.append((module, args, kwargs, output,
                            [a._version if isinstance(a, torch.Tensor) else None for a in args], output._version))


def _ensure_hooks(modules) -> None:
    """Register ``_capture_hook`` on each module that does not carry it yet (a deep copy of a policy
    carries it already: its modules are not registered twice)."""
    for mod in modules:
        if not any(h is _capture_hook for h in mod._forward_hooks.values()):
            mod.register_forward_hook(_capture_hook, with_kwargs=True)




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
    padded = user_index is None
    if padded and chunk is not None and weights.shape[0] > chunk:
        return torch.cat([per_user_gradients(module, tuple(t[lo:lo + chunk] for t in inputs), weights[lo:lo + chunk],
                                             objective=objective, method=method, pad_multiple=pad_multiple,
                                             min_rows=min_rows)
                          for lo in range(0, weights.shape[0], chunk)])
    if padded:
        m, T = weights.shape[:2]
        inputs = tuple(t.reshape(m * T, *t.shape[2:]) for t in inputs)
        weights = weights.reshape(m * T)
    else:
        m = int(num_users) if num_users is not None else int(user_index.max()) + 1 if len(user_index) else 0
    keep = weights != 0  # zero-weight rows (padding) contribute nothing
    plan = _plan(module)
    weights = weights.to(plan.dtype)
    fast_layout = padded and method == "hooks" and pad_multiple == 1  # Groups finds the empty case itself
    if not fast_layout and not bool(keep.any()):
        return torch.zeros(m, plan.P, dtype=plan.dtype)
    if padded:
        user_index = None if fast_layout else torch.arange(m).repeat_interleave(T)
    if method == "func":
        return _func_over_users(module, objective, inputs, weights, user_index, keep, m)
    groups = Groups(user_index, m, pad_multiple, keep, sorted_users=padded, rows_per_user=T if padded else None,
                    min_rows=min_rows)
    if not groups.buckets:  # no row with a non-zero weight
        return torch.zeros(m, plan.P, dtype=plan.dtype)
    try:
        return _hook_gradients(module, objective, plan, tuple(groups.layout(t) for t in inputs),
                               groups.layout_weights(weights), groups)
    except Unsupported:
        if user_index is None:
            user_index = torch.arange(m).repeat_interleave(T)
        return _func_over_users(module, objective, inputs, weights, user_index, keep, m)


def _func_over_users(module, objective, inputs, weights, user_index, keep, m):
    idx = keep.nonzero().squeeze(1)
    padded = [pad_users(t[idx], user_index[idx], m) for t in inputs]
    return per_user_gradients_func(module, tuple(padded), pad_users(weights[idx], user_index[idx], m),
                                   objective=objective)


class _Plan:
    """What ``per_user_gradients`` needs to know about a policy, rebuilt only when its trainable
    parameters change (``_param_key``): the trainable parameters and their columns in the output, the
    modules owning them (hooked), and, when every hooked module is an ``nn.Linear`` and the policy owns
    no parameter directly (MLP policies, LoRA adapters), each layer's output columns for the fast path."""

    def __init__(self, policy, key):
        self.key = key
        self.params = {k: p for k, p in policy.named_parameters() if p.requires_grad}
        self.P = sum(p.numel() for p in self.params.values())
        self.dtype = next(iter(self.params.values())).dtype if self.params else torch.float32
        self.owner = {}
        for mod_name, mod in policy.named_modules():
            names = {n for n, p in mod.named_parameters(recurse=False) if p.requires_grad}
            if names:
                self.owner[mod] = (mod_name, names)
        self.hooked = frozenset(mod for mod in self.owner if mod is not policy)
        _ensure_hooks(self.hooked)
        self.columns, lo = {}, 0
        for p in self.params.values():
            self.columns[id(p)] = (lo, lo + p.numel())
            lo += p.numel()
        self.linear = None  # {module: (weight columns or None, bias columns or None)}
        if policy not in self.owner and all(RULES.get(type(mod)) is _linear for mod in self.hooked):
            self.linear = {}
            for mod, (_, names) in self.owner.items():
                self.linear[mod] = tuple(self.columns[id(getattr(mod, n))] if n in names else None
                                         for n in ("weight", "bias"))


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _param_key(policy) -> tuple:
    """(id, requires_grad, shape) of every parameter, by a direct walk of the module tree (the cache key
    of the plan: much cheaper than ``named_parameters``, which builds names and de-duplicates)."""
    key, stack = [], [policy]
    while stack:
        mod = stack.pop()
        for p in mod._parameters.values():
            if p is not None:
                key.append((id(p), p.requires_grad, p.shape))
        stack.extend(c for c in mod._modules.values() if c is not None)
    return tuple(key)


def _plan(policy) -> _Plan:
    """The policy's cached plan (rebuilt when a parameter is added, replaced, frozen or unfrozen)."""
    key = _param_key(policy)
    plan = _PLANS.get(policy)
    if plan is None or plan.key != key:
        plan = _PLANS[policy] = _Plan(policy, key)
    return plan




def _records_per_slot(records: list, err_of: dict, slots: int) -> tuple[list, dict]:
    """The captures of layers called on k rows per slot, with inputs and errors as ``slots`` rows (``_per_slot``)."""
    out_records, out_err = [], dict(err_of)
    for mod, args, kwargs, out, versions, out_version in records:
        R = out.shape[0]
        if R != slots:
            args = tuple(_per_slot(a, slots) if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == R else a
                         for a in args)
            if out_err.get(id(out)) is not None:
                out_err[id(out)] = _per_slot(out_err[id(out)], slots)
        out_records.append((mod, args, kwargs, out, versions, out_version))
    return out_records, out_err


def _hook_gradients(module, objective, plan: _Plan, inputs: tuple, weights, groups: Groups) -> torch.Tensor:
    """(users, P): every trainable parameter's per-user gradient, added into its columns."""
    m = groups.num_users
    records: list = []
    _CAPTURES.stack.append((plan.hooked, records))
    try:
        with torch.enable_grad():
            values = module(*inputs) if objective is None else objective(*inputs)
    finally:
        _CAPTURES.stack.pop()
    for mod, args, _, out, versions, out_version in records:
        if out._version != out_version or any(v is not None and a._version != v for a, v in zip(args, versions)):
            raise Unsupported(f"{type(mod).__name__}: a captured tensor was modified in place")
    needed = [rec[3] for rec in records if rec[3].requires_grad]
    # errors at the layer outputs only: the autograd engine skips every parameter-gradient product
    errs = torch.autograd.grad((values * weights).sum(), needed, allow_unused=True) if needed else []
    err_of = dict(zip([id(o) for o in needed], errs))
    if any(rec[3].shape[0] != groups.num_slots for rec in records):  # a layer called on k rows per slot
        records, err_of = _records_per_slot(records, err_of, groups.num_slots)
        errs = [err_of.get(id(rec[3])) for rec in records if rec[3].requires_grad]
    each_layer_once = len(needed) == len(records) == len(plan.linear or ()) == len({id(r[0]) for r in records})
    if plan.linear is not None and each_layer_once and all(r[1] for r in records) and \
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
            mod_name, names = owner[mod]
            rule = RULES.get(type(mod)) or RULES.get(type(mod).__name__)
            if rule is _linear and args and id(mod.weight) not in written and \
                    (mod.bias is None or id(mod.bias) not in written):  # first use: write in place
                cols = {n: columns[id(getattr(mod, n))] for n in names}
                w_cols, b_cols = cols.get("weight"), cols.get("bias")
                groups.linear_into(g, args[0], None if w_cols is None else flat[:, w_cols[0]:w_cols[1]],
                                   None if b_cols is None else flat[:, b_cols[0]:b_cols[1]])
                written.update(id(getattr(mod, n)) for n in names)
                continue
            contrib = rule(mod, args, out, g, groups, names) if rule is not None else None
            if contrib is None:
                with torch.enable_grad():
                    contrib = _module_vjp(mod, names, args, kwargs, g, groups)
            for n, v in contrib.items():
                lo, hi = columns[id(getattr(mod, n))]
                groups.add_into(flat[:, lo:hi], v)
                written.add(id(getattr(mod, n)))
    if module in owner:  # parameters used directly by the module: vmap over users for those only
        _, names = owner[module]
        direct = {n: getattr(module, n) for n in names}
        with torch.no_grad():
            for n, v in _root_func(module, objective, direct, inputs, weights, groups).items():
                lo, hi = columns[id(direct[n])]
                groups.add_into(flat[:, lo:hi], v.detach())
    return flat.detach()


def _linear_layers(plan: _Plan, records: list, errs, groups: Groups) -> torch.Tensor:
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




def _root_func(module, objective, direct: dict, inputs: tuple, weights, groups: Groups) -> dict:
    """Parameters the module uses directly: per bucket, a vmap over users of the objective for those only."""
    detached = {n: p.detach() for n, p in direct.items()}

    def user_objective(p, w, *args):
        return (functional(module, objective, p, args) * w).sum()

    return _block_func(user_objective, detached, [weights, *inputs], groups)


def _trainable(module) -> dict:
    """{name: parameter} of the trainable parameters (from the cached plan)."""
    return _plan(module).params
