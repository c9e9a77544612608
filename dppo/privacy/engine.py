"""``dppo.make_private``: your own module, optimizer and loader of users, made private in Opacus' shape.

    module, optimizer, rounds = dppo.make_private(module=model, optimizer=opt, eps=5.0, max_grad_norm=1.0,
                                                  users_per_round=64)
    for users in rounds:                      # each round: fresh users, accounted (one ledger entry) as it starts
        loss = per_user_loss(model, users)    # (len(users),): user u's loss from u's own data only
        optimizer.step(loss, users)           # clipped per user, noised, stepped; the accountant steps itself
    optimizer.privacy_spent()                 # (eps, delta), from the accountant

Several parts (an actor and a critic, each with its own optimizer, clip and share of the budget) are dicts keyed by
part name, with dicts back. Everything private goes through the one release of clipped per-user sums
(``dppo.privacy.composed``), which is the gatekeeper: it computes each user's gradient from that user's loss
and clips it itself, takes a round's users only from the loader it returned (checked fresh by the run's user gate:
one-pass), allows each user at most ``releases_per_user`` steps of a part per round, and its ledger entry is the one
``algo=dp_ppo`` (or ``algo=dp_pg``) writes for the same settings. The only thing trusted is that ``loss[i]`` is a
function of user ``users[i]``'s own data and of public or released quantities (as Opacus trusts a module without
cross-sample layers; a module with batch normalization is refused).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from dppo.data.sampler import OnePassUserSampler
from dppo.errors import ConfigError, PrivacyError
from dppo.privacy.composed import composed_sums
from dppo.privacy.context import PrivacyContext
from dppo.privacy.noise import NoiseSource


class PrivacyEngine:
    """The privacy context and the release of a loop made private by ``make_private`` (its ``engine``)."""

    def __init__(self, privacy: PrivacyContext, parts: dict, clips: dict, composition: str = "gdp"):
        self.privacy, self.clips = privacy, clips
        self.release = composed_sums(privacy, parts=parts, composition=composition)
        self.round = -1
        self.users: list[int] = []

    def open(self, users) -> list[int]:
        """Start the next round for ``users``: the release opens (and is accounted) before any step of it."""
        self.round += 1
        self.release.open_round(self.round, users, tuple(self.clips[p] for p in self.release.parts))
        self.users = [int(u) for u in users]
        return list(self.users)

    def privacy_spent(self) -> tuple[float, float]:
        """(eps, delta) spent, from the accountant; a non-private loop (eps=None) has no guarantee: (inf, 1)."""
        return self.privacy.spent() if self.privacy.private else (math.inf, 1.0)

    def state_dict(self) -> dict:
        """What a resume needs (secret: the user gate names ids): the context's state and the round."""
        return {"privacy": self.privacy.state_dict(), "round": self.round}

    def load_state_dict(self, state: dict) -> None:
        self.privacy.load_state_dict(state["privacy"])
        self.round = int(state["round"])


class PrivateOptimizer:
    """The user's optimizer, stepped along the released mean of the round's clipped per-user gradients."""

    def __init__(self, optimizer: torch.optim.Optimizer, module: nn.Module, engine: PrivacyEngine, part):
        self.optimizer, self.module, self.engine, self.part = optimizer, module, engine, part
        self.params = [p for p in module.parameters() if p.requires_grad]
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if not owned or not owned <= {id(p) for p in self.params}:
            raise ConfigError("make_private: the optimizer must step the module's own trainable parameters")

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, loss: torch.Tensor, users) -> dict:
        """One step on ``loss`` (one value per user of ``users``, ids of the current round): each user's gradient
        is clipped to the part's max_grad_norm, the sum released with noise, divided by the (public) count and
        stepped. Returns the step's raw diagnostics (``diag/clip_fraction``)."""
        if self.engine.round < 0:
            raise PrivacyError("optimizer.step before a round started: iterate the loader make_private returned")
        users = list(users)
        if loss.dim() != 1 or loss.shape[0] != len(users):
            raise PrivacyError(f"optimizer.step: loss of shape {tuple(loss.shape)} for {len(users)} users; pass one "
                               f"loss per user (each a function of that user's own data)")
        rows = per_user_gradients(loss, self.params)
        noisy, stats = self.engine.release.release_sum(rows, users, part=self.part)
        mean = noisy / max(self.engine.release.batch_size(len(users)), 1)
        lo = 0
        for p in self.params:
            p.grad = mean[lo:lo + p.numel()].reshape(p.shape).to(p.dtype)
            lo += p.numel()
        self.optimizer.step()
        return stats

    def privacy_spent(self) -> tuple[float, float]:
        return self.engine.privacy_spent()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


class RoundLoader:
    """The rounds of users: each item a fresh round's user ids, its release opened (accounted) as it is yielded."""

    def __init__(self, engine: PrivacyEngine, source, rounds: int | None):
        self.engine, self.source, self.rounds = engine, source, rounds

    def __iter__(self):
        produced = 0
        for users in self.source:
            if self.rounds is not None and produced >= self.rounds:
                return
            yield self.engine.open(users)
            produced += 1

    def __len__(self) -> int:
        if self.rounds is None:
            raise TypeError("this loader of users has no length (rounds=None)")
        return int(self.rounds)


