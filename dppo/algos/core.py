"""The policy-optimization core shared by PG, NPG and REBEL: the round, per-user advantages, evaluation, state.

One learner per family, for every env and policy: the learner talks to the env through its *collector*
(``dppo.envs.rollout.EpisodeCollector`` for gymnasium envs and the bandit, ``dppo.envs.prompts.PromptCollector``
for prompts) and to the policy through its *parameter space* (``dppo.policies.spaces``: an MLP head, every
parameter, or a language model's LoRA adapter). Neither side knows which learner asks.

A round takes m fresh users; user u gets G rollouts (``group_size``; completions of its prompt on
``env=prompts``) of the current policy, all from u's own start state, with actions drawn from u's own
stream. The G rollouts are one privacy unit: every per-user quantity below (advantages, gradients,
regression rows) is a function of that user's group and of the released policy only, so a learner's
clipped contribution of user u depends on u alone.

Advantages (``advantage``):
* ``group``: A_g = (R_g - b) / s for every step of rollout g, with R_g the rollout's (clipped) return,
  b the mean of the user's G returns (``leave_one_out``: the mean of the other G - 1, as in RLOO) and
  s the std of the user's G returns (``group_std``; s = 1 otherwise). A user whose G returns are all
  equal has A = 0 (``diag/zero_spread_fraction``). Needs G >= 2.
* ``to_go``: discounted returns-to-go (``gamma``) standardized over the user's own steps (all G
  rollouts); works with G = 1 (the paper protocol: one episode per user).
``explore_bonus`` c > 0 adds c * b(tau) to every rollout's return before the group advantages, with b(tau)
in [0, 1] the mean over the observation's bounded coordinates of the range the rollout's states cover,
(max_t s_k - min_t s_k) / (high_k - low_k) (``range_bonus``; the bounds are the env's public observation
space): on MountainCar every rollout of a random policy returns -200 and only the bonus tells them apart
(the car that swings wider), until the goal is reached and the return takes over. A function of the
rollout alone, so the privacy unit and the sensitivity are unchanged. Learners with per-step rewards (DP-PPO)
take the same bonus spread over the steps (``range_bonus_steps``, ``step_rewards``: step t earns the growth of the
range when s_{t+1} is seen; the steps sum to c * b(tau)).
No option mixes users (no batch baselines or normalizers): the same code is private and non-private.
"""
from __future__ import annotations

import torch

from dppo.algos.base import Learner
from dppo.envs.rollout import EpisodeCollector, returns_to_go
from dppo.errors import ConfigError
from dppo.policies.spaces import make_space

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


