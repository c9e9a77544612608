"""The policy side of the learner interface: which parameters a learner moves, and the policy's scores there.

A learner (``dppo.algos``) never reads or writes a policy's parameters itself. It asks the policy's
``ParameterSpace`` for what its update needs and hands it back the released update:

* ``user_gradients(batch, weights)``: (m, dim), row i = (1/G) sum over user i's G rollouts of
  sum_t w_t grad log pi(a_t | s_t) (the policy gradient of PG / DP-PG, one row per privacy unit);
* ``features(batch)`` / ``episode_features(batch)``: the compatible features phi(s, a) = grad log pi(a | s)
  of every step, or their sum over each episode (the regression rows of NPG and REBEL);
* ``fisher(batch)``: the Fisher matrix at a (public) batch (NPG's KL step, ssp's public Gram matrix);
* ``gradients(inputs, weights, objective=...)``: per-user gradients of any per-row objective (a clipped
  surrogate plus a value loss, ...), through the one engine ``dppo.policies.per_user_grads``;
* ``clipped_user_sum(batch, weights, scale)``: sum_i scale(||g_i||)_i g_i of those rows and their norms, without
  forming the (m, dim) matrix (``dppo.policies.per_user_grads.fused``; None where a space cannot: a projected
  space, the head's closed form): what DP-PG releases, at about the cost of one backward;
* ``clipped_rows_sum(inputs, weights, user_index, scale)``: the same for the per-user gradients of any weighted
  score rows (what ``gradients`` returns, clipped and summed without being formed): what DP-PPO's actor releases;
* ``step(delta)`` / ``ascend(delta, optimizer)``: theta <- theta + P delta, or one optimizer step along it.

Implementations (``make_space``; ``policy.subspace``, ``policy.dim``):

* ``HeadSubspace`` (``head``): the last linear layer of a softmax policy with a ``body`` and a ``head``
  (``MLPPolicy``); action 0's row is the reference (softmax is invariant to a shift common to all rows), and
  phi = (1[a = k] - pi_k(s)) [h(s), 1] for k = 1..K-1 in closed form.
* ``FullSpace`` (``full``): every trainable parameter of a policy that acts on episodes (``forward(obs,
  actions) = log pi``: the MLP, Gaussian and log-linear policies, your own module); gradients from the engine.
* ``AdapterSpace`` (``full`` for a language model): the trainable parameters of an ``LMPolicy`` (its LoRA
  adapter, or every weight), on completions of prompts; gradients from the engine, a prompt forwarded once
  and its KV cache shared by its own G completions.

``dim=k`` restricts any of them to a fixed random k-dim subspace P (orthonormal columns, seeded by the run
seed: public, data-independent) when the space has more than k dimensions: updates live in R^k, the
parameters move by P delta, and a private release adds noise in k dimensions only. Only parameters with
``requires_grad`` are ever part of a space (frozen parameters stay bit-identical).
"""
from __future__ import annotations

import os

import torch

from dppo.errors import ConfigError, DataError
from dppo.policies.base import pad_rows
from dppo.policies.per_user_grads import clipped_gradient_sum, per_user_gradients

SUBSPACES = ("auto", "head", "full")
_CHUNK = 2048  # rows per per-row-gradient call in the full space


def make_space(policy, subspace: str = "auto", dim: int | None = 8, seed: int = 0) -> "ParameterSpace":
    """The parameter space a learner moves ``policy`` in.

    Args:
        policy: the policy (a gym policy acting on episodes, or an ``LMPolicy`` acting on prompts).
        subspace: ``head`` (the last linear layer of a softmax MLP), ``full`` (every trainable parameter) or
            ``auto`` (head for an MLP policy with a trainable ``head``, full otherwise).
        dim: a fixed random ``dim``-dimensional subspace of it (null: the whole space).
        seed: seed of that subspace (the run seed: public).
    """
    if subspace not in SUBSPACES:
        raise ConfigError(f"policy.subspace must be one of {SUBSPACES}, got '{subspace}'")
    if dim is not None and int(dim) < 1:
        raise ConfigError(f"policy.dim must be >= 1 or null, got {dim}")
    lm = callable(getattr(policy, "token_log_probs", None))
    head = getattr(policy, "head", None)
    has_head = (not lm and isinstance(head, torch.nn.Linear) and hasattr(policy, "body")
                and head.weight.requires_grad)
    if subspace == "head" and not has_head:
        raise ConfigError("policy.subspace=head needs a softmax policy with .body and a trainable linear .head "
                          "(MLPPolicy); use policy.subspace=full")
    if subspace == "head" or (subspace == "auto" and has_head):
        return HeadSubspace(policy, dim, seed)
    return AdapterSpace(policy, dim, seed) if lm else FullSpace(policy, dim, seed)


