"""PG (REINFORCE) and DP-PG: the same learner; DP-PG adds per-user clipping + Gaussian noise.

One round: m fresh users each run one episode; user i's gradient is
g_i = sum_t grad log pi(a_t|s_t) A_t (its whole trajectory); PG steps along mean_i g_i, DP-PG along
(sum_i clip(g_i, C) + N(0, sigma^2 I)) / m with sigma from the replace-one sensitivity 2C.
"""
from __future__ import annotations

import numpy as np
import torch

from dppo.algos.base import Learner
from dppo.algos.per_user_grads import per_user_gradients as hook_per_user_gradients
from dppo.algos.rollout import collect_episodes, returns_to_go
from dppo.envs.gym_env import user_seed
from dppo.errors import ConfigError, DataError
from dppo.privacy.clipping import GaussianSumPrivatizer, PoissonGaussianSumPrivatizer

EVAL_USER_OFFSET = 10**9  # evaluation episodes use seeds no training user has

BASELINES = ("none", "batch", "user_mean")
NORMALIZE = ("none", "batch", "user")


def per_user_gradients(policy, obs, actions, weights) -> torch.Tensor:
    """Row i = grad_theta sum_t weights[i, t] log pi(actions[i, t] | obs[i, t]) (flattened), from one
    backward pass (``dppo.algos.per_user_grads``; torch.func for layers without a rule)."""
    return hook_per_user_gradients(policy, obs, actions, weights)


