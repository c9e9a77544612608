"""Audit of one multi-pass DP-PPO round (opt-in): Poisson sampling + ``ComposedGaussianSums`` with ``Poisson`` sampling.

Adjacency is add/remove-one-user (the analysis of Opacus' accountants that the release uses).
Neighbours: a real CartPole round (``dp_ppo.build_round``: users 0..m-1, rollouts by the project's
``RolloutEngine``, clip norms small enough that every user's vectors are clipped) with user 0 a canary,
from a population of N; in D the canary is absent, in D' it is in the population, and the project's
``PoissonUserSampler`` (rate q = m / N) decides, trial by trial, whether this round includes it. The other
users take part in every trial: a fixed draw of the others is one of the datasets the guarantee covers
(averaging over their draws could only bring D and D' closer).

Releases: through the release's public interface (``ComposedGaussianSums`` with ``Poisson`` sampling), ``open_round`` for the round's users, then
``release_sum`` for each (epoch, minibatch, actor / critic) of the learner's own ``schedule`` (each sampled user
in one minibatch per epoch, drawn from public randomness of its own: ``algo.minibatches=1`` puts everyone in the
one minibatch; with 2 the canary's minibatch of each epoch is the same whether or not it is sampled, and the
other minibatch's releases do not involve it), the per-user vectors being the
learner's ``minibatch_gradients`` at the round's start (the non-adaptive case, to which Gaussian-DP
composition reduces the adaptive one, as for ``dp_ppo_releases``). An absent canary is in neither the
round's users nor the rows. The release broadcasts over ``StackedNoise``: one pass, ``chunk`` transcripts.

Distinguisher (white-box): with the canary in the round, release y_j is Gaussian around S_j + c_j (S_j the
others' clipped sum, c_j the canary's clipped vector, both known to the auditor), without it around S_j, so
the log-likelihood ratio of the included-canary transcript against the absent one is

    s = sum_j [ <y_j - S_j, c_j> - ||c_j||^2 / 2 ] / sigma_j^2     (j over the releases of the canary's minibatches),

and that of D' against D is log(1 - q + q e^s), increasing in s: the threshold test on s is the
likelihood-ratio test. Given inclusion s ~ N(mu^2/2, mu^2) with mu^2 = sum_j ||c_j||^2 / sigma_j^2, which is
1 / z_round^2 when the canary is clipped in all its k = 2 x epochs releases.
Claimed eps: the accountant's (RDP or PRV) eps after this one round, with the multiplier the release picks
for ``rounds = 1``. A run composes many rounds; that composition is the accountant's (Opacus) and is not
re-audited here.
"""
from __future__ import annotations

import time

import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.audit.trials import StackedNoise
from dppo.privacy.release import clip_per_user

ENTRY = ("PoissonUserSampler.next_round + ComposedGaussianSums.open_round (Poisson) + release_sum over PPO.schedule "
         "(PPO.minibatch_gradients at the round's start)")
CANARY = 0


def audit_multi_pass_dp_ppo(eps: float, delta: float = 1e-5, trials: int = 1_000_000, *, seed: int = 0,
                            chunk: int = 50_000, users: int = 4, population: int = 8, epochs: int = 2,
                            accountant: str = "rdp", minibatches: int = 1, mechanism=None) -> MechanismAudit:
    """``trials`` transcripts of one Poisson-sampled DP-PPO round (half on D, half on D'), ``chunk`` per pass.

    Args:
        eps, delta: the learner's privacy target, met after one round (``rounds=1``).
        trials: total transcripts; chunk: transcripts per pass (stacked noise).
        users, population: m (the round's users when the canary is sampled) and N; the rate is q = m / N.
        epochs: the learner's epochs (the canary takes part in 2 x epochs releases).
        minibatches: the learner's ``algo.minibatches`` (the canary in one per epoch).
        accountant: ``rdp`` or ``prv`` (Opacus), the run's ``privacy.accountant``.
        mechanism: optional ``f(privacy, parts, sampler) -> mechanism`` replacing the learner's release (only
            the audit's tests use it, to build broken variants).
    """
    from dppo.audit.dp_ppo import build_round
    from dppo.data.sampler import PoissonUserSampler
    from dppo.privacy.accountants import make_accountant
    from dppo.privacy.context import PrivacyContext

    started = time.perf_counter()
    chunk = max(2, min(chunk, trials // 2))   # a small ``trials`` runs one pass of that many
    noise = StackedNoise(chunk, seed)

    def context() -> PrivacyContext:
        """A fresh multi-pass context: its ``spent()`` after one round is the claim audited."""
        return PrivacyContext(eps, delta, accountant=make_accountant(accountant), noise=noise, multi_pass=True,
                              population_size=population)

    sampler = PoissonUserSampler(users, population, seed=seed + 1)
    learner, batch, _ = build_round(eps, delta, users=users, epochs=epochs, minibatches=minibatches, seed=seed,
                                    privacy=context(), sampler=sampler, rounds=1)
    mech = learner.release if mechanism is None else mechanism(learner.privacy, learner.release.parts, sampler)
    rows = learner.minibatch_gradients(learner.round_targets(batch), torch.arange(users))[:2]  # (actor, critic)
    parts = ((rows[0], "actor", learner.clip), (rows[1], "critic", learner.critic_clip))
    claims = []
    everyone = list(range(users))
    # the canary's minibatch in each epoch: a public draw of its own, the same in every transcript
    canary_mb = [next(j for j, mb in enumerate(epoch) if CANARY in mb.tolist())
                 for epoch in learner.schedule(0, everyone)]

    def transcript_score(ids: list[int]) -> torch.Tensor:
        """``chunk`` rounds of the users ``ids`` (a fresh context each), scored by s (module docstring)."""
        mech.privacy = privacy = context()
        mech.open_round(0, ids, (learner.clip, learner.critic_clip))
        score = torch.zeros(chunk, dtype=torch.float64)
        for e, epoch in enumerate(learner.schedule(0, ids)):
            for j, mb in enumerate(epoch):
                members = [ids[int(i)] for i in mb]
                others = [u for u in members if u != CANARY]
                for g, part, clip in parts:
                    y, _ = mech.release_sum(g[members], members, clip, part=part)
                    if j != canary_mb[e]:   # a release the canary is never in: the same law with or without it
                        continue
                    c = clip_per_user(g[CANARY][None], clip)[0][0].double()
                    rest = clip_per_user(g[others], clip)[0].double().sum(0)
                    score += ((y - rest) @ c - c @ c / 2) / mech.sigma(clip, part) ** 2
        (entry,) = privacy.ledger.entries
        if not claims or entry != claims[0][0]:  # identical rounds have the identical claim (PRV is slow)
            claims.append((entry, privacy.spent()))
        return score

    absent = [u for u in everyone if u != CANARY]
    null, alt = [], []
    for _ in range(max(1, trials // (2 * chunk))):
        null.append(transcript_score(absent))
        included = torch.tensor([CANARY in sampler.next_round() for _ in range(chunk)])
        alt.append(torch.where(included, transcript_score(everyone), transcript_score(absent)))
    name = f"multi_pass_dp_ppo ({accountant})" if minibatches == 1 else \
        f"multi_pass_dp_ppo ({accountant}, minibatches={minibatches})"
    return conclude(name, ENTRY, same_claim([c for _, c in claims]),
                    torch.cat(null).numpy(), torch.cat(alt).numpy(), started)