def per_user_gradients(loss: torch.Tensor, params: list) -> torch.Tensor:
    """(b, P) float64: row i the gradient of loss[i] in ``params``, flattened (one vectorized backward pass, or
    one per user where an operation has no batched rule)."""
    b = loss.shape[0]
    if b == 0:
        return torch.zeros(0, sum(p.numel() for p in params), dtype=torch.float64)
    try:
        grads = torch.autograd.grad(loss, params, grad_outputs=torch.eye(b, dtype=loss.dtype), is_grads_batched=True,
                                    allow_unused=True, retain_graph=True)
        rows = [torch.zeros(b, p.numel()) if g is None else g.reshape(b, -1) for g, p in zip(grads, params)]
    except RuntimeError:
        rows = []
        for i in range(b):
            gs = torch.autograd.grad(loss[i], params, allow_unused=True, retain_graph=True)
            rows.append(torch.cat([torch.zeros(p.numel()) if g is None else g.reshape(-1) for g, p in zip(gs, params)]))
        return torch.stack(rows).double()
    return torch.cat(rows, dim=1).double()


def _per_part(value, names, what):
    if isinstance(value, dict):
        if set(value) != set(names):
            raise ConfigError(f"make_private: {what} must name the parts {list(names)}, got {list(value)}")
        return {n: value[n] for n in names}
    return {n: value for n in names}


def make_private(module, optimizer, *, eps: float | None, delta: float = 1e-5, max_grad_norm,
                 releases_per_user=1, share: dict | None = None, data_loader=None, users_per_round: int | None = None,
                 population_size: int | None = None, rounds: int | None = None, noise_seed: int | None = None,
                 composition: str = "gdp", seed: int = 0):
    """Wrap your module(s), optimizer(s) and loader of users (module docstring); returns them.

    Args:
        module, optimizer: an ``nn.Module`` and its optimizer, or dicts of them keyed by part name (the order of
            ``module``'s keys is the order of the parts; ``algo=dp_ppo``'s are ``actor`` then ``critic``).
        eps, delta: each round's (eps, delta) over its users (one-pass: the run's, by parallel composition);
            eps=None: the non-private twin (the same clipped steps, no noise).
        max_grad_norm: each user's gradient clip (per part: a dict).
        releases_per_user: how many steps of a part one user takes per round (PPO: epochs; a dict per part).
        share: each part's share of the round's budget (default k_p / k: equal noise).
        data_loader: an iterable of rounds, each a list of user ids (checked fresh); or, without one,
            ``users_per_round`` fresh ids per round from dppo's one-pass sampler (of ``population_size``, seeded
            order ``seed``). ``rounds``: stop after this many.
        noise_seed: seeded, reproducible noise (labelled ``seeded``; the OS CSPRNG otherwise).
        composition: ``gdp`` (exact) or ``rdp``.

    Returns:
        (module, optimizer, loader): the module(s) unchanged, ``PrivateOptimizer``(s) whose ``step(loss, users)``
        releases, and the loader of rounds (``RoundLoader``).
    """
    names = list(module) if isinstance(module, dict) else [None]
    modules = module if isinstance(module, dict) else {None: module}
    optimizers = _per_part(optimizer, names, "optimizer") if isinstance(optimizer, dict) else {names[0]: optimizer}
    if len(optimizers) != len(names):
        raise ConfigError("make_private: one optimizer per module")
    for m in modules.values():
        if any(isinstance(x, nn.modules.batchnorm._BatchNorm) for x in m.modules()):
            raise ConfigError("make_private: batch normalization mixes users' data in one loss; use GroupNorm or "
                              "LayerNorm (as Opacus requires)")
    clips = {n: float(c) for n, c in _per_part(max_grad_norm, names, "max_grad_norm").items()}
    ks = {n: int(k) for n, k in _per_part(releases_per_user, names, "releases_per_user").items()}
    total = sum(ks.values())
    shares = {n: ks[n] / total for n in names} if share is None else _per_part(share, names, "share")
    noise = NoiseSource(noise_seed, secure=False) if noise_seed is not None else None
    engine = PrivacyEngine(PrivacyContext(eps, delta, noise=noise), {n: (ks[n], float(shares[n])) for n in names},
                           clips, composition)
    if data_loader is None:
        if users_per_round is None:
            raise ConfigError("make_private: pass data_loader= (rounds of user ids) or users_per_round=")
        sampler = OnePassUserSampler(int(users_per_round), population_size, seed=seed)
        data_loader = iter(sampler.next_round, None)
    loader = RoundLoader(engine, data_loader, rounds)
    wrapped = {n: PrivateOptimizer(optimizers[n], modules[n], engine, n) for n in names}
    if names == [None]:
        return module, wrapped[None], loader
    return module, wrapped, loader