def advantages(G: torch.Tensor, mask: torch.Tensor, baseline: str, normalize: str) -> torch.Tensor:
    """A_t from returns-to-go. ``batch`` options mix users (non-private only); ``user`` options use one
    user's own data, so a user's clipped gradient still depends on that user alone."""
    m = mask.double()
    if baseline == "batch":
        b = (G * m).sum(0) / m.sum(0).clamp_min(1)
        A = (G - b) * m
    elif baseline == "user_mean":
        A = (G - ((G * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp_min(1))) * m
    else:
        A = G * m
    if normalize == "batch":
        vals = A[mask]
        A = (A - vals.mean()) / (vals.std() + 1e-8) * m
    elif normalize == "user":
        n = m.sum(1, keepdim=True).clamp_min(1)
        mu = (A * m).sum(1, keepdim=True) / n
        sd = (((A - mu) * m) ** 2).sum(1, keepdim=True).div(n).sqrt()
        A = (A - mu) / (sd + 1e-8) * m
    return A


class PolicyGradient(Learner):
    """REINFORCE over users; private when ``privacy.private`` (DP-PG), each round (eps, delta)-DP.

    Args:
        policy: a ``dppo.policies.base.Policy``.
        env: a ``GymEnvFactory`` (one episode per user, reset with the user's seed).
        privacy, sampler: injected by the builder.
        lr, optimizer, momentum: step on the (noisy) mean gradient (``adam`` or ``sgd``).
        gamma: discount for returns-to-go.
        baseline, normalize: advantage shaping (``batch`` only when non-private).
    """

    name = "pg"

    def __init__(self, policy, env, privacy, sampler, *, seed: int = 0, rounds: int = 100,
                 max_grad_norm: float = 1.0, reward_bound: float | None = 1.0, lr: float = 0.01,
                 optimizer: str = "adam", momentum: float = 0.0, gamma: float = 0.99,
                 baseline: str = "none", normalize: str = "none"):
        if baseline not in BASELINES or normalize not in NORMALIZE:
            raise ConfigError(f"algo.baseline must be one of {BASELINES} and algo.normalize one of {NORMALIZE}")
        if privacy.private and ("batch" in (baseline, normalize)):
            raise ConfigError("a batch baseline/normalization mixes users and breaks the DP sensitivity bound; "
                              "use algo.baseline=user_mean|none and algo.normalize=user|none for private runs")
        if max_grad_norm is None or max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        self.policy, self.env, self.privacy, self.sampler = policy, env, privacy, sampler
        self.seed, self.num_rounds = int(seed), int(rounds)
        self.reward_bound = reward_bound
        self.gamma, self.baseline, self.normalize = float(gamma), baseline, normalize
        self.optimizer = _make_optimizer(optimizer, policy.parameters(), lr, momentum)
        self.privatizer = None
        if privacy.private:
            self.privatizer = (PoissonGaussianSumPrivatizer(privacy, max_grad_norm, sampler.sample_rate,
                                                            sampler.population_size, self.num_rounds)
                               if privacy.multi_pass else GaussianSumPrivatizer(privacy, max_grad_norm))
        self.generator = torch.Generator().manual_seed(self.seed)

    # ---- one round -----------------------------------------------------------------------
    def train_round(self, round_idx: int) -> dict:
        users = self.sampler.next_round()
        if not users:  # Poisson sampling can draw nobody: the release is then noise only (as in DP-SGD)
            return self._empty_round(round_idx)
        batch = collect_episodes(self.policy, self.env, [user_seed(self.seed, u) for u in users],
                                 reward_bound=self.reward_bound, generator=self.generator)
        G = returns_to_go(batch.rewards, batch.mask, self.gamma)
        A = advantages(G, batch.mask, self.baseline, self.normalize)
        direction, stats = self.update_direction(batch, A, round_idx, len(users))
        self.apply(direction)
        return {"diag/return": float(batch.returns.mean()), "diag/episode_length": float(batch.lengths.double().mean()),
                "rollout/users": len(users), "diag/reward_clip_fraction": batch.reward_clip_fraction,
                "losses/grad_norm": float(direction.norm()), **stats}

    def update_direction(self, batch, A, round_idx: int, m: int) -> tuple[torch.Tensor, dict]:
        """Mean per-user gradient (PG) or its private release (DP-PG)."""
        if self.privatizer is None:
            self.policy.zero_grad()
            logp = self.policy.log_prob(batch.obs[batch.mask], batch.actions[batch.mask])
            (-(logp * A[batch.mask].float()).sum() / max(m, 1)).backward()
            d = torch.cat([-p.grad.reshape(-1) for p in self.policy.parameters()])
            if not torch.isfinite(d).all():
                raise DataError("the policy-gradient loss became NaN/inf; aborting before the update")
            return d, {}
        per_user = per_user_gradients(self.policy, batch.obs, batch.actions, A)
        d, stats = self.privatizer.release_mean(per_user, round_idx)
        return d.float(), stats

    def _empty_round(self, round_idx: int) -> dict:
        """A Poisson round that sampled nobody still releases (noise only), as in DP-SGD."""
        stats = {}
        if self.privatizer is not None:
            n_params = sum(p.numel() for p in self.policy.parameters())
            d, stats = self.privatizer.release_mean(torch.zeros(0, n_params), round_idx)
            self.apply(d.float())
        return {"rollout/users": 0, **stats}

    def apply(self, direction: torch.Tensor) -> None:
        """Gradient ascent on J along ``direction`` with the configured optimizer."""
        offset = 0
        for p in self.policy.parameters():
            n = p.numel()
            p.grad = -direction[offset:offset + n].view_as(p).to(p.dtype)
            offset += n
        self.optimizer.step()

    # ---- evaluation and state ---------------------------------------------------------------
    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        seeds = [user_seed(self.seed, EVAL_USER_OFFSET + i) for i in range(episodes)]
        gen = torch.Generator().manual_seed(self.seed + 99991)
        return float(collect_episodes(self.policy, self.env, seeds, reward_bound=None, generator=gen,
                                      greedy=greedy).returns.mean())

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


def _make_optimizer(name: str, params, lr: float, momentum: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    raise ConfigError(f"algo.optimizer must be 'adam' or 'sgd', got '{name}'")


def np_seed_everything(seed: int) -> None:
    """Seed python, numpy and torch global RNGs (the learner also keeps its own generator)."""
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
