"""REBEL and DP-REBEL ([PO] Sec. 5; Gao et al. 2024, "REBEL: Reinforcement learning via regressing relative rewards").

One round: each of m fresh users contributes one start (a context, or a seeded reset) and *two*
responses from pi_t: two actions for the same context (bandit), or two trajectories from the same
reset (CartPole's dynamics are deterministic given the reset seed and the actions). REBEL solves

    theta_{t+1} = argmin_theta sum_i ( (1/eta) [log pi_theta(tau_i)/pi_t(tau_i) - log pi_theta(tau'_i)/pi_t(tau'_i)]
                                       - (R(tau_i) - R(tau'_i)) )^2.

Writing theta = theta_t + w and linearizing log pi_theta(tau) = log pi_t(tau) + w . sum_t phi(s_t, a_t)
(exact for a log-linear bandit policy: the log-partition terms of the two responses cancel), this
is the linear least squares  min_w sum_i (w . x_i - y_i)^2  with one row per user,

    x_i = sum_{t in tau_i} phi(s_t, a_t) - sum_{t in tau'_i} phi(s'_t, a'_t),   y_i = eta (R(tau_i) - R(tau'_i)),

solved by the injected oracle (dp_gd by default for DP-REBEL: per-user clipped noisy gradient
steps, composed to (eps, delta) per round). Both responses of user i enter only user i's row, so
the oracle's guarantee is the round's; the update theta <- theta_t + eta_t w is post-processing.
Rewards are clipped to +-reward_bound by the rollout; x_i and y_i are clipped by the oracle's bounds.
"""
from __future__ import annotations

import torch

from dppo.algos.npg import NaturalPolicyGradient, reset_seeds
from dppo.algos.rollout import collect_episodes
from dppo.errors import DataError


class REBEL(NaturalPolicyGradient):
    """REBEL / DP-REBEL: regression of relative rewards onto log-ratio differences through an oracle.

    Args:
        eta: REBEL's eta (the targets are eta (R - R')).
        normalize_rows: divide each user's (x_i, y_i) by max(||x_i||, 1) (a per-user rescaling that
            keeps w . x_i = y_i; it only reweights the users' squared errors).
        step: ``fixed`` (theta += lr w; lr=1 is REBEL's exact step), ``norm`` or ``kl`` (non-private).
        (others as in ``NaturalPolicyGradient``; baseline/normalize are unused: the reward
        difference of the two responses is the advantage)
    """

    name = "rebel"

    def __init__(self, policy, env, privacy, sampler, oracle, *, seed: int = 0, rounds: int = 100,
                 reward_bound: float | None = 1.0, eta: float = 1.0, normalize_rows: bool = True,
                 gamma: float = 1.0, baseline: str = "none", normalize: str = "none", subspace: str = "full",
                 head_dim: int | None = None, step: str = "fixed", lr: float = 1.0, max_kl: float = 0.01,
                 max_step_norm: float | None = None, momentum: float = 0.0, fisher_states: dict | None = None,
                 step_decay: float = 0.0, head_basis: str = "random"):  # noqa: D417
        super().__init__(policy, env, privacy, sampler, oracle, seed=seed, rounds=rounds, reward_bound=reward_bound,
                         gamma=gamma, baseline=baseline, normalize=normalize, subspace=subspace, head_dim=head_dim,
                         step=step, lr=lr, max_kl=max_kl, max_step_norm=max_step_norm, momentum=momentum,
                         fisher_states=fisher_states, step_decay=step_decay, head_basis=head_basis)
        self.eta, self.normalize_rows = float(eta), bool(normalize_rows)

    def train_round(self, round_idx: int) -> dict:
        users = self.sampler.next_round()
        seeds = reset_seeds(self.env, self.seed, users)
        first = collect_episodes(self.policy, self.env, seeds, reward_bound=self.reward_bound, generator=self.generator)
        second = collect_episodes(self.policy, self.env, seeds, reward_bound=self.reward_bound, generator=self.generator)
        x1, phi1 = self.trajectory_features(first)
        x2, phi2 = self.trajectory_features(second)
        x = x1 - x2
        y = self.eta * (first.returns - second.returns).double()
        if self.normalize_rows:
            scale = x.norm(dim=1).clamp_min(1.0)
            x, y = x / scale[:, None], y / scale
        self.public_fisher = None if self.reference_obs is None else self.space.fisher(self.reference_obs)
        w = self.oracle.solve([(x[i:i + 1], y[i:i + 1]) for i in range(len(users))], privacy=self.privacy,
                              round=round_idx, public_gram=self.public_fisher)
        if not torch.isfinite(w).all():
            raise DataError("the least-squares oracle returned a non-finite w; aborting before the update")
        self.direction = self.momentum * self.direction + w
        d = self.direction if self.momentum > 0 else w
        update = self.step_size(d, torch.cat([phi1, phi2])) * d / (1.0 + self.step_decay * round_idx)
        cap = None if self.max_step_norm is None else self.max_step_norm / (1.0 + self.step_decay * round_idx)
        if cap is not None and update.norm() > cap:
            update = update * (cap / update.norm())
        self.space.step(update)
        returns = torch.cat([first.returns, second.returns])
        lengths = torch.cat([first.lengths, second.lengths]).double()
        return {"diag/return": float(returns.mean()), "diag/episode_length": float(lengths.mean()),
                "rollout/users": len(users),
                "diag/reward_clip_fraction": (first.reward_clip_fraction + second.reward_clip_fraction) / 2,
                "diag/reward_gap": float((first.returns - second.returns).abs().mean()),
                "losses/w_norm": float(w.norm()), "losses/step_norm": float(update.norm())}

    def trajectory_features(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-user sum_t phi(s_t, a_t) (m, dim), the per-step phi rows (N, dim))."""
        phi = self.space.features(batch.obs[batch.mask], batch.actions[batch.mask])
        sums = torch.stack([p.sum(0) for p in phi.split([int(n) for n in batch.lengths])])
        return sums, phi
