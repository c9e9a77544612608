"""PG (REINFORCE) and DP-PG: one learner; DP-PG is PG with the Gaussian sum release.

One round: m fresh users each get G rollouts (``dppo.algos.core``; G completions of a prompt on
``env=prompts``: the GRPO form). User i's gradient is the mean over its G rollouts of
sum_t grad log pi(a_t|s_t) A_t, with A from user i's own group, in the policy's parameter space
(``dppo.policies.spaces``: an MLP head, every parameter, a LoRA adapter), minus the gradient of
``kl_coef`` times a KL estimate to the initial public model (language models). PG steps along the mean of
the users' gradients clipped to C (the twins differ by the noise only); DP-PG along
(sum_i clip(g_i, C) + N(0, sigma^2 I)) / m with sigma from the replace-one sensitivity 2C of the
clipped sum. The release is the one every policy learner uses (``dppo.privacy.composed.composed_sums``) in its
k = 1 case: one part, ``actor``, one sum per user and round; the round opens (and is accounted) before the sum
is formed; with ``privacy.noise_correlation`` its noise is correlated across rounds, with ``privacy.multi_pass``
users are Poisson-sampled and the sum is divided by the expected count. The clipped sum is formed from the users'
norms and one weighted product per layer when the space can (``dppo.policies.per_user_grads.fused``), without
the (m, dim) matrix of per-user gradients; under torchrun each rank so forms its own users' sum and rank 0 adds
them and draws the noise once. The G rollouts of a user are one clipped contribution, so G changes neither the
sensitivity nor eps. Only trainable parameters
(``requires_grad``) get gradients and noise; the noise has the space's dimension.

``shrink`` (post-processing of the release, on by default): the step follows the positive-part James-Stein
estimate of the mean, g~ (1 - d s^2 / ||g~||^2)_+, with s the released mean's per-coordinate noise std
(public: from the calibration; 0 without noise, so the twin steps along the plain mean) and d the space's
dimension. When the noise dominates (a LoRA adapter's ~10^4 coordinates and a few users a round:
||g~||^2 ~ d s^2) the step shrinks towards 0 instead of moving the policy by the noise (the default DP-PG on
env=prompts fell from 0.65 to 0.05 in 3 rounds without it); with a clear signal it is nearly the plain
mean (docs/npg_defaults.md).
"""
from __future__ import annotations

import torch

from dppo.algos.core import GroupPolicyOptimizer
from dppo.algos.dp_adam import AdamBC
from dppo.errors import ConfigError
from dppo.policies.spaces import finite_or_fail
from dppo.privacy.composed import composed_sums

OPTIMIZERS = ("sgd", "adam", "adam_bc")
PART = "actor"   # the release's one part: the policy's gradient, one sum per user and round


def shrinkage(mean: torch.Tensor, noise_std: float) -> float:
    """(1 - d s^2 / ||g~||^2)_+ for a released mean g~ (d coordinates) carrying N(0, s^2 I) noise: the positive-part
    James-Stein factor (a function of released and public quantities only)."""
    if noise_std <= 0:
        return 1.0
    energy = float(mean.double().pow(2).sum())
    return max(0.0, 1.0 - mean.numel() * float(noise_std) ** 2 / max(energy, 1e-300))


