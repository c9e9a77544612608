"""Audit of DP-GFA's exponential mechanism (Algorithm 2, ``GFAOutcomeLearner.select``).

The learner is built as the project runs it (ContextBits ``easy``, the default class and
``sensitivity=class``, composition ``advanced`` or ``zcdp``), with K = 2B episodes so that it makes one
data-dependent release; its first round is played by ``train_round(0)`` (B real users). The audited
release is the next one: ``select(1, S)``, the smallest function holding the whole privatization
(ledger entry with eps_0, beta = eps_0 / (2 Delta_S), Gumbel-max sampling), called once per trial on
the score S the learner computes from its statistics.
Neighbours: the statistics plus one canary user (trajectory tau_1, outcome reward r_1) in D,
replaced by (tau_2, r_2) in D'. With residuals G_f(tau) the score change is
u(f) = S_D(f) - S_D'(f) = (G_f(tau_2) - r_2)^2 - (G_f(tau_1) - r_1)^2; the design below reaches
max_f u - min_f u = 2 Delta_S (the full range the sensitivity allows). Other users (shared by D and
D') shape the base distribution so that the normalizer shift is visible too. Since
log P_D(f) / P_D'(f) = beta u(f) - const, thresholding u(released f) is the likelihood-ratio test.

DESIGN was found by a greedy search (``search_design``) maximizing the exact power of that test
(softmax probabilities of the learner's own scores) for beta doubled at eps = 1, for ContextBits
``easy`` with the then-default class (scales 0.75/1/1.25, class_seed 0); it is a choice of inputs, not a
result. On the current default class (scales 0.5/0.75/1, Delta_S = 1, eta = 50) it still reaches
max u - min u = 2 Delta_S, and beta doubled is still caught (tests/audit).
Claimed eps: the eps_0 of the release's ledger entry (the accountant composes these).
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from dppo.audit.result import MechanismAudit, conclude, same_claim
from dppo.privacy.noise import NoiseSource

ENTRY = "dppo.algos.gfa.GFAOutcomeLearner.select (exponential mechanism, Gumbel-max)"
CHUNK = 2000
DESIGN = {"null": (16, 0.0), "alt": (31, 0.0), "others": [(669, 1.0, 10), (653, 1.0, 10), (311, 0.0, 10)]}


def _context(eps, delta, composition, noise):
    from dppo.privacy.accountants import make_accountant
    from dppo.privacy.context import PrivacyContext

    return PrivacyContext(eps, delta, accountant=make_accountant(composition), noise=noise)


def _with_users(stats, G, users):
    """A copy of ``stats`` plus users ``(trajectory, reward, count)`` (the learner's own update rule)."""
    stats = copy.deepcopy(stats)
    for tau, r, k in users:
        stats.update(G[:, tau:tau + 1], torch.ones(1) * k, torch.tensor([r * k], dtype=torch.float64),
                     torch.tensor([r * r * k], dtype=torch.float64))
    return stats


def build_gfa(eps: float, delta: float, *, composition: str = "advanced", batch: int = 1, seed: int = 0,
              design: dict | None = None):
    """(learner, S_D, S_D', u) with the learner after its first round (``batch`` real users)."""
    from dppo.algos.gfa import GFAOutcomeLearner
    from dppo.envs.context_bits import ContextBitsMDP
    from dppo.function_classes.losses import trajectory_residuals

    env = ContextBitsMDP("easy")
    learner = GFAOutcomeLearner(env, _context(eps, delta, composition, NoiseSource(seed)), seed=seed,
                                episodes=2 * batch, batch_size=batch, sensitivity="class")
    learner.train_round(0)
    sa, nxt = env.trajectory_sa(torch.arange(env.num_trajectories))
    G = trajectory_residuals(learner.fclass, sa, nxt, env.num_actions)               # [|F|, trajectories]
    design = design or DESIGN
    base, scores = learner.stats, []
    for side in ("null", "alt"):
        tau, r = design[side]
        learner.stats = _with_users(base, G, [*design["others"], (tau, r, 1)])
        scores.append(learner.score().clone())
    learner.stats = base
    return learner, scores[0], scores[1], (scores[0] - scores[1]).numpy()


def exact_power(beta: float, s_null: torch.Tensor, s_alt: torch.Tensor, u: np.ndarray, n: int) -> float:
    """Design aid: the bound a threshold test on u would give with n evaluation trials per side, from the
    exact softmax(beta S) output probabilities (expected counts; never used as an audit result)."""
    from dppo.audit.bounds import clopper_pearson_upper, eps_from_rates

    p_null = torch.softmax(beta * s_null, 0).numpy()
    p_alt = torch.softmax(beta * s_alt, 0).numpy()
    order = np.argsort(u)
    alpha = np.cumsum(p_alt[order][::-1])[::-1][1:]          # P_D'(u >= t): guessing D wrongly
    miss = np.cumsum(p_null[order])[:-1]                     # P_D(u < t)
    up = lambda p: clopper_pearson_upper(np.round(p * n), n, 0.975)
    return float(eps_from_rates(up(alpha), up(miss), 0.0).max())


def search_design(eps: float = 1.0, beta_factor: float = 2.0, rounds: int = 3, n: int = 50_000) -> dict:
    """Greedy design: the canary pair with the widest u range, then ``rounds`` groups of other users
    that most raise ``exact_power`` at ``beta_factor`` x beta (minutes of CPU; offline use)."""
    learner, *_ = build_gfa(eps, 1e-5)
    env = learner.env
    from dppo.function_classes.losses import trajectory_residuals

    sa, nxt = env.trajectory_sa(torch.arange(env.num_trajectories))
    G = trajectory_residuals(learner.fclass, sa, nxt, env.num_actions)
    cand = torch.unique(torch.cat([G.amax(0).topk(40).indices, (G.amax(0) - G.amin(0)).topk(40).indices,
                                   G.amin(0).topk(40, largest=False).indices])).tolist()
    rewards = (float(env.reward_low), float(env.reward_high))
    best = max(((float(((G[:, b] - rb) ** 2 - (G[:, a] - ra) ** 2).max() - ((G[:, b] - rb) ** 2
                 - (G[:, a] - ra) ** 2).min()), (a, ra), (b, rb)) for a in cand for b in cand
                for ra in rewards for rb in rewards), key=lambda x: x[0])
    design = {"null": best[1], "alt": best[2], "others": []}
    for _ in range(rounds):
        def power(d):
            _, s0, s1, u = build_gfa(eps, 1e-5, design=d)
            return exact_power(beta_factor * learner.beta, s0, s1, u, n)
        options = [{**design, "others": design["others"] + [(t, r, k)]} for t in cand for r in rewards
                   for k in (1, 3, 10)]
        design = max(options + [design], key=power)
    return design


def audit_gfa(eps: float, delta: float = 1e-5, trials: int = 100_000, *, composition: str = "advanced",
              seed: int = 0, beta_factor: float = 1.0) -> MechanismAudit:
    """``trials`` releases (half on D, half on D'); ``beta_factor`` != 1 only in the audit's broken-variant tests."""
    started = time.perf_counter()
    learner, s_null, s_alt, u = build_gfa(eps, delta, composition=composition, seed=seed)
    learner.schedule.beta *= beta_factor  # a broken variant (tests only)
    noise = NoiseSource(seed + 1)
    null, alt, claims = [], [], []
    for start in range(0, trials, CHUNK):
        learner.privacy = _context(eps, delta, composition, noise)
        for _ in range(min(CHUNK, trials - start) // 2):
            null.append(u[learner.select(1, s_null)[0]])
            alt.append(u[learner.select(1, s_alt)[0]])
        entry = learner.privacy.ledger.entries[-1]
        claims.append((float(entry["eps"]), float(entry["delta"])))
    return conclude(f"gfa_exponential ({composition})", ENTRY, same_claim(claims), np.array(null), np.array(alt),
                    started)
