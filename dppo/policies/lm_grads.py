"""Per-user gradients of the trainable (adapter) parameters of a batched LM objective.

``per_user_gradients(policy, objective, users, group_size)`` returns the (users, d) matrix whose row i
is grad_theta J_i, where ``objective(us)`` returns the objective values of the users ``us`` (a slice;
``group_size`` values per user, user-major), each user's values a function of that user's own data only
(a causal LM with attention masks never mixes rows; a prompt's KV cache may be shared by its own
completions, never across users).

Method (the per-layer rule of Opacus' ``GradSampleModule``, summed per user instead of per sample):
every trainable parameter must be the weight (or bias) of an ``nn.Linear`` - LoRA's ``lora_A`` /
``lora_B`` are. For such a layer y = x W^T + b, grad_W sum_b J_b = sum_{b, t} (dJ/dy_{b,t}) x_{b,t}^T;
since J_b depends on sequence b only, dJ/dy_{b,t} from one backward pass of the *summed* objective is
sequence b's own backprop, and user i's gradient is the sum over its rows and their tokens: one einsum
over (user, rows*tokens) per call of the layer (a layer called on the prompt and then on the completions
contributes both). Exact (no approximation); one forward pass and one backward pass to the layers'
*outputs* (the batch-summed weight gradients are never formed), plus the einsums. Users are processed in chunks of ``policy.micro_batch`` sequences.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dppo.errors import ConfigError


def linear_owners(policy) -> list[tuple[nn.Linear, bool, bool]]:
    """(layer, weight trainable, bias trainable) for every ``nn.Linear`` holding a trainable parameter.

    Raises:
        ConfigError: a trainable parameter that is not the weight/bias of an ``nn.Linear``.
    """
    owners, covered = [], set()
    for module in policy.model.modules():
        if isinstance(module, nn.Linear):
            w = module.weight.requires_grad
            b = module.bias is not None and module.bias.requires_grad
            if w or b:
                owners.append((module, w, b))
                covered.add(id(module.weight))
                if module.bias is not None:
                    covered.add(id(module.bias))
    stray = [n for n, p in policy.trainable() if id(p) not in covered]
    if stray:
        raise ConfigError(f"per-user gradients need every trainable parameter in an nn.Linear layer (LoRA on "
                          f"linear layers); '{stray[0]}' is not: choose policy.lora.target_modules of linear layers")
    return owners


def per_user_gradients(policy, objective: Callable[[slice], torch.Tensor], users: int,
                       group_size: int) -> torch.Tensor:
    """(users, d) float64: row i = grad of the sum of user i's objective values, in ``policy.trainable()`` order."""
    owners = linear_owners(policy)
    order = {id(p): k for k, (_, p) in enumerate(policy.trainable())}
    chunk = max(1, policy.micro_batch // group_size)
    out = []
    for start in range(0, users, chunk):
        n = min(chunk, users - start)
        out.append(_chunk_gradients(policy, objective, owners, order, start, n, group_size))
    return torch.cat(out)


def _chunk_gradients(policy, objective, owners, order, start, n, G):
    saved: dict[int, list] = {}  # id(layer) -> [(input, output)] per call of the layer
    handles = []

    def fwd_hook(module, inputs, output):  # a layer called k times contributes k (input, backprop) pairs
        saved.setdefault(id(module), []).append((inputs[0].detach(), output))

    for module, _, _ in owners:
        handles.append(module.register_forward_hook(fwd_hook))
    try:
        values = objective(slice(start, start + n))
    finally:
        for h in handles:
            h.remove()
    calls = [(module, k) for module, _, _ in owners for k in range(len(saved.get(id(module), [])))]
    outputs = [saved[id(m)][k][1] for m, k in calls]
    # backprop to the layers' outputs only: the adapter weights' own (batch-summed) gradients, which a
    # backward to the parameters would compute and this function would discard, are never formed
    backprops = dict(zip([(id(m), k) for m, k in calls],
                         torch.autograd.grad(values.sum(), outputs, allow_unused=True))) if outputs else {}
    grads: list[torch.Tensor | None] = [None] * len(order)
    for module, w_train, b_train in owners:
        # per-user sums over the user's G*T tokens in the layer's dtype, then float64 for the clipping and the sum
        pairs = [(x.reshape(n, -1, x.shape[-1]), g.reshape(n, -1, g.shape[-1]).to(x.dtype))
                 for k, (x, _) in enumerate(saved.get(id(module), []))
                 if (g := backprops.get((id(module), k))) is not None]  # no backprop: not on the path
        if w_train:
            gw = sum(torch.bmm(g.transpose(1, 2), x) for x, g in pairs) if pairs else None
            grads[order[id(module.weight)]] = (gw.double() if gw is not None else
                                               torch.zeros(n, *module.weight.shape, dtype=torch.float64,
                                                           device=module.weight.device))
        if b_train:
            gb = sum(g.sum(1) for _, g in pairs) if pairs else None
            grads[order[id(module.bias)]] = (gb.double() if gb is not None else
                                             torch.zeros(n, *module.bias.shape, dtype=torch.float64,
                                                         device=module.bias.device))
    return torch.cat([gr.reshape(n, -1).cpu() for gr in grads], dim=1)


def summed_gradient(policy, objective: Callable[[slice], torch.Tensor], users: int, group_size: int) -> torch.Tensor:
    """(d,) float64 gradient of the summed objective of all users (the non-private path: plain backward)."""
    params = [p for _, p in policy.trainable()]
    total = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    step = max(1, policy.micro_batch // group_size)
    for start in range(0, users, step):
        grads = torch.autograd.grad(objective(slice(start, min(start + step, users))).sum(), params,
                                    allow_unused=True)
        for t, g in zip(total, grads):
            if g is not None:
                t += g.double()
    return torch.cat([t.reshape(-1).cpu() for t in total])
