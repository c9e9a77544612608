"""Audit of DP-GFA Algorithm 1's exponential mechanism (``GFALearner.select`` on the Bellman-error score).

The learner is built as the project runs it (RiverSwim, H = 20, the default epsilon-net class
|F| = 11^3, composition ``advanced``), with K = 2B so that it makes one data-dependent release,
after ``train_round(0)`` (B real episodes). Neighbours: those statistics plus one canary episode
in D, replaced by another in D'. The pair is picked among random candidate episodes (any states,
actions and per-step rewards in {0, 1}: the score's sensitivity bound must hold for every input)
to maximize the spread max_f u - min_f u of u(f) = S_D(f) - S_D'(f), computed by the learner's own
``BellmanErrorLoss``; thresholding u(released f) is the likelihood-ratio test (as in ``gfa``).
Claimed eps: the eps_0 of the release's ledger entry.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from dppo.audit.gfa import CHUNK, _context
from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.privacy.noise import NoiseSource

ENTRY = "dppo.algos.gfa.GFALearner.select (exponential mechanism on the Bellman-error score)"


def _episodes(H: int, S: int, A: int, n: int, gen: torch.Generator):
    states = torch.randint(S, (n, H + 1), generator=gen)
    actions = torch.randint(A, (n, H), generator=gen)
    rewards = torch.randint(2, (n, H), generator=gen).double()
    return states, actions, rewards


def build_gfa_tabular(eps: float, delta: float, *, batch: int = 5, candidates: int = 96, seed: int = 0):
    """(learner, S_D, S_D', u) with the learner after its first round and the widest canary pair."""
    from dppo.algos.gfa import GFALearner
    from dppo.envs.tabular import riverswim

    learner = GFALearner(riverswim(), _context(eps, delta, "advanced", NoiseSource(seed)), seed=seed,
                         episodes=2 * batch, batch_size=batch)
    learner.train_round(0)
    H, S, A = learner.env.H, learner.env.S, learner.env.A
    states, actions, rewards = _episodes(H, S, A, candidates, torch.Generator().manual_seed(seed + 3))
    base, scores = learner.stats, []
    for i in range(candidates):
        stats = copy.deepcopy(base)
        stats.update(states[i:i + 1], actions[i:i + 1], rewards[i:i + 1] * learner.r_max)   # as play_and_record
        learner.stats = stats
        scores.append(learner.score())
    learner.stats = base
    scores = torch.stack(scores)                                                         # [candidates, |F|]
    best, pair = -1.0, (0, 1)
    for i in range(candidates):
        diff = scores[i][None, :] - scores                                               # u for (D=i, D'=j)
        spread = diff.amax(1) - diff.amin(1)
        j = int(spread.argmax())
        if float(spread[j]) > best:
            best, pair = float(spread[j]), (i, j)
    s_null, s_alt = scores[pair[0]], scores[pair[1]]
    return learner, s_null, s_alt, (s_null - s_alt).numpy()


def audit_gfa_tabular(eps: float, delta: float = 1e-5, trials: int = 100_000, *, seed: int = 0,
                      beta_factor: float = 1.0) -> MechanismAudit:
    """``trials`` releases (half on D, half on D'); ``beta_factor`` != 1 only in the audit's tests."""
    started = time.perf_counter()
    learner, s_null, s_alt, u = build_gfa_tabular(eps, delta, seed=seed)
    learner.schedule.beta *= beta_factor  # a broken variant (tests only)
    noise = NoiseSource(seed + 1)
    null, alt, claims = [], [], []
    for start in range(0, trials, CHUNK):
        learner.privacy = _context(eps, delta, "advanced", noise)
        for _ in range(min(CHUNK, trials - start) // 2):
            null.append(u[learner.select(1, s_null)[0]])
            alt.append(u[learner.select(1, s_alt)[0]])
        entry = learner.privacy.ledger.entries[-1]
        claims.append((float(entry["eps"]), float(entry["delta"])))
    return conclude("gfa_tabular_exponential", ENTRY, same_claim(claims), np.array(null), np.array(alt), started)
