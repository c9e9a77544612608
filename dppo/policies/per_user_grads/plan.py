"""Parameter groups: what the engine needs to know about a policy, cached per policy (``plan_for``).

Only parameters with ``requires_grad`` get gradients; the engine's rows are their concatenation in
``named_parameters()`` order (``Plan.columns``). Assumption (as in Opacus): a parameter is used only inside
the forward of the module that owns it.
"""
from __future__ import annotations

import weakref

import torch

from dppo.policies.per_user_grads.capture import ensure_hooks
from dppo.policies.per_user_grads.rules import linear_rule, rule_for


class Plan:
    """What ``per_user_gradients`` needs to know about a policy, rebuilt only when its trainable
    parameters change (``plan_for``): the trainable parameters and their columns in the output, the
    modules owning them (hooked), and, when every hooked module is an ``nn.Linear`` and the policy owns
    no parameter directly (MLP policies, LoRA adapters), each layer's output columns for the fast path."""

    def __init__(self, policy, key):
        self.key = key
        self.params = {k: p for k, p in policy.named_parameters() if p.requires_grad}
        self.P = sum(p.numel() for p in self.params.values())
        self.dtype = next(iter(self.params.values())).dtype if self.params else torch.float32
        self.owner = {}  # {module: (its name, names of its own trainable parameters)}
        for mod_name, mod in policy.named_modules():
            names = {n for n, p in mod.named_parameters(recurse=False) if p.requires_grad}
            if names:
                self.owner[mod] = (mod_name, names)
        self.hooked = frozenset(mod for mod in self.owner if mod is not policy)
        ensure_hooks(self.hooked)
        self.columns, lo = {}, 0  # {id(parameter): (first column, last column + 1)}
        for p in self.params.values():
            self.columns[id(p)] = (lo, lo + p.numel())
            lo += p.numel()
        self.linear = None  # {module: (weight columns or None, bias columns or None)}
        if policy not in self.owner and all(rule_for(mod) is linear_rule for mod in self.hooked):
            self.linear = {}
            for mod, (_, names) in self.owner.items():
                self.linear[mod] = tuple(self.columns[id(getattr(mod, n))] if n in names else None
                                         for n in ("weight", "bias"))

    def has_shared_parameter(self) -> bool:
        """Whether a trainable parameter belongs to two modules (tied weights, e.g. an LM head tied to the
        embeddings): its part of a user's gradient is then the sum of the modules' parts."""
        seen = set()
        for mod, (_, names) in self.owner.items():
            for n in names:
                pid = id(getattr(mod, n))
                if pid in seen:
                    return True
                seen.add(pid)
        return False


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


def plan_for(policy) -> Plan:
    """The policy's cached plan (rebuilt when a parameter is added, replaced, frozen or unfrozen)."""
    key = _param_key(policy)
    plan = _PLANS.get(policy)
    if plan is None or plan.key != key:
        plan = _PLANS[policy] = Plan(policy, key)
    return plan