class PolicyGradient(GroupPolicyOptimizer):
    """REINFORCE over users' groups; private (DP-PG, each round (eps, delta)-DP) iff ``eps`` is set.

    Args:
        policy, env, privacy, sampler, space, logger: injected by the builder.
        max_grad_norm: per-user clip C (top-level key).
        lr: step size of the optimizer on the (noisy) mean gradient.
        optimizer: ``sgd`` (with ``momentum``), ``adam`` (its per-coordinate scaling amplifies noise coordinates)
            or ``adam_bc`` (Adam with the release's noise variance removed from its second moment).
        momentum: SGD momentum.
        kl_coef: weight of the k3 KL estimate to the initial public model, per completion token (policy=lm).
        shrink: step along the James-Stein shrinkage of the released mean (module docstring).
        seed, rounds, group_size, reward_bound, advantage, group_std, leave_one_out, gamma: ``dppo.algos.core``.
    """

    names = ("pg", "dp_pg")
    needs = (*GroupPolicyOptimizer.needs, "max_grad_norm")
    APPLIES = {**GroupPolicyOptimizer.APPLIES, "momentum": ("optimizer", ("sgd",))}

    @classmethod
    def releases_gaussian_sums(cls, cfg) -> bool:
        """Its releases are rounds of ``dppo.privacy.composed``'s release (correlated noise applies)."""
        return True

    def __init__(self, policy, env, privacy, sampler, *, space=None, logger=None, seed: int, rounds: int,
                 group_size: int, reward_bound: float | None, max_grad_norm: float, advantage: str = "group",
                 group_std: bool = True, leave_one_out: bool = False, gamma: float = 0.99, lr: float = 1.0,
                 optimizer: str = "sgd", momentum: float = 0.9, kl_coef: float = 0.0, shrink: bool = True):
        super().__init__(policy, env, privacy, sampler, space=space, logger=logger, seed=seed, rounds=rounds,
                         group_size=group_size, reward_bound=reward_bound, advantage=advantage,
                         group_std=group_std, leave_one_out=leave_one_out, gamma=gamma)
        if max_grad_norm is None or max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        if kl_coef < 0:
            raise ConfigError(f"algo.kl_coef must be >= 0, got {kl_coef}")
        self.kl_coef, self.shrink = float(kl_coef), bool(shrink)
        if self.kl_coef > 0:
            reference = getattr(policy, "reference", None)
            if reference is None:
                raise ConfigError("algo.kl_coef penalizes the KL divergence to the initial public model, which "
                                  f"{type(policy).__name__} does not keep; use it with policy=lm (LoRA)")
            with reference():
                pass  # raises ConfigError without an adapter
        if optimizer == "adam":
            self.optimizer = torch.optim.Adam(self.space.params, lr=lr)
        elif optimizer == "adam_bc":  # Adam minus the release's (public) noise variance: dppo/algos/dp_adam.py
            self.optimizer = AdamBC(self.space.params, lr=lr)
        elif optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.space.params, lr=lr, momentum=momentum)
        else:
            raise ConfigError(f"algo.optimizer must be one of {OPTIMIZERS}, got '{optimizer}'")
        self.clip = float(max_grad_norm)
        self.release = composed_sums(privacy, parts={PART: (1, 1.0)}, sampler=sampler, rounds=self.num_rounds)

    def update(self, batch, round_idx: int, users: list[int]) -> dict:
        """The mean of the users' gradients (clipped + noised when private) and one optimizer step along it."""
        if batch is None:   # Poisson sampling drew nobody (or, under torchrun, this rank holds none of the users)
            direction, stats = self.update_direction(None, None, round_idx, [])
        else:
            A, zero_frac = self.step_advantages(batch)
            direction, stats = self.update_direction(batch, A, round_idx, users)
            stats["diag/zero_spread_fraction"] = zero_frac
        noise_std = float(stats.get("privacy/noise_std", 0.0))
        if self.shrink:
            factor = shrinkage(direction, noise_std)
            direction, stats["losses/shrinkage"], noise_std = direction * factor, factor, noise_std * factor
        if isinstance(self.optimizer, AdamBC):  # the noise variance of the direction it is given
            self.optimizer.noise_var = noise_std ** 2
        self.space.ascend(direction, self.optimizer)
        return {"losses/grad_norm": float(direction.norm()), **stats}

    def user_gradients(self, batch, A: torch.Tensor) -> torch.Tensor:
        """(m, dim): user i's mean over its G rollouts of sum_t grad log pi(a_t|s_t) A_t (minus the KL term)."""
        return finite_or_fail(self.space.user_gradients(batch, A, kl_coef=self.kl_coef), "the policy gradient")

    def update_direction(self, batch, A: torch.Tensor | None, round_idx: int, users: list[int]
                         ) -> tuple[torch.Tensor, dict]:
        """The released mean of the gradients of ``users`` (the batch's, in its order) under advantages ``A``
        (N, T) (the audited function): the round opens for them (one ledger entry), then its one noisy sum.

        Where the space offers it (``clipped_user_sum``: every trainable parameter, unprojected) the clipped
        sum is formed without the (m, dim) matrix of per-user gradients, with the release's clipping factors
        (``Release.clip_scale``); otherwise the rows of ``user_gradients`` are clipped by the release. ``batch``
        None: no users here, the sum is the zero vector (plus the noise)."""
        rel, dim = self.release, self.space.dim
        everyone, _ = rel.round_users(users)   # multi-process: every rank's users
        rel.open_round(round_idx, everyone, (self.clip,), dim=dim)
        fused = None if batch is None else self.space.clipped_user_sum(
            batch, A, lambda n: rel.clip_scale(n, self.clip), kl_coef=self.kl_coef)
        if fused is not None:
            total, norms = fused
            finite_or_fail(norms, "the policy gradient")
            noisy, stats = rel.release_clipped_sum(finite_or_fail(total, "the policy gradient"), norms, users,
                                                   self.clip, part=PART)
        else:
            rows = torch.zeros(0, dim, dtype=torch.float64) if batch is None else self.user_gradients(batch, A)
            noisy, stats = rel.release_sum(rows, users, self.clip, part=PART)
        n = max(rel.batch_size(len(everyone)), 1)   # the count, or a multi-pass release's expected count
        if rel.private:   # the released mean's per-coordinate noise std (public): the shrinkage's and AdamBC's s
            stats["privacy/noise_multiplier"] = rel.noise_multiplier
            stats["privacy/noise_std"] = rel.noise_std(self.clip, PART) / n
        return noisy / n, stats

    def distribute(self, shards) -> None:
        """Multi-process: this rank's share of each round's users; each rank clips and sums its users' gradients,
        rank 0 adds the sums and its release draws the noise once (``dppo.training.distributed.ShardedSums``)."""
        self.sampler = shards.sampler(self.sampler)
        self.release = shards.round_release(self.release, self.sampler)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