def random_basis(native: int, dim: int, seed: int, round_idx: int | None = None) -> torch.Tensor:
    """(native, dim) orthonormal columns (||P^T v|| <= ||v||) from a public seed: the run seed, and the round for a
    re-drawn subspace (``ParameterSpace.redraw``)."""
    gen = torch.Generator().manual_seed(seed + 31337 if round_idx is None else (seed + 31337) * 100003 + round_idx + 1)
    q, _ = torch.linalg.qr(torch.randn(native, dim, generator=gen, dtype=torch.float64))
    return q


class Fisher:
    """F at a batch as a dense ``matrix`` (dim x dim); ``quadratic(d)`` = d^T F d."""

    def __init__(self, matrix: torch.Tensor):
        self.matrix = matrix

    def quadratic(self, d: torch.Tensor) -> float:
        return float(d @ self.matrix @ d)


class SampledFisher(Fisher):
    """F = mean_r phi_r phi_r^T over sampled rows ``phi`` (n, dim), never formed unless ``matrix`` is read."""

    def __init__(self, phi: torch.Tensor):
        self.phi = phi

    @property
    def matrix(self) -> torch.Tensor:
        return self.phi.T @ self.phi / max(self.phi.shape[0], 1)

    def quadratic(self, d: torch.Tensor) -> float:
        return float(((self.phi @ d) ** 2).mean())


