"""Per-layer rules: a module's per-user parameter gradients from its captured inputs and output errors.

A rule ``rule(module, inputs, output, g, groups, names) -> {param name: (users, *shape) or BucketParts}``
(``g`` the error dL/d output, rows in the slot layout of ``groups``) is registered per module type, or per
class name for classes of optional packages (``register_rule``):

    Linear     y = x W^T + b:             dL_u/dW = sum_{r in u} g_r^T x_r,   dL_u/db = sum_{r in u} g_r
    Embedding  y = E[i]:                  dL_u/dE[v] = sum_{r in u, t: i_rt = v} g_rt
    IndexLinear  y = b + sum_j W[:, c_rj]:  dL_u/dW[:, c] = sum_{r in u, j: c_rj = c} g_r,   dL_u/db = sum g_r
    LayerNorm  y = xhat * gamma + beta:   dL_u/dgamma = sum_{r in u} g_r * xhat_r,   dL_u/dbeta = sum g_r
    RMSNorm    y = xhat * gamma:          dL_u/dgamma = sum_{r in u} g_r * xhat_r

(sums run over the row's inner positions too, e.g. tokens). LoRA adapters (peft's ``lora.Linear``) are two
``nn.Linear`` modules around a frozen base layer, so the Linear rule covers them. ``module_gradients`` falls
back, for a module with trainable parameters and no rule, to ``module_vjp``: a ``torch.func`` vmap over users
of the vector-Jacobian product of that module alone at its captured inputs and errors; ``root_gradients``
takes the parameters the differentiated module owns itself (a log-linear policy's theta, a Gaussian head's
log-std) by a vmap over users of the whole objective restricted to them.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dppo.policies.per_user_grads.layout import Groups, Unsupported

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


def rule_for(module) -> Callable | None:
    """The rule registered for the module's type (or its class name), None if there is none."""
    return RULES.get(type(module)) or RULES.get(type(module).__name__)


def module_gradients(module, names, args, kwargs, output, g, groups: Groups) -> dict:
    """Per-user gradients of the module's trainable parameters ``names`` at one captured call: its rule's,
    or, without a rule (or where the rule declines), ``module_vjp``'s."""
    rule = rule_for(module)
    contrib = rule(module, args, output, g, groups, names) if rule is not None else None
    if contrib is None:
        with torch.enable_grad():
            contrib = module_vjp(module, names, args, kwargs, g, groups)
    return contrib


def root_gradients(module, objective, names, inputs: tuple, weights, groups: Groups) -> dict:
    """{parameter: (users, *shape) per-user gradients} of the parameters ``names`` the differentiated module
    uses directly (not through a child module): per bucket, a vmap over users of the objective for those only."""
    direct = {n: getattr(module, n) for n in names}
    detached = {n: p.detach() for n, p in direct.items()}

    def user_objective(p, w, *args):
        return (functional(module, objective, p, args) * w).sum()

    grads = vmap_over_users(user_objective, detached, [weights, *inputs], groups)
    return {direct[n]: v.detach() for n, v in grads.items()}


# ---- the rules ------------------------------------------------------------------------------------------
@register_rule(nn.Linear)
def linear_rule(module, inputs, output, g, groups: Groups, names) -> dict:
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


@register_rule("IndexLinear")
def _index_linear(module, inputs, output, g, groups: Groups, names) -> dict:
    """``dppo.policies.observations.IndexLinear`` (a Linear fed column indices): dL_u/dW[:, c] = sum of g_r over
    u's rows r that read column c (an index add, one output row per (user, column)), dL_u/db = sum_r g_r."""
    if not inputs:
        raise Unsupported("IndexLinear called with keyword input")
    cols = module.columns(inputs[0].reshape(inputs[0].shape[0], -1))
    D, out_f, m = module.in_features, module.out_features, groups.num_users
    gf = g.reshape(g.shape[0], out_f)
    out = {}
    if "weight" in names:
        key = (groups.slot_user[:, None] * (D + 1) + cols).reshape(-1)
        rows = gf[:, None, :].expand(-1, cols.shape[1], -1).reshape(-1, out_f)
        w = gf.new_zeros((m + 1) * (D + 1), out_f).index_add_(0, key, rows)
        out["weight"] = w.view(m + 1, D + 1, out_f)[:m, :D].transpose(1, 2)
    if "bias" in names:
        out["bias"] = gf.new_zeros(m + 1, out_f).index_add_(0, groups.slot_user, gf)[:m]
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


def vmap_over_users(fn, params: dict, slot_args: list, groups: Groups) -> dict:
    """Per user: grad_params fn(params, *that user's padded slots), by a vmap over each bucket's users."""
    names = list(params)
    g = vmap(grad(fn), in_dims=(None,) + (0,) * len(slot_args))

    def flat(*views):
        d = g(params, *views)
        return torch.cat([d[k].reshape(views[0].shape[0], -1) for k in names], dim=1)

    out = groups.per_user(flat, *slot_args)
    sizes = [params[k].numel() for k in names]
    return {k: v.reshape(-1, *params[k].shape) for k, v in zip(names, out.split(sizes, dim=1))}


def module_vjp(module, names, args, kwargs, g, groups: Groups) -> dict:
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

    return vmap_over_users(vjp, params, [g.detach()] + [args[i].detach() for i in where], groups)
