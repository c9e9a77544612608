"""Audit of one multi-pass DP-PG release (opt-in): Poisson sampling + ``ComposedGaussianSums`` with ``Poisson`` sampling (one sum per round).

Adjacency is add/remove-one-user (the analysis of Opacus' accountants that the release uses).
Neighbours: a real CartPole round (``dp_pg.build_round``) in which user 0 is a canary whose clipped
gradient is exactly C u; in D the canary is absent, in D' it is in the population, and the project's
``PoissonUserSampler`` (population N, rate q = m / N) decides, trial by trial, whether this round
includes it. An absent user and a user whose advantages are zero add the same zero row to the
clipped sum (``update_direction`` divides by the expected batch q N, not by the count), so each trial
reads a stacked release of ``update_direction`` with the canary's advantages either zeroed or set.
The distinguisher is the projection on u: the likelihood ratio of q N(C u, s^2) + (1 - q) N(0, s^2)
against N(0, s^2) increases with it.
Claimed eps: the accountant's (RDP or PRV) eps after this one release, with the noise multiplier the
release picks for ``rounds = 1``. A run composes many such releases; the composition is the
accountant's (Opacus) and is not re-audited here.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.audit.trials import StackedNoise

ENTRY = ("dppo.data.sampler.PoissonUserSampler.next_round + PolicyGradient.update_direction -> "
         "ComposedGaussianSums.release_sum (Poisson)")


def audit_multi_pass_dp_pg(eps: float, delta: float = 1e-5, trials: int = 1_000_000, *, seed: int = 0,
                           chunk: int = 50_000, users: int = 4, population: int = 8, accountant: str = "rdp",
                           max_grad_norm: float = 1.0) -> MechanismAudit:
    """``trials`` releases (half on D, half on D') of one Poisson-sampled DP-PG round."""
    from dppo.audit.dp_pg import build_round
    from dppo.data.sampler import PoissonUserSampler
    from dppo.privacy.accountants import make_accountant
    from dppo.privacy.composed import composed_sums
    from dppo.privacy.context import PrivacyContext

    started = time.perf_counter()
    noise = StackedNoise(chunk, seed)
    learner, batch, A_canary, _, u = build_round(eps, delta, noise, users=users, max_grad_norm=max_grad_norm,
                                                 seed=seed)
    A_absent = A_canary.clone()
    A_absent[:batch.group_size] = 0.0  # the canary's whole group absent
    sampler = PoissonUserSampler(users, population, seed=seed + 1)
    learner.release = composed_sums(
        PrivacyContext(eps, delta, accountant=make_accountant(accountant), noise=noise, multi_pass=True,
                       population_size=population), parts={"actor": (1, 1.0)}, sampler=sampler, rounds=1)
    claims, null, alt = [], [], []

    def release(A) -> torch.Tensor:
        """One fresh one-release context (its claim is one step's eps), ``chunk`` stacked releases."""
        privacy = PrivacyContext(eps, delta, accountant=make_accountant(accountant), noise=noise, multi_pass=True,
                                 population_size=population)
        learner.privacy = learner.release.privacy = privacy
        out = learner.update_direction(batch, A, 0, list(range(users)))[0].double() @ u
        (entry,) = privacy.ledger.entries
        if not claims or entry != claims[0][0]:  # identical releases have the identical claim (PRV is slow)
            claims.append((entry, privacy.spent()))
        return out

    for _ in range(max(1, trials // (2 * chunk))):
        null.append(release(A_absent))
        included = torch.tensor([0 in sampler.next_round() for _ in range(chunk)])
        alt.append(torch.where(included, release(A_canary), release(A_absent)))
    return conclude(f"multi_pass_dp_pg ({accountant})", ENTRY, same_claim([c for _, c in claims]), torch.cat(null).numpy(),
                    torch.cat(alt).numpy(), started)
