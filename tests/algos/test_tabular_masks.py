"""The tabular planners' masked maxima: with an env's public action mask table (``dppo.envs.masks.mask_table``),
UBEV, PUCB and DP-UBEV plan V_h = max over the admissible actions only and never act, nor release, an inadmissible
action; the plan's maxima equal an independent maximum over the admissible Q entries."""
from __future__ import annotations

import numpy as np
import pytest

from dppo.algos.dp_ubev import DPUBEV
from dppo.algos.ucb import PUCB, UBEV
from dppo.envs.tabular import random_mdp
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant

S, A, H = 5, 4, 6


def masked_mdp():
    mdp = random_mdp(S=S, A=A, H=H, seed=4)
    table = np.zeros((S, A), dtype=bool)
    for s in range(S):
        table[s, [s % A, (s + 2) % A]] = True      # two of four actions per state
    mdp.admissible = table
    return mdp, table


def _ctx(eps):
    return PrivacyContext(eps, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(0))


@pytest.mark.parametrize("make", [
    lambda mdp: UBEV(mdp, privacy=_ctx(None), seed=1, episodes=300, episodes_per_round=100),
    lambda mdp: UBEV(mdp, privacy=_ctx(None), seed=1, episodes=300, episodes_per_round=100, pool_steps=True),
    lambda mdp: PUCB(mdp, privacy=_ctx(None), seed=1, episodes=300, episodes_per_round=100),
    lambda mdp: PUCB(mdp, privacy=_ctx(1.0), seed=1, episodes=300, episodes_per_round=100),
    lambda mdp: DPUBEV(mdp, privacy=_ctx(1.0), seed=1, episodes=300, episodes_per_round=100),
    lambda mdp: DPUBEV(mdp, privacy=_ctx(None), seed=1, episodes=300, episodes_per_round=100),
], ids=["ubev", "ubev_pooled", "pucb_exact", "pucb", "dp_ubev", "dp_ubev_exact"])
def test_plans_range_over_the_admissible_actions_only(make):
    mdp, table = masked_mdp()
    learner = make(mdp)
    for r in range(learner.num_rounds):
        learner.train_round(r)
        pi = np.asarray(learner.greedy_policy())                # [H, S]
        assert table[np.arange(S)[None, :], pi].all()
    q = np.asarray(learner.q_values())
    admissible_max = np.where(table[None], q, -np.inf).max(-1)  # independent: the max over admissible entries
    np.testing.assert_array_equal(q.max(-1), admissible_max)
    assert (q[:, ~table] < -1e50).all()


def test_without_a_table_every_action_may_be_planned():
    mdp = random_mdp(S=S, A=A, H=H, seed=4)
    learner = UBEV(mdp, privacy=_ctx(None), seed=1, episodes=100, episodes_per_round=100)
    learner.train_round(0)
    assert learner.action_ok is None and np.isfinite(np.asarray(learner.q_values())).all()
