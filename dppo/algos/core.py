"""The policy-optimization core shared by PG, NPG and REBEL: group collection, per-user advantages,
reset / evaluation / public seeds, evaluation, and the trainable-parameter view.

A round takes m fresh users; user u runs G rollouts (``group_size``) of the current policy, all from
u's own start state (``dppo.data.streams.user_reset_seeds``), with actions drawn from u's own stream
(``user_generator(run seed, u, round)``). The G rollouts are one privacy unit: every per-user
quantity below (advantages, gradients, regression rows) is a function of that user's group and of
the released policy only, so a learner's clipped contribution of user u depends on u alone.

Advantages (``advantage``):
* ``group``: A_g = (R_g - b) / s for every step of rollout g, with R_g the rollout's (clipped) return,
  b the mean of the user's G returns (``leave_one_out``: the mean of the other G - 1, as in RLOO) and
  s the std of the user's G returns (``group_std``; s = 1 otherwise). A user whose G returns are all
  equal has A = 0 (``diag/zero_spread_fraction``). Needs G >= 2.
* ``to_go``: discounted returns-to-go (``gamma``) standardized over the user's own steps (all G
  rollouts); works with G = 1 (the paper protocol: one episode per user).
No option mixes users (no batch baselines or normalizers): the same code is private and non-private.

Public rollouts (evaluation, the states of a public Fisher matrix) start from public seeds, which
are disjoint from every user's by construction (``dppo.data.streams``).
"""
from __future__ import annotations

import torch

from dppo.algos.base import Learner
from dppo.algos.rollout import Episodes, RolloutEngine, returns_to_go
from dppo.data import streams
from dppo.errors import ConfigError

ADVANTAGES = ("group", "to_go")


