"""The parameter subspace of a policy-optimization update: compatible features phi(s, a) = grad log pi(a|s)
there, the Fisher matrix, and the map from subspace coordinates back to the parameters.

``subspace``: ``head`` = the last linear layer, action 0's row as the reference (softmax is invariant
to a shift common to all rows), phi = (1[a=k] - pi_k(s)) [h(s), 1] for k = 1..K-1; ``full`` = all
trainable parameters (per-sample gradients by torch.func); ``auto`` = head if the policy has a
trainable linear ``head`` (``MLPPolicy``), else full (e.g. the log-linear policy). ``dim=k`` restricts
it further to a fixed random k-dim subspace P (orthonormal columns, seeded by the run seed: public,
data-independent) when the subspace has more than k dimensions: w lives in R^k, the parameters move
by P w, and a private release adds noise in k dimensions only. Only parameters with
``requires_grad`` are ever part of a subspace (frozen parameters stay bit-identical).
"""
from __future__ import annotations

import torch

from dppo.errors import ConfigError
from dppo.policies.base import pad_rows

SUBSPACES = ("auto", "head", "full")
_CHUNK = 2048  # rows per per-sample-gradient call in the full subspace


def per_user_gradients(policy, obs, actions, weights, params: dict | None = None) -> torch.Tensor:
    """Row i = grad_theta sum_t weights[i, t] log pi(actions[i, t] | obs[i, t]) (flattened) over ``params``
    (name -> tensor; default: the trainable parameters) with everything else held fixed.

    Over the policy's own trainable parameters: from one backward pass with per-layer rules
    (``dppo.algos.per_user_grads``); other ``params`` (substituted values): a torch.func vmap over users.
    """
    from torch.func import functional_call, grad, vmap

    from dppo.algos.per_user_grads import per_user_gradients as one_backward

    own = {k: v for k, v in policy.named_parameters() if v.requires_grad}
    if params is None or (list(params) == list(own) and all(
            params[k].data_ptr() == own[k].data_ptr() and params[k].shape == own[k].shape for k in own)):
        return one_backward(policy, obs, actions, weights)

    trainable = dict(params) if params is not None else {k: v.detach() for k, v in policy.named_parameters()
                                                          if v.requires_grad}
    fixed = {k: v.detach() for k, v in policy.named_parameters() if k not in trainable}

    def user_objective(p, o, a, w):
        return (functional_call(policy, {**fixed, **p}, (o, a)) * w).sum()

    grads = vmap(grad(user_objective), in_dims=(None, 0, 0, 0))(trainable, obs, actions, weights.float())
    return torch.cat([g.reshape(obs.shape[0], -1) for g in grads.values()], dim=1)