class ParameterSpace:
    """The interface (module docstring); subclasses implement ``_native_dim``, the score methods and ``to_params``.

    Attributes:
        policy: the policy; params: its trainable parameters (the ones that move); dim: update coordinates;
        kind: ``head`` | ``full``; projection: (native, dim) orthonormal columns, or None.
    """

    kind = "full"

    def __init__(self, policy, dim: int | None, seed: int):
        self.policy = policy
        self.params = [p for p in policy.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("the policy has no trainable parameters (requires_grad=False everywhere)")
        self.native_dim, self.seed = self._native_dim(), int(seed)
        self.projection = None
        if dim is not None and int(dim) < self.native_dim:
            self.projection = random_basis(self.native_dim, int(dim), self.seed)
        self.dim = self.native_dim if self.projection is None else int(dim)

    def _native_dim(self) -> int:
        return sum(p.numel() for p in self.params)

    def redraw(self, round_idx: int) -> torch.Tensor | None:
        """Replace the random subspace by round ``round_idx``'s (a public schedule: drawn from the run seed and the
        round index only, never from data); returns the map old -> new coordinates, P_new^T P_old (None: no
        subspace). Over rounds the updates then span the whole space while each release stays ``dim``-dim."""
        if self.projection is None:
            return None
        old, self.projection = self.projection, random_basis(self.native_dim, self.dim, self.seed, round_idx)
        return self.projection.T @ old

    def _project(self, g: torch.Tensor) -> torch.Tensor:
        return g if self.projection is None else g @ self.projection

    # ---- scores (the learner's inputs) ----------------------------------------------------------
    def user_gradients(self, batch, weights: torch.Tensor, *, kl_coef: float = 0.0) -> torch.Tensor:
        raise NotImplementedError

    def clipped_user_sum(self, batch, weights: torch.Tensor, scale, *, kl_coef: float = 0.0
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(sum_i scale(n)_i g_i (dim,) float64, n = ||g_i|| (m,) float64) for the rows g_i of
        ``user_gradients``, without forming them; None when this space has no such path (then clip the
        rows of ``user_gradients``). ``scale``: the release's clipping factors (``dppo.privacy.release``)."""
        return None

    def features(self, batch) -> torch.Tensor:
        raise NotImplementedError

    def episode_features(self, batch) -> torch.Tensor:
        """(episodes, dim): x(tau) = sum_t phi(s_t, a_t) of every episode of the batch."""
        phi = self.features(batch)
        return torch.stack([p.sum(0) for p in phi.split([int(n) for n in batch.lengths])])

    def fisher(self, batch, max_rows: int) -> Fisher:
        raise NotImplementedError

    def gradients(self, inputs: tuple, weights: torch.Tensor, user_index: torch.Tensor | None = None, *,
                  objective=None, num_users: int | None = None) -> torch.Tensor:
        """(m, dim) float64: per-user gradients of sum_r w_r objective(row r) in this space (the engine's
        ``per_user_gradients`` over every trainable parameter, then projected)."""
        g = per_user_gradients(self.policy, inputs, weights, user_index, objective=objective, num_users=num_users)
        return self._project(g.double())

    def clipped_rows_sum(self, inputs: tuple, weights: torch.Tensor, user_index: torch.Tensor, scale, *,
                         objective=None, num_users: int | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(sum_u scale(n)_u g_u (dim,) float64, n = ||g_u|| (m,) float64) for the rows g_u of ``gradients`` (same
        arguments), without forming them (the engine's ``clipped_gradient_sum``); None when this space has no such
        path (a projected space, the head's closed form: then clip the rows of ``gradients``). ``scale``: the
        release's clipping factors (``dppo.privacy.release.Release.clip_scale``)."""
        if self.projection is not None:
            return None
        return clipped_gradient_sum(self.policy, inputs, weights, scale, user_index, objective=objective,
                                    num_users=num_users)

    # ---- the update ----------------------------------------------------------------------------------
    def to_params(self, delta: torch.Tensor) -> list[torch.Tensor]:
        """The parameter change (P) delta, one tensor per trainable parameter (zeros outside the space)."""
        flat = delta.double() if self.projection is None else self.projection @ delta.double()
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset:offset + p.numel()].view_as(p).to(device=p.device, dtype=p.dtype))
            offset += p.numel()
        return out

    def step(self, delta: torch.Tensor) -> None:
        """theta <- theta + (P) delta (delta in space coordinates)."""
        with torch.no_grad():
            for p, d in zip(self.params, self.to_params(delta)):
                p += d

    def ascend(self, delta: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """One step of ``optimizer`` (over ``params``) ascending along (P) delta."""
        for p, d in zip(self.params, self.to_params(delta)):
            p.grad = -d
        optimizer.step()

    # ---- what a checkpoint holds -------------------------------------------------------------------
    def policy_state(self) -> dict:
        return self.policy.state_dict()

    def load_policy_state(self, state: dict) -> None:
        self.policy.load_state_dict(state)

    def export(self, run_dir: str, round_idx: int) -> None:
        """Artifacts beyond ``policy.pt`` (a LoRA adapter in peft's layout); none here."""


class HeadSubspace(ParameterSpace):
    """The softmax head in closed form (module docstring)."""

    kind = "head"

    def _native_dim(self) -> int:
        head = self.policy.head
        self.n_actions, self.width = head.out_features, head.in_features + 1
        return (self.n_actions - 1) * self.width

    def state_action_features(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """phi(s, a) for N rows (N, dim), float64."""
        n = obs.shape[0]
        with torch.no_grad():  # padded to MIN_ROWS rows: a row's features never depend on the batch size
            rows = pad_rows(obs.flatten(start_dim=1) if obs.dim() > 2 else obs)
            h = self.policy.body(rows).double()
            logits = self.policy.head(h.float())
            if hasattr(self.policy, "mask_logits"):    # the env's action masks (``dppo.policies.masked``)
                logits = self.policy.mask_logits(rows, logits)
            probs = torch.softmax(logits.double(), dim=-1)[:n]
            h = h[:n]
            h1 = torch.cat([h, torch.ones(h.shape[0], 1, dtype=torch.float64)], dim=1)
            onehot = torch.nn.functional.one_hot(actions.long(), self.n_actions).double()
            coef = (onehot - probs)[:, 1:]  # rows k = 1..K-1
            phi = (coef[:, :, None] * h1[:, None, :]).reshape(obs.shape[0], -1)
        return phi if self.projection is None else (pad_rows(phi) @ self.projection)[:n]

    def features(self, batch) -> torch.Tensor:
        return self.state_action_features(batch.obs[batch.mask], batch.actions[batch.mask])

    def user_gradients(self, batch, weights: torch.Tensor, *, kl_coef: float = 0.0) -> torch.Tensor:
        _no_kl(kl_coef, self)
        return _sum_by_user(self.features(batch), batch, weights, self.dim)

    def fisher(self, batch, max_rows: int) -> Fisher:
        """F = mean_s sum_a pi(a|s) phi(s, a) phi(s, a)^T at the batch's states (at most ``max_rows``)."""
        obs = _states(batch, max_rows)
        with torch.no_grad():
            probs = torch.softmax(self.policy.logits(obs), -1).double()
        F = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        for a in range(probs.shape[1]):
            phi = self.state_action_features(obs, torch.full((obs.shape[0],), a, dtype=torch.long))
            F += (phi * probs[:, a:a + 1]).T @ phi
        return Fisher(F / max(obs.shape[0], 1))

    def gradients(self, inputs, weights, user_index=None, *, objective=None, num_users=None):
        raise ConfigError("policy.subspace=head gives the policy-gradient and NPG scores in closed form only; "
                          "use policy.subspace=full for another objective")

    def clipped_rows_sum(self, inputs, weights, user_index, scale, *, objective=None, num_users=None):
        return None   # no per-user gradients of another objective here (``gradients``)

    def to_params(self, delta: torch.Tensor) -> list[torch.Tensor]:
        flat = delta.double() if self.projection is None else self.projection @ delta.double()
        head = self.policy.head
        rows = flat.reshape(self.n_actions - 1, self.width)
        out = []
        for p in self.params:
            d = torch.zeros_like(p)
            if p is head.weight:
                d[1:] = rows[:, :-1].to(p.dtype)
            elif p is head.bias:
                d[1:] = rows[:, -1].to(p.dtype)
            out.append(d)
        return out


class FullSpace(ParameterSpace):
    """Every trainable parameter of a policy acting on episodes (``forward(obs, actions) = log pi``)."""

    def state_action_features(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """phi(s, a) for N rows (N, dim), float64: each row its own user of the engine."""
        out = []
        for lo in range(0, obs.shape[0], _CHUNK):
            o, a = obs[lo:lo + _CHUNK], actions[lo:lo + _CHUNK]
            g = per_user_gradients(self.policy, (o[:, None], a[:, None]), torch.ones(o.shape[0], 1)).double()
            out.append(self._project(g))
        return torch.cat(out) if out else torch.zeros(0, self.dim, dtype=torch.float64)

    def features(self, batch) -> torch.Tensor:
        return self.state_action_features(batch.obs[batch.mask], batch.actions[batch.mask])

    def user_gradients(self, batch, weights: torch.Tensor, *, kl_coef: float = 0.0) -> torch.Tensor:
        _no_kl(kl_coef, self)
        if self.projection is not None:  # per-row features, projected, summed per user
            return _sum_by_user(self.features(batch), batch, weights, self.dim)
        G = batch.group_size  # no per-row features: the engine sums each user's rows directly
        rows = (batch.grouped(batch.obs).flatten(1, 2), batch.grouped(batch.actions).flatten(1, 2))
        return per_user_gradients(self.policy, rows, batch.grouped(weights).flatten(1, 2) / G).double()

    def clipped_user_sum(self, batch, weights: torch.Tensor, scale, *, kl_coef: float = 0.0):
        _no_kl(kl_coef, self)
        if self.projection is not None:
            return None
        G = batch.group_size
        rows = (batch.grouped(batch.obs).flatten(1, 2), batch.grouped(batch.actions).flatten(1, 2))
        return clipped_gradient_sum(self.policy, rows, batch.grouped(weights).flatten(1, 2) / G, scale)

    def fisher(self, batch, max_rows: int) -> Fisher:
        """F = E_{a ~ pi(.|s)} phi phi^T at the batch's states: exact over a Discrete action set, else by Monte
        Carlo (4 samples per state from a fixed public generator)."""
        obs = _states(batch, max_rows)
        if getattr(self.policy, "continuous", False):
            gen = torch.Generator().manual_seed(2718)
            reps = obs.repeat_interleave(4, dim=0)
            actions, _ = self.policy.sample(reps, generator=gen)
            phi = self.state_action_features(reps, actions)
            return Fisher(phi.T @ phi / max(reps.shape[0], 1))
        with torch.no_grad():
            probs = torch.softmax(self.policy.logits(obs), -1).double()
        F = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        for a in range(probs.shape[1]):
            phi = self.state_action_features(obs, torch.full((obs.shape[0],), a, dtype=torch.long))
            F += (phi * probs[:, a:a + 1]).T @ phi
        return Fisher(F / max(obs.shape[0], 1))


class AdapterSpace(ParameterSpace):
    """The trainable (adapter) parameters of an ``LMPolicy`` on a batch of completions (module docstring).

    Rows of the engine: for ``user_gradients`` one row per user (its prompt, forwarded once, and its G
    completions, which share the prompt's KV cache); for ``features`` one row per completion (its prompt
    repeated: a completion's own gradient). ``policy.micro_batch`` bounds the sequences per forward pass.
    """

    def user_gradients(self, batch, weights: torch.Tensor, *, kl_coef: float = 0.0) -> torch.Tensor:
        """Row i = (1/G) sum_g [w_ig log pi(y_ig | x_i) - kl_coef sum_t k3_t], k3 the KL estimate
        exp(d) - d - 1, d = log pi_0 - log pi per token, pi_0 the initial public model (adapter off)."""
        rows, objective = self._user_rows(batch, weights, kl_coef)
        g = per_user_gradients(self.policy, rows, torch.ones(batch.users, 1), objective=objective, min_rows=1,
                               chunk=self._users_per_pass(batch.group_size))
        return self._project(g.double())

    def clipped_user_sum(self, batch, weights: torch.Tensor, scale, *, kl_coef: float = 0.0):
        """The clipped sum of ``user_gradients``' rows and their norms (``ParameterSpace.clipped_user_sum``)."""
        if self.projection is not None:
            return None
        rows, objective = self._user_rows(batch, weights, kl_coef)
        return clipped_gradient_sum(self.policy, rows, torch.ones(batch.users, 1), scale, objective=objective,
                                    min_rows=1, chunk=self._users_per_pass(batch.group_size))

    def _user_rows(self, batch, weights: torch.Tensor, kl_coef: float) -> tuple[tuple, object]:
        """The engine's rows (one per user: its prompt, its G completions, their coefficients) and objective."""
        U, G = batch.users, batch.group_size
        coef = weights.reshape(U, G) / G
        policy = self.policy
        ids, mask = batch.ids.reshape(U, G, -1), batch.token_mask.reshape(U, G, -1)
        inputs = [batch.prompt_ids, batch.prompt_mask, ids, mask, coef]
        if kl_coef > 0:
            with torch.no_grad(), policy.reference():
                ref = torch.cat([policy.token_log_probs(batch.prompt_ids[lo:lo + self._users_per_pass(G)],
                                                        batch.prompt_mask[lo:lo + self._users_per_pass(G)],
                                                        ids[lo:lo + self._users_per_pass(G)].flatten(0, 1),
                                                        mask[lo:lo + self._users_per_pass(G)].flatten(0, 1), group=G)
                                 for lo in range(0, U, self._users_per_pass(G))])
            inputs.append(ref.reshape(U, G, -1))

        def objective(pid, pmask, ids, mask, coef, ref=None):
            n = pid.shape[0]
            flat_ids, flat_mask = ids.flatten(0, 1), mask.flatten(0, 1)
            lp = policy.token_log_probs(pid, pmask, flat_ids, flat_mask, group=G)
            value = (coef.reshape(-1).to(dtype=lp.dtype, device=lp.device) * lp.sum(1)).reshape(n, G).sum(1)
            if ref is not None:
                d = (ref.flatten(0, 1) - lp) * flat_mask
                value = value - kl_coef / G * (torch.exp(d) - d - 1).sum(1).reshape(n, G).sum(1)
            return value

        return tuple(t[:, None] for t in inputs), objective  # one row per user

    def features(self, batch) -> torch.Tensor:
        """(completions, dim): row b = grad log pi(y_b | x_b), each completion with its own copy of its prompt."""
        G, policy = batch.group_size, self.policy
        pid, pm = batch.prompt_ids.repeat_interleave(G, 0), batch.prompt_mask.repeat_interleave(G, 0)

        def objective(pid, pm, ids, mask):
            return policy.token_log_probs(pid, pm, ids, mask).sum(1)

        rows = (pid[:, None], pm[:, None], batch.ids[:, None], batch.token_mask[:, None])
        g = per_user_gradients(policy, rows, torch.ones(batch.ids.shape[0], 1), objective=objective, min_rows=1,
                               chunk=max(1, policy.micro_batch))
        return self._project(g.double())

    def episode_features(self, batch) -> torch.Tensor:
        return self.features(batch)  # one step (a whole completion) per episode

    def fisher(self, batch, max_rows: int) -> Fisher:
        """F = mean over the batch's (public) completions of grad log pi grad log pi^T (Monte Carlo over
        completions sampled from a public stream), at most ``max_rows`` of them."""
        phi = self.features(batch)
        if phi.shape[0] > max_rows:
            phi = phi[torch.linspace(0, phi.shape[0] - 1, max_rows).long()]
        return SampledFisher(phi)

    def _users_per_pass(self, G: int) -> int:
        return max(1, self.policy.micro_batch // G)

    def policy_state(self) -> dict:
        return self.policy.adapter_state()

    def load_policy_state(self, state: dict) -> None:
        self.policy.load_adapter_state(state)

    def export(self, run_dir: str, round_idx: int) -> None:
        """The released LM in the ``save_pretrained`` layout (``LMPolicy.save_adapter``: a LoRA adapter, or the
        whole model, and the tokenizer): ``checkpoints/adapter_<round>/`` and ``model/`` (the latest release;
        shareable, for ``from_pretrained``)."""
        from dppo.policies.lm import MODEL_DIR

        self.policy.save_adapter(os.path.join(run_dir, "checkpoints", f"adapter_{round_idx}"))
        self.policy.save_adapter(os.path.join(run_dir, MODEL_DIR))


def _no_kl(kl_coef: float, space) -> None:
    if kl_coef > 0:
        raise ConfigError(f"algo.kl_coef penalizes the KL divergence to the initial public model, which "
                          f"{type(space.policy).__name__} does not keep; use it with policy=lm (LoRA)")


def _sum_by_user(phi: torch.Tensor, batch, weights: torch.Tensor, dim: int) -> torch.Tensor:
    """(m, dim): user i's (1/G) sum over the steps of its G rollouts of phi_t w_t."""
    G = batch.group_size
    user = torch.arange(batch.mask.shape[0])[:, None].expand_as(batch.mask)[batch.mask] // G
    out = torch.zeros(batch.users, dim, dtype=torch.float64)
    return out.index_add_(0, user, phi * weights[batch.mask].double()[:, None]) / G


def _states(batch, max_rows: int) -> torch.Tensor:
    """The batch's states (real steps), at most ``max_rows`` evenly spaced ones."""
    obs = batch.obs[batch.mask]
    if obs.shape[0] > max_rows:
        obs = obs[torch.linspace(0, obs.shape[0] - 1, max_rows).long()]
    return obs


def finite_or_fail(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t``, or a ``DataError`` before anything is released if it holds NaN/inf."""
    if not torch.isfinite(t).all():
        raise DataError(f"{what} became NaN/inf; aborting before the update")
    return t