def range_bonus(batch, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """(N,) float64 in [0, 1]: per episode, the mean over the coordinates k with finite bounds of
    (max_t s_tk - min_t s_tk) / (high_k - low_k) over its real steps (0 if no coordinate is bounded)."""
    low = torch.as_tensor(low, dtype=torch.float64).reshape(-1)
    high = torch.as_tensor(high, dtype=torch.float64).reshape(-1)
    keep = torch.isfinite(low) & torch.isfinite(high) & (high > low)
    if not bool(keep.any()):
        return torch.zeros(batch.mask.shape[0], dtype=torch.float64)
    obs = batch.obs.double().flatten(2)[:, :, keep]
    m = batch.mask[:, :, None]
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    top = torch.where(m, obs, -inf).max(1).values
    bottom = torch.where(m, obs, inf).min(1).values
    return ((top - bottom).clamp_min(0) / (high - low)[keep]).clamp(0, 1).mean(1)


def range_bonus_steps(batch, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """(N, T) float64: the state-range bonus spread over the steps. Step t gets the growth of the range its
    rollout covers when s_{t+1} is seen, b(s_0..s_{t+1}) - b(s_0..s_t) (b as in ``range_bonus``, over the states so
    far); 0 on the last real step and on padding, so each row sums to ``range_bonus(batch, low, high)``. A
    function of the rollout's own states (and the public bounds) only: a per-step reward for learners that
    bootstrap (DP-PPO's GAE), where a bonus on the last step alone would reach the early actions discounted."""
    low = torch.as_tensor(low, dtype=torch.float64).reshape(-1)
    high = torch.as_tensor(high, dtype=torch.float64).reshape(-1)
    keep = torch.isfinite(low) & torch.isfinite(high) & (high > low)
    N, T = batch.mask.shape
    if not bool(keep.any()):
        return torch.zeros(N, T, dtype=torch.float64)
    obs = batch.obs.double().flatten(2)[:, :, keep]
    m = batch.mask[:, :, None]
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    top = torch.where(m, obs, -inf).cummax(1).values      # padding follows the real steps: the prefix extremes
    bottom = torch.where(m, obs, inf).cummin(1).values    # stay those of the whole rollout there
    covered = ((top - bottom).clamp_min(0) / (high - low)[keep]).clamp(0, 1).mean(2)  # (N, T) b(s_0..s_t)
    out = torch.zeros(N, T, dtype=torch.float64)
    out[:, :-1] = covered[:, 1:] - covered[:, :-1]
    return out * batch.mask


def to_go_advantages(batch, gamma: float) -> torch.Tensor:
    """Returns-to-go standardized over each user's own steps (its G rollouts pooled): (N, T) float64."""
    G_t = returns_to_go(batch.rewards, batch.mask, gamma)
    m = batch.grouped(batch.mask.double()).reshape(batch.users, -1)
    g = batch.grouped(G_t).reshape(batch.users, -1)
    n = m.sum(1, keepdim=True).clamp_min(1)
    mu = (g * m).sum(1, keepdim=True) / n
    sd = (((g - mu) * m) ** 2).sum(1, keepdim=True).div(n).sqrt()
    return ((g - mu) / (sd + 1e-8) * m).reshape_as(G_t)


def collector_for(env, seed: int):
    """The env side of the learner interface: the env's own collector (``env.collector(seed)``, e.g. prompts),
    else an ``EpisodeCollector`` over its episodes."""
    make = getattr(env, "collector", None)
    return make(seed) if callable(make) else EpisodeCollector(env, seed)


class GroupPolicyOptimizer(Learner):
    """Base of PG / NPG / REBEL: one round = collect the users' groups, then ``update(batch, round)``.

    Args:
        policy, env, privacy, sampler: injected by the builder.
        space: the policy's parameter space (``dppo.policies.spaces.make_space``; built from ``policy`` if None).
        collector: the env side (``collector_for(env, seed)`` if None; a learner passes its own, e.g. PPO's users'
            horizon and correlated sampling uniforms).
        logger: injected (text examples of ``env=prompts``).
        seed, rounds, group_size, reward_bound: top-level keys (rewards clipped to +-reward_bound).
        advantage, group_std, leave_one_out, gamma: per-user advantages (module docstring).
        average_last: k; the final policy is the average (1/k) sum_{t=T-k+1..T} theta_t of the parameters after
            the last k rounds' steps (tail averaging of released iterates: post-processing; 0 or 1: the last
            iterate). A learner calls ``average_tail(round)`` after its step.
    """

    public_per_round = 0  # public rollouts (stream "fisher") collected alongside each round's users
    reads = ("users_per_round",)  # the sampler's round size
    needs = ("policy", "env", "privacy", "sampler", "space", "logger", "seed", "rounds", "group_size", "reward_bound")
    APPLIES = {"gamma": ("advantage", ("to_go",)), "group_std": ("advantage", ("group",)),
               "leave_one_out": ("advantage", ("group",)), "explore_bonus": ("advantage", ("group",))}

    def __init__(self, policy, env, privacy, sampler, *, space=None, logger=None, seed: int, rounds: int,
                 group_size: int, reward_bound: float | None, advantage: str = "group", group_std: bool = True,
                 leave_one_out: bool = False, gamma: float = 0.99, explore_bonus: float = 0.0,
                 average_last: int = 0, collector=None):
        if explore_bonus < 0:
            raise ConfigError(f"algo.explore_bonus must be >= 0, got {explore_bonus}")
        if int(average_last) < 0:
            raise ConfigError(f"algo.average_last must be >= 0 (0: the last iterate), got {average_last}")
        if advantage not in ADVANTAGES:
            raise ConfigError(f"algo.advantage must be one of {ADVANTAGES}, got '{advantage}'")
        if advantage == "group" and int(group_size) < 2:
            raise ConfigError("algo.advantage=group compares a user's rollouts and needs group_size >= 2; "
                              "use algo.advantage=to_go for group_size=1")
        self.policy, self.env, self.privacy, self.sampler, self.logger = policy, env, privacy, sampler, logger
        self.seed, self.num_rounds, self.reward_bound = int(seed), int(rounds), reward_bound
        self.group_size, self.advantage = int(group_size), advantage
        self.group_std, self.leave_one_out, self.gamma = bool(group_std), bool(leave_one_out), float(gamma)
        self.explore_bonus = float(explore_bonus)
        self.space = space if space is not None else make_space(policy, seed=seed)
        self.collector = collector if collector is not None else collector_for(env, seed)
        self.collector.check(policy, self.num_rounds, sampler)
        self.public_batch = None
        self.average_last = int(average_last)
        self.tail_sum: list[torch.Tensor] | None = None  # sum of the parameters of the tail's rounds so far

    # ---- one round --------------------------------------------------------------------------
    def train_round(self, round_idx: int) -> dict:
        users = self.sampler.next_round()
        if not users:  # Poisson sampling can draw nobody: the release is then noise only (as in DP-SGD)
            self.public_batch = None
            return {"rollout/users": 0, "rollout/episodes": 0, **self.update(None, round_idx, [])}
        batch = self.collect(users, round_idx)
        stats = self.update(batch, round_idx, [int(u) for u in users])
        self.collector.log_examples(self.policy, self.logger, round_idx)
        return {**batch.metrics(), **stats}

    def collect(self, users, round_idx: int):
        """The users' groups of this round (and its ``public_per_round`` public rollouts, in ``public_batch``)."""
        batch, self.public_batch = self.collector.users(self.policy, users, round_idx, self.group_size,
                                                        self.reward_bound, public=self.public_per_round)
        return batch

    def update(self, batch, round_idx: int, users: list[int]) -> dict:
        """Make this round's (private) update from ``batch``, the groups of ``users`` (this round's user ids, in
        the batch's order; None and [] when nobody was drawn); return its metrics."""
        raise NotImplementedError

    def average_tail(self, round_idx: int) -> None:
        """Add theta_t to the tail's sum on the last ``average_last`` rounds; after the last round's step the
        policy becomes their mean (released parameters only; the window depends on ``rounds`` alone)."""
        start = max(self.num_rounds - self.average_last, 0)
        if self.average_last <= 1 or round_idx < start:
            return
        theta = [p.detach().double().clone() for p in self.space.params]
        if round_idx == start or self.tail_sum is None:
            self.tail_sum = theta
        else:
            self.tail_sum = [s + t for s, t in zip(self.tail_sum, theta)]
        if round_idx == self.num_rounds - 1:
            count = self.num_rounds - start
            with torch.no_grad():
                for p, s in zip(self.space.params, self.tail_sum):
                    p.copy_((s / count).to(p.dtype))
            self.tail_sum = None

    def step_advantages(self, batch) -> tuple[torch.Tensor, float]:
        """(A (N, T) float64 per step, zero on padding; fraction of users with zero reward spread)."""
        if self.advantage == "to_go":
            R = batch.grouped(batch.returns)
            zero = (R.max(1).values - R.min(1).values) <= 1e-12 if self.group_size > 1 else \
                torch.zeros(batch.users, dtype=torch.bool)
            return to_go_advantages(batch, self.gamma), float(zero.double().mean())
        A, zero = group_advantages(batch.grouped(self.returns(batch)), std=self.group_std,
                                   leave_one_out=self.leave_one_out)
        return A.reshape(-1, 1) * batch.mask.double(), float(zero.double().mean())

    def returns(self, batch) -> torch.Tensor:
        """(N,) each rollout's return, plus ``explore_bonus`` times its state-range bonus (a function of the rollout
        and of the env's public observation bounds only)."""
        if self.explore_bonus == 0:
            return batch.returns
        space = self._bonus_space(batch)
        return batch.returns.double() + self.explore_bonus * range_bonus(batch, space.low, space.high)

    def step_rewards(self, batch) -> torch.Tensor:
        """(N, T) each step's clipped reward plus ``explore_bonus`` times its share of the rollout's state-range
        bonus (``range_bonus_steps``: the rows sum to ``returns(batch)``); the rewards alone if the bonus is off."""
        if self.explore_bonus == 0:
            return batch.rewards
        space = self._bonus_space(batch)
        return batch.rewards.double() + self.explore_bonus * range_bonus_steps(batch, space.low, space.high)

    def _bonus_space(self, batch):
        """The env's public observation bounds the state-range bonus is scaled by (a bounded Box space)."""
        space = getattr(self.env, "observation_space", None)
        if getattr(space, "low", None) is None or getattr(batch, "obs", None) is None:
            raise ConfigError("algo.explore_bonus needs an env with a bounded Box observation space (e.g. MountainCar)")
        return space

    # ---- evaluation, state, artifacts ---------------------------------------------------------
    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean return over ``episodes`` held-out public episodes (never a user's)."""
        return self.collector.evaluate(self.policy, episodes, greedy)

    def evaluate_episodes(self, episodes: int, greedy: bool = False):
        """The held-out public episodes ``evaluate`` averages, one by one (None where the collector plays none)."""
        return self.collector.evaluate_episodes(self.policy, episodes, greedy)

    selects_final = True

    def evaluate_candidate(self, episodes: int, greedy: bool = False) -> float:
        """Mean return over ``episodes`` public selection episodes (the collector's ``select`` stream: public seeds
        and sampling, disjoint from ``evaluate``'s)."""
        return self.collector.evaluate(self.policy, episodes, greedy, stream="select")

    def summary(self) -> dict:
        return {"group_size": self.group_size, **self.collector.summary(self.policy)}

    def state_dict(self) -> dict:
        state = {"policy": self.space.policy_state()}
        if self.tail_sum is not None:  # inside the averaged tail: its running sum
            state["tail_sum"] = [t.clone() for t in self.tail_sum]
        return state

    def load_state_dict(self, state: dict) -> None:
        self.space.load_policy_state(state["policy"])
        self.tail_sum = [t.clone() for t in state["tail_sum"]] if "tail_sum" in state else None

    def released_modules(self) -> dict:
        return {"policy": self.policy}

    @property
    def public_env_steps(self) -> int | None:
        """The collector's count of its public rollouts' env steps (``EpisodeCollector.public_env_steps``); None for
        a collector that counts none (the env's side, which may be a user's: the count is optional there)."""
        return getattr(self.collector, "public_env_steps", None)

    @public_env_steps.setter
    def public_env_steps(self, value: int) -> None:
        if getattr(self.collector, "public_env_steps", None) is not None:
            self.collector.public_env_steps = int(value)

    def export_artifacts(self, run_dir: str, round_idx: int) -> None:
        self.space.export(run_dir, round_idx)