class PolicySubspace:
    """Compatible features phi(s, a) in a parameter subspace, the Fisher matrix there, and the update."""

    def __init__(self, policy, params, subspace: str = "auto", dim: int | None = 8, seed: int = 0):
        if subspace not in SUBSPACES:
            raise ConfigError(f"algo.subspace must be one of {SUBSPACES}, got '{subspace}'")
        head = getattr(policy, "head", None)
        has_head = isinstance(head, torch.nn.Linear) and hasattr(policy, "body") and head.weight.requires_grad
        if subspace == "auto":
            subspace = "head" if has_head else "full"
        if subspace == "head" and not has_head:
            raise ConfigError("algo.subspace=head needs a policy with .body and a trainable linear .head (MLPPolicy); "
                              "use algo.subspace=full")
        self.policy, self.kind, self.params = policy, subspace, list(params)
        if subspace == "head":
            self.n_actions, self.width = head.out_features, head.in_features + 1
            native = (self.n_actions - 1) * self.width
        else:
            self.names = {id(p): n for n, p in policy.named_parameters()}
            native = sum(p.numel() for p in self.params)
        self.projection = None
        if dim is not None and int(dim) < native:
            if int(dim) < 1:
                raise ConfigError(f"algo.dim must be >= 1 or null, got {dim}")
            gen = torch.Generator().manual_seed(int(seed) + 31337)
            q, _ = torch.linalg.qr(torch.randn(native, int(dim), generator=gen, dtype=torch.float64))
            self.projection = q  # orthonormal columns: ||P^T v|| <= ||v||
        self.dim = native if self.projection is None else int(dim)

    def features(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """phi(s, a) for N rows (N, dim), float64."""
        if self.kind == "full":
            params = {self.names[id(p)]: p.detach() for p in self.params}
            out = []
            for lo in range(0, obs.shape[0], _CHUNK):
                o, a = obs[lo:lo + _CHUNK], actions[lo:lo + _CHUNK]
                g = per_user_gradients(self.policy, o[:, None], a[:, None], torch.ones(o.shape[0], 1), params).double()
                out.append(g if self.projection is None else g @ self.projection)
            return torch.cat(out) if out else torch.zeros(0, self.dim, dtype=torch.float64)
        n = obs.shape[0]
        with torch.no_grad():  # padded to MIN_ROWS rows: a row's features never depend on the batch size
            h = self.policy.body(pad_rows(obs.flatten(start_dim=1) if obs.dim() > 2 else obs)).double()
            probs = torch.softmax(self.policy.head(h.float()).double(), dim=-1)[:n]
            h = h[:n]
            h1 = torch.cat([h, torch.ones(h.shape[0], 1, dtype=torch.float64)], dim=1)
            onehot = torch.nn.functional.one_hot(actions.long(), self.n_actions).double()
            coef = (onehot - probs)[:, 1:]  # rows k = 1..K-1
            phi = (coef[:, :, None] * h1[:, None, :]).reshape(obs.shape[0], -1)
        return phi if self.projection is None else (pad_rows(phi) @ self.projection)[:n]

    def fisher(self, obs: torch.Tensor) -> torch.Tensor:
        """F = mean_s sum_a pi(a|s) phi(s, a) phi(s, a)^T at the given states (dim x dim); for a continuous
        policy E_{a ~ pi(.|s)} phi phi^T by Monte Carlo (4 samples per state from a fixed public generator)."""
        if getattr(self.policy, "continuous", False):
            gen = torch.Generator().manual_seed(2718)
            reps = obs.repeat_interleave(4, dim=0)
            actions, _ = self.policy.sample(reps, generator=gen)
            phi = self.features(reps, actions)
            return phi.T @ phi / max(reps.shape[0], 1)
        with torch.no_grad():
            probs = torch.softmax(self.policy.logits(obs), -1).double()
        F = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        for a in range(probs.shape[1]):
            phi = self.features(obs, torch.full((obs.shape[0],), a, dtype=torch.long))
            F += (phi * probs[:, a:a + 1]).T @ phi
        return F / max(obs.shape[0], 1)

    def to_params(self, w: torch.Tensor) -> list[torch.Tensor]:
        """The parameter change (P) w, one tensor per trainable parameter (zeros outside the subspace)."""
        delta = w.double() if self.projection is None else self.projection @ w.double()
        if self.kind == "full":
            out, offset = [], 0
            for p in self.params:
                out.append(delta[offset:offset + p.numel()].view_as(p).to(p.dtype))
                offset += p.numel()
            return out
        head = self.policy.head
        rows = delta.reshape(self.n_actions - 1, self.width)
        out = []
        for p in self.params:
            d = torch.zeros_like(p)
            if p is head.weight:
                d[1:] = rows[:, :-1].to(p.dtype)
            elif p is head.bias:
                d[1:] = rows[:, -1].to(p.dtype)
            out.append(d)
        return out

    def step(self, w: torch.Tensor) -> None:
        """theta <- theta + (P) w (w in subspace coordinates)."""
        with torch.no_grad():
            for p, d in zip(self.params, self.to_params(w)):
                p += d

    def per_user_features(self, batch, A: torch.Tensor) -> torch.Tensor:
        """(m, dim): user i's mean over its G rollouts of sum_t phi(s_t, a_t) A_t (its policy gradient here)."""
        G = batch.group_size
        if self.kind == "full" and self.projection is None:  # no per-row features: vmap over users
            params = {self.names[id(p)]: p.detach() for p in self.params}
            return per_user_gradients(self.policy, batch.grouped(batch.obs).flatten(1, 2),
                                      batch.grouped(batch.actions).flatten(1, 2),
                                      batch.grouped(A).flatten(1, 2) / G, params).double()
        phi = self.features(batch.obs[batch.mask], batch.actions[batch.mask])
        user = torch.arange(batch.mask.shape[0])[:, None].expand_as(batch.mask)[batch.mask] // G
        out = torch.zeros(batch.users, self.dim, dtype=torch.float64)
        return out.index_add_(0, user, phi * A[batch.mask].double()[:, None]) / G
