"""PG (REINFORCE) and DP-PG: one learner; DP-PG is PG with the Gaussian sum release injected.

One round: m fresh users each run G rollouts (``dppo.algos.core``); user i's gradient is the mean over
its G rollouts of sum_t grad log pi(a_t|s_t) A_t, with A from user i's own group, in the parameter
subspace of ``dppo.algos.subspace`` (``subspace=full dim=null``: every trainable parameter, plain
REINFORCE). PG steps along the mean of the users' gradients; DP-PG along
(sum_i clip(g_i, C) + N(0, sigma^2 I)) / m with sigma from the replace-one sensitivity 2C of the
clipped sum (``dppo.privacy.clipping.sum_mechanism``). The G rollouts of a user are one clipped
contribution, so G changes neither the sensitivity nor eps. Only trainable parameters
(``requires_grad``) get gradients and noise; the noise has the subspace's dimension.
"""
from __future__ import annotations

import torch

from dppo.algos.core import GroupPolicyOptimizer
from dppo.algos.subspace import PolicySubspace, per_user_gradients  # noqa: F401 - re-exported
from dppo.errors import ConfigError, DataError
from dppo.privacy.clipping import sum_mechanism


class PolicyGradient(GroupPolicyOptimizer):
    """REINFORCE over users' groups; private (DP-PG, each round (eps, delta)-DP) iff ``eps`` is set.

    Args:
        policy, env, privacy, sampler: injected by the builder.
        max_grad_norm: per-user clip C (top-level key).
        lr, optimizer, momentum: step on the (noisy) mean gradient (``adam`` or ``sgd``).
        subspace, dim: parameter subspace of the gradient (``dppo.algos.subspace``).
        group_size, advantage, group_std, leave_one_out, gamma: see ``dppo.algos.core``.
    """

    name = "pg"

    def __init__(self, policy, env, privacy, sampler, *, seed: int = 0, rounds: int = 100,
                 max_grad_norm: float = 1.0, reward_bound: float | None = 1.0, group_size: int = 8,
                 advantage: str = "group", group_std: bool = True, leave_one_out: bool = False,
                 gamma: float = 0.99, subspace: str = "auto", dim: int | None = 8, lr: float = 0.05,
                 optimizer: str = "sgd", momentum: float = 0.9):
        super().__init__(policy, env, privacy, sampler, seed=seed, rounds=rounds, reward_bound=reward_bound,
                         group_size=group_size, advantage=advantage, group_std=group_std,
                         leave_one_out=leave_one_out, gamma=gamma)
        if max_grad_norm is None or max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        self.space = PolicySubspace(policy, self.params, subspace, dim, seed)
        self.optimizer = _make_optimizer(optimizer, self.params, lr, momentum)
        self.release = sum_mechanism(privacy, max_grad_norm, sampler, self.num_rounds)

    def update(self, batch, round_idx: int) -> dict:
        """Release the mean of the users' gradients (clipped + noised when private) and step along it."""
        if batch is None:
            direction, stats = self.release.release_mean(torch.zeros(0, self.space.dim, dtype=torch.float64),
                                                         round_idx)
        else:
            A, zero_frac = self.step_advantages(batch)
            direction, stats = self.update_direction(batch, A, round_idx)
            stats["diag/zero_spread_fraction"] = zero_frac
        self.apply(direction)
        return {"losses/grad_norm": float(direction.norm()), **stats}

    def user_gradients(self, batch, A: torch.Tensor) -> torch.Tensor:
        """(m, dim): user i's mean over its G rollouts of sum_t grad log pi(a_t|s_t) A_t, in the subspace."""
        per_user = self.space.per_user_features(batch, A)
        if not torch.isfinite(per_user).all():
            raise DataError("the policy-gradient loss became NaN/inf; aborting before the update")
        return per_user

    def update_direction(self, batch, A: torch.Tensor, round_idx: int) -> tuple[torch.Tensor, dict]:
        """The released mean of the users' gradients under advantages ``A`` (N, T) (the audited function)."""
        return self.release.release_mean(self.user_gradients(batch, A), round_idx)

    def apply(self, direction: torch.Tensor) -> None:
        """Gradient ascent on J along (P) ``direction`` with the configured optimizer."""
        for p, d in zip(self.params, self.space.to_params(direction)):
            p.grad = -d
        self.optimizer.step()

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])


def _make_optimizer(name: str, params, lr: float, momentum: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    raise ConfigError(f"algo.optimizer must be 'adam' or 'sgd', got '{name}'")
