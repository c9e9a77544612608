"""Audit of the DP-PPO round: ``PPO.update`` with its composed releases (``dppo.privacy.composed``).

Neighbours: a real CartPole round of m users with G rollouts each (small actor and critic, rollouts by the
project's ``RolloutEngine`` from each user's own streams), in which the user at position 0 is a canary who
controls *all G of its rollouts*: in D every reward of its episodes is +reward_bound, in D' -reward_bound
(the bounds the sensitivity allows), nothing else changed. The clip norms are small, so the canary's actor
and critic vectors are clipped in every release it takes part in (2 x epochs of them).

Distinguisher: the log-likelihood ratio of the transcript (white-box). Given the history, a release y_j is
Gaussian around S_j + c_j under D and S_j + c'_j under D' (S_j: the other users' clipped sum, c_j / c'_j:
the canary's clipped vector under D / D' at the current parameters), so

    score = sum_j [ ||y_j - S_j - c'_j||^2 - ||y_j - S_j - c_j||^2 ] / (2 sigma_j^2)

is the privacy loss itself: N(mu^2/2, mu^2) under D with mu^2 = sum_j ||c_j - c'_j||^2 / sigma_j^2, at most
the calibrated (2C sqrt(k) / (2 z C))^2 = k / z^2. Two audits use it:

* ``dp_ppo_round`` (``audit_dp_ppo``): the learner's whole round, unchanged (GAE, the public minibatch
  schedule, Adam steps between releases: adaptive). The learner's release object is wrapped (the
  learner's ``release`` attribute, an injected object; no module is patched): each call passes through,
  and for releases touching the canary the wrapper recomputes the canary's vector under the other
  hypothesis with the learner's own ``round_targets`` / ``minibatch_gradients``. Each trial reruns the
  round from the same initial state (policy, critic, Adam) with fresh noise; trials are sequential
  (the parameters diverge after the first release), so this row has fewer trials.
* ``dp_ppo_releases`` (``audit_dp_ppo_releases``): the mechanism through its public interface,
  ``open_round`` then ``release_sum`` for every (epoch, minibatch, actor / critic) of the learner's own
  ``schedule``, the per-user vectors being the learner's ``minibatch_gradients`` at the round's start
  (the non-adaptive case, to which Gaussian-DP composition reduces the adaptive one). The mechanism
  broadcasts over ``StackedNoise``, so one pass gives ``chunk`` independent transcripts.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.audit.trials import StackedNoise
from dppo.privacy.release import clip_per_user
from dppo.privacy.noise import NoiseSource

ENTRY = "dppo.algos.ppo.PPO.update (every release_sum read where the learner steps)"
ENTRY_RELEASES = ("ComposedGaussianSums.open_round + release_sum over PPO.schedule (PPO.minibatch_gradients "
                  "at the round's start)")


def _loss(y, others, c_D, c_Dp, sigma):
    """The log-likelihood ratio (D against D') of one release y (..., d)."""
    r = y - others
    return (((r - c_Dp) ** 2).sum(-1) - ((r - c_D) ** 2).sum(-1)) / (2 * sigma ** 2)


class TranscriptScore:
    """Wraps the learner's release mechanism: passes every call through, and adds to ``score`` the
    log-likelihood ratio (D against D') of each release that contains the canary."""

    fused = False   # the score reads every user's rows: the learner then passes them to release_sum (not fused)

    def __init__(self, inner, learner, canary: int, targets_D: dict, targets_Dp: dict):
        self.inner, self.learner, self.canary = inner, learner, int(canary)
        self.targets = (targets_D, targets_Dp)
        self.score, self.releases, self._pending = 0.0, 0, None

    def __getattr__(self, name):   # noise_multiplier, sigma, mechanism, ...
        return getattr(self.inner, name)

    def open_round(self, round_idx, users, clips):
        self.score, self._pending = 0.0, None
        return self.inner.open_round(round_idx, users, clips)

    def release_sum(self, per_user, users, clip, part=None):
        y, stats = self.inner.release_sum(per_user, users, clip, part=part)
        users = list(users)
        if self.canary in users:
            i = users.index(self.canary)
            if self._pending is None:   # the step's actor sum: both hypotheses' canary vectors at these parameters
                pos = torch.tensor([0])  # the canary's position in the round
                self._pending = [[self.learner.minibatch_gradients(t, pos)[j][0] for t in self.targets]
                                 for j in (0, 1)]
            c_D, c_Dp = (clip_per_user(v[None], clip)[0][0] for v in self._pending.pop(0))
            others = clip_per_user(torch.cat([per_user[:i], per_user[i + 1:]]), clip)[0].sum(0)
            self.score += float(_loss(y, others, c_D, c_Dp, self.inner.sigma(clip, part)))
            self.releases += 1
            if not self._pending:
                self._pending = None
        return y, stats


def build_round(eps: float, delta: float, *, users: int = 2, group_size: int = 1, epochs: int = 2,
                minibatches: int = 2, clip: float = 1e-3, seed: int = 0, noise=None, actor_share: float = 0.5,
                privacy=None, sampler=None, rounds: int = 10 ** 9):
    """A DP-PPO learner, one collected CartPole round of users 0..users-1 (user 0 the canary) and its two
    neighbours (batches D, D').

    ``privacy``, ``sampler``, ``rounds``: the learner's context, user sampler and planned rounds (default: a
    one-pass context of ``eps``, ``delta``, ``noise`` and a ``OnePassUserSampler``; the multi-pass audit passes
    its own)."""
    from dppo.algos.ppo import PPO
    from dppo.data.sampler import OnePassUserSampler
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.policies.mlp import MLPPolicy
    from dppo.privacy.context import PrivacyContext

    torch.manual_seed(seed)
    env = GymEnvFactory("CartPole-v1", horizon=12)
    policy = MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    if privacy is None:
        privacy = PrivacyContext(eps, delta, noise=noise if noise is not None else NoiseSource(seed),
                                 check_users=False)   # every trial round releases the same users (trial_context)
    sampler = sampler if sampler is not None else OnePassUserSampler(users, seed=seed)
    learner = PPO(policy, env, privacy, sampler, seed=seed, rounds=rounds,
                  max_grad_norm=clip, critic_max_grad_norm=clip, group_size=group_size, epochs=epochs,
                  minibatches=minibatches, ent_coef=0.01, lr=0.05, critic_hidden_sizes=(4,), reward_bound=1.0,
                  actor_share=actor_share)
    batch = learner.collect(list(range(users)), 0)
    G = batch.group_size
    D, Dp = copy.copy(batch), copy.copy(batch)
    for b, sign in ((D, 1.0), (Dp, -1.0)):   # the canary's rewards at the bounds, nothing else changed
        b.rewards = batch.rewards.clone()
        b.rewards[:G] = sign * batch.mask[:G].double()
        b.returns = b.rewards.sum(1)
    return learner, D, Dp


def audit_dp_ppo(eps: float, delta: float = 1e-5, trials: int = 20_000, *, seed: int = 0, users: int = 2,
                 epochs: int = 2, minibatches: int = 2, release=None, actor_share: float = 0.5) -> MechanismAudit:
    """``trials`` rounds of the learner (half on D, half on D'), bounded from the transcript's privacy loss.

    Args:
        eps, delta: the learner's privacy target (its ``PrivacyContext``).
        trials: total rounds.
        users, epochs, minibatches: the round (the canary takes part in 2 x epochs releases).
        actor_share: the learner's ``algo.actor_share`` (the two parts' split of the round's budget).
        release: optional ``f(learner) -> mechanism`` replacing the learner's release (only the audit's
            tests use it, to build broken variants).
    """
    started = time.perf_counter()
    learner, D, Dp = build_round(eps, delta, users=users, epochs=epochs, minibatches=minibatches, seed=seed,
                                 actor_share=actor_share)
    if release is not None:
        learner.release = release(learner)
    wrapper = TranscriptScore(learner.release, learner, 0, learner.round_targets(D),
                              learner.round_targets(Dp))
    learner.release = wrapper
    initial = copy.deepcopy(learner.state_dict())
    claims, scores = [], ([], [])
    for trial in range(max(2, trials)):
        learner.load_state_dict(copy.deepcopy(initial))
        learner.update(Dp if trial % 2 else D, trial, list(range(users)))     # each trial its own round: spent() is one round's
        scores[trial % 2].append(wrapper.score)
        if trial < 2:
            claims.append(learner.privacy.spent())
    return conclude("dp_ppo_round", ENTRY, same_claim(claims), np.asarray(scores[0]), np.asarray(scores[1]), started)


def audit_dp_ppo_releases(eps: float, delta: float = 1e-5, trials: int = 1_000_000, *, seed: int = 0,
                          chunk: int = 50_000, users: int = 4, epochs: int = 2, minibatches: int = 2,
                          mechanism=None, actor_share: float = 0.5) -> MechanismAudit:
    """``trials`` transcripts of the round's releases (half on D, half on D'), ``chunk`` per pass (stacked noise).

    ``mechanism``: optional ``f(privacy, parts) -> mechanism`` replacing the learner's (only the
    audit's tests use it)."""
    started = time.perf_counter()
    noise = StackedNoise(chunk, seed)
    learner, D, Dp = build_round(eps, delta, users=users, epochs=epochs, minibatches=minibatches, seed=seed,
                                 noise=noise, actor_share=actor_share)
    mech = learner.release if mechanism is None else mechanism(learner.privacy, learner.release.parts)
    users_ids, canary = list(range(users)), 0   # build_round's users, the canary first
    targets = (learner.round_targets(D), learner.round_targets(Dp))
    releases = []   # per release of the schedule: (ids, rows on D, canary's row on D' or None, its index, clip)
    for epoch in learner.schedule(0, users_ids):
        for mb in epoch:
            g = [learner.minibatch_gradients(t, mb)[:2] for t in targets]
            ids = [users_ids[int(i)] for i in mb]
            at = ids.index(canary) if canary in ids else None
            for j, part, clip in ((0, "actor", learner.clip), (1, "critic", learner.critic_clip)):
                releases.append((ids, g[0][j], None if at is None else g[1][j][at], at, clip, part))
    claims, scores = [], ([], [])
    for r in range(max(1, trials // (2 * chunk))):
        for h in (0, 1):   # 0: the round on D, 1: on D'
            mech.open_round(2 * r + h, users_ids, (learner.clip, learner.critic_clip))
            score = torch.zeros(chunk, dtype=torch.float64)
            for ids, rows, alt, at, clip, part in releases:
                y, _ = mech.release_sum(rows if at is None or h == 0 else torch.cat([rows[:at], alt[None],
                                                                                     rows[at + 1:]]), ids, clip,
                                        part=part)
                if at is None:
                    continue
                c_D, c_Dp = (clip_per_user(v[None], clip)[0][0] for v in (rows[at], alt))
                others = clip_per_user(torch.cat([rows[:at], rows[at + 1:]]), clip)[0].sum(0)
                score += _loss(y, others, c_D, c_Dp, mech.sigma(clip, part))
            scores[h].append(score)
            claims.append(learner.privacy.spent())
    name = "dp_ppo_releases" if actor_share == 0.5 else f"dp_ppo_releases_actor_share ({actor_share:g})"
    return conclude(name, ENTRY_RELEASES, same_claim(claims), torch.cat(scores[0]).numpy(),
                    torch.cat(scores[1]).numpy(), started)
