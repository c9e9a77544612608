"""Audit of the DP-PG round update: ``PolicyGradient.update_direction`` (the round opened, per-user clip, sum,
Gaussian noise, / m: the composed release's k = 1 case).

Neighbours: a real CartPole round of m users with G rollouts each (a small MLP policy, rollouts by the
project's own ``RolloutEngine`` from each user's own streams) in which user 0 is a canary who controls
*all G trajectories* of its group: its advantages are scaled so that its REINFORCE gradient (the mean over
its G rollouts) g has norm 10 C (clipping brings it to exactly C along u = g / ||g||); in D' the canary
is replaced by a user with the same G trajectories and negated advantages (gradient -g). The clipped
sums then differ by exactly 2 C u: the replace-one worst case, whatever G. The distinguisher is the
projection of the released direction on u, the likelihood-ratio test of the two Gaussians.
Trials are stacked by ``StackedNoise``: the update is affine in the noise, so one call of the
project's code returns ``chunk`` independent releases.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.audit.trials import StackedNoise, trial_context

ENTRY = "dppo.algos.pg.PolicyGradient.update_direction -> ComposedGaussianSums.release_sum"


def build_round(eps: float, delta: float, noise, *, users: int = 4, max_grad_norm: float = 1.0, seed: int = 0,
                group_size: int = 4):
    """A DP-PG learner and one collected round: (learner, batch, A_D, A_D', canary unit direction u)."""
    from dppo.algos.pg import PolicyGradient
    from dppo.data.sampler import OnePassUserSampler
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.policies.mlp import MLPPolicy

    torch.manual_seed(seed)
    env = GymEnvFactory("CartPole-v1", horizon=50)
    policy = MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    privacy = trial_context(eps, delta, noise)
    learner = PolicyGradient(policy, env, privacy, OnePassUserSampler(users, seed=seed), seed=seed, rounds=1,
                             reward_bound=1.0, max_grad_norm=max_grad_norm, optimizer="sgd", group_size=group_size,
                             advantage="to_go")
    batch = learner.collect(list(range(users)), 0)
    A, _ = learner.step_advantages(batch)
    g = learner.user_gradients(batch, A)[0]
    G = batch.group_size
    A_null = A.clone()
    A_null[:G] *= 10.0 * max_grad_norm / float(g.norm())  # the canary's whole group
    A_alt = A_null.clone()
    A_alt[:G] = -A_alt[:G]
    return learner, batch, A_null, A_alt, g / g.norm()


def audit_dp_pg(eps: float, delta: float = 1e-5, trials: int = 1_000_000, *, seed: int = 0, chunk: int = 50_000,
                users: int = 4, max_grad_norm: float = 1.0,
                release: Callable | None = None) -> MechanismAudit:
    """Run ``trials`` releases (half on D, half on D') and bound eps from the projection test.

    Args:
        eps, delta: the learner's privacy target (its ``PrivacyContext``).
        trials: total releases; chunk: releases per call of ``update_direction``.
        users, max_grad_norm: round size m and clip C.
        release: optional ``f(privacy, max_grad_norm)`` replacing the learner's release
            (used only by the audit's tests to build broken variants).
    """
    started = time.perf_counter()
    noise = StackedNoise(chunk, seed)
    learner, batch, A_null, A_alt, u = build_round(eps, delta, noise, users=users, max_grad_norm=max_grad_norm,
                                                   seed=seed)
    if release is not None:
        learner.release = release(learner.privacy, max_grad_norm)
    null, alt, ids = [], [], list(range(users))
    for r in range(max(1, trials // (2 * chunk))):
        null.append(learner.update_direction(batch, A_null, 2 * r, ids)[0].double() @ u)
        alt.append(learner.update_direction(batch, A_alt, 2 * r + 1, ids)[0].double() @ u)
    claimed = same_claim([learner.privacy.spent()])
    return conclude("dp_pg_round", ENTRY, claimed, torch.cat(null).numpy(), torch.cat(alt).numpy(), started)