def group_advantages(returns: torch.Tensor, *, std: bool = True, leave_one_out: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-rollout advantages from each user's own group (rows = users, columns = its G rollouts).

    Returns (A (m, G) float64, zero_spread (m,) bool: the user's G returns were all equal).
    """
    R = returns.double()
    G = R.shape[1]
    if G < 2:
        raise ConfigError("group advantages need group_size >= 2; use algo.advantage=to_go for G = 1")
    spread = R.max(1).values - R.min(1).values
    zero = spread <= 1e-12 * R.abs().max(1).values.clamp_min(1.0)
    base = (R.sum(1, keepdim=True) - R) / (G - 1) if leave_one_out else R.mean(1, keepdim=True)
    A = R - base
    if std:
        s = R.std(1, unbiased=False, keepdim=True)
        A = A / s.clamp_min(1e-12)
    return torch.where(zero[:, None], torch.zeros_like(A), A), zero


def to_go_advantages(batch: Episodes, gamma: float) -> torch.Tensor:
    """Returns-to-go standardized over each user's own steps (its G rollouts pooled): (N, T) float64."""
    G_t = returns_to_go(batch.rewards, batch.mask, gamma)
    m = batch.grouped(batch.mask.double()).reshape(batch.users, -1)
    g = batch.grouped(G_t).reshape(batch.users, -1)
    n = m.sum(1, keepdim=True).clamp_min(1)
    mu = (g * m).sum(1, keepdim=True) / n
    sd = (((g - mu) * m) ** 2).sum(1, keepdim=True).div(n).sqrt()
    return ((g - mu) / (sd + 1e-8) * m).reshape_as(G_t)


class GroupPolicyOptimizer(Learner):
    """Base of PG / NPG / REBEL: one round = collect the users' groups, then ``update(batch, round)``.

    Args:
        policy, env, privacy, sampler: injected by the builder.
        seed, rounds, reward_bound: injected top-level keys (rewards clipped to +-reward_bound).
        group_size: G rollouts per user (top-level ``group_size``; null = the algorithm's default).
        advantage, group_std, leave_one_out, gamma: per-user advantages (module docstring).
    """

    def __init__(self, policy, env, privacy, sampler, *, seed: int = 0, rounds: int = 100,
                 reward_bound: float | None = 1.0, group_size: int = 8, advantage: str = "group",
                 group_std: bool = True, leave_one_out: bool = False, gamma: float = 0.99):
        if advantage not in ADVANTAGES:
            raise ConfigError(f"algo.advantage must be one of {ADVANTAGES}, got '{advantage}'")
        if group_size is None or int(group_size) < 1:
            raise ConfigError(f"group_size must be an integer >= 1, got {group_size}")
        if advantage == "group" and int(group_size) < 2:
            raise ConfigError("algo.advantage=group compares a user's rollouts and needs group_size >= 2; "
                              "use algo.advantage=to_go for group_size=1")
        self.policy, self.env, self.privacy, self.sampler = policy, env, privacy, sampler
        self.seed, self.num_rounds, self.reward_bound = int(seed), int(rounds), reward_bound
        self.group_size, self.advantage = int(group_size), advantage
        self.group_std, self.leave_one_out, self.gamma = bool(group_std), bool(leave_one_out), float(gamma)
        self.rollouts = RolloutEngine(env)
        self.public_env_steps = 0
        self.params = [p for p in policy.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("the policy has no trainable parameters (requires_grad=False everywhere)")

    # ---- seeds and collection --------------------------------------------------------------
    def user_reset_seeds(self, users) -> list[int]:
        """Reset seeds of the users' groups, user-major (the env's own mapping if it has one: bandit user u
        = context u, G responses to it)."""
        G = self.group_size
        if hasattr(self.env, "reset_seeds"):
            return [s for s in self.env.reset_seeds(self.seed, users) for _ in range(G)]
        return [s for u in users for s in streams.user_reset_seeds(self.seed, u, G)]

    def action_uniform_shape(self) -> tuple:
        """Uniforms per step beyond one: (d,) for a continuous policy with d > 1 action dimensions."""
        d = int(getattr(self.policy, "action_dim", 1)) if getattr(self.policy, "continuous", False) else 1
        return (d,) if d > 1 else ()

    def public_seeds(self, stream: str, round_idx: int, n: int) -> list[int]:
        seeds = streams.public_reset_seeds(self.seed, stream, round_idx, n)
        return [self.env.public_seed(s) for s in seeds] if hasattr(self.env, "public_seed") else seeds

    public_per_round = 0  # public rollouts (stream "fisher") collected alongside each round's users

    def collect(self, users, round_idx: int) -> Episodes:
        """The users' groups: G rollouts each, actions from each user's own stream for this round.

        The round's ``public_per_round`` public rollouts ride in the same vectorized batch (every row
        depends only on its own seed and uniforms, so packing them together changes nothing) and are
        kept in ``self.public_batch``.
        """
        H, k = int(self.env.horizon), self.public_per_round
        extra = self.action_uniform_shape()
        uniforms = [self.action_uniforms(streams.user_generator(self.seed, u, round_idx), (self.group_size, H) + extra)
                    for u in users]
        seeds = self.user_reset_seeds(users)
        if k:
            uniforms.append(torch.rand((k, H) + extra, generator=streams.public_generator(self.seed, "fisher", round_idx),
                                       dtype=torch.float64))
            seeds = seeds + self.public_seeds("fisher", round_idx, k)
        both = self.rollouts.run(self.policy, seeds, torch.cat(uniforms), reward_bound=self.reward_bound)
        n = len(users) * self.group_size
        self.public_batch = both.take(n, n + k) if k else None
        if k:
            self.public_env_steps += self.public_batch.env_steps
        return both.take(0, n, self.group_size)

    def action_uniforms(self, generator: torch.Generator, shape: tuple) -> torch.Tensor:
        """The uniforms of one user's rollouts (G, horizon, ...), from that user's own generator: iid U(0, 1)."""
        return torch.rand(shape, generator=generator, dtype=torch.float64)

    def public_episodes(self, stream: str, round_idx: int, n: int, greedy: bool = False) -> Episodes:
        """``n`` rollouts of the current (released) policy from public seeds, public sampling stream."""
        gen = streams.public_generator(self.seed, stream, round_idx)
        uniforms = None if greedy else torch.rand((n, int(self.env.horizon)) + self.action_uniform_shape(),
                                                  generator=gen, dtype=torch.float64)
        episodes = self.rollouts.run(self.policy, self.public_seeds(stream, round_idx, n), uniforms, reward_bound=None)
        self.public_env_steps += episodes.env_steps
        return episodes

    def step_advantages(self, batch: Episodes) -> tuple[torch.Tensor, float]:
        """(A (N, T) float64 per step, zero on padding; fraction of users with zero reward spread)."""
        if self.advantage == "to_go":
            R = batch.grouped(batch.returns)
            zero = (R.max(1).values - R.min(1).values) <= 1e-12 if self.group_size > 1 else torch.zeros(batch.users, dtype=torch.bool)
            return to_go_advantages(batch, self.gamma), float(zero.double().mean())
        A, zero = group_advantages(batch.grouped(batch.returns), std=self.group_std, leave_one_out=self.leave_one_out)
        return A.reshape(-1, 1) * batch.mask.double(), float(zero.double().mean())

    # ---- one round --------------------------------------------------------------------------
    def train_round(self, round_idx: int) -> dict:
        users = self.sampler.next_round()
        if not users:  # Poisson sampling can draw nobody: the release is then noise only (as in DP-SGD)
            return {"rollout/users": 0, "rollout/episodes": 0, **self.update(None, round_idx)}
        batch = self.collect(users, round_idx)
        stats = self.update(batch, round_idx)
        return {**self.rollout_metrics(batch), **stats}

    def update(self, batch: Episodes | None, round_idx: int) -> dict:
        """Make this round's (private) update from ``batch``; return its metrics."""
        raise NotImplementedError

    @staticmethod
    def rollout_metrics(batch: Episodes) -> dict:
        """Public counts (users, episodes = users x G) and raw diagnostics of this round's users (``diag/``)."""
        return {"rollout/users": batch.users, "rollout/episodes": batch.users * batch.group_size,
                "diag/return": float(batch.returns.mean()),
                "diag/episode_length": float(batch.lengths.double().mean()),
                "diag/env_steps": batch.env_steps, "diag/reward_clip_fraction": batch.reward_clip_fraction}

    # ---- evaluation and state -----------------------------------------------------------------
    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean return over ``episodes`` held-out episodes (public seeds, never a user's)."""
        return float(self.public_episodes("eval", 0, episodes, greedy=greedy).returns.mean())

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
