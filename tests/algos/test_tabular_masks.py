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


def _walk_env():
    """A walk on 6 cells from cell 0 (Discrete spaces, no published model): action 1 moves right with probability
    0.8, action 0 stays; reward 1 on reaching cell 5, which ends the episode (its own limit: 40 steps)."""
    import gymnasium as gym

    class WalkEnv(gym.Env):
        observation_space = gym.spaces.Discrete(6)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.s = 0
            return 0, {}

        def step(self, a):
            if int(a) == 1 and self.np_random.random() < 0.8:
                self.s += 1
            done = self.s == 5
            return self.s, float(done), done, False, {}

    if "MaskTestWalk-v0" not in gym.registry:
        gym.register("MaskTestWalk-v0", entry_point=WalkEnv, max_episode_steps=40)


def test_the_released_policy_is_certainty_equivalent_and_evaluated_at_the_envs_own_horizon():
    """UBEV learns a 6-cell walk over a cut horizon of 6 steps (the goal takes 6.25 on average); its released policy is
    greedy on the model of its statistics (no bonus), one action per state (pooled statistics), and evaluated over
    the env's own 40 steps, where it almost always reaches the goal."""
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.algos.tabular_plan import certainty_equivalent

    _walk_env()
    factory = GymEnvFactory("MaskTestWalk-v0", horizon=6)
    learner = UBEV(factory, privacy=_ctx(None), seed=0, episodes=300, episodes_per_round=100, pool_steps=True)
    for r in range(learner.num_rounds):
        learner.train_round(r)
    assert (learner.H, learner.eval_horizon) == (6, 40)
    pi = learner.released_policy()
    l, n, m = learner.released_stats()
    expect, _ = certainty_equivalent(l, n, m, horizon=40)
    np.testing.assert_array_equal(pi, expect)
    assert pi.shape == (learner.S,)
    lengths = [len(learner.mdp.run_episode(np.tile(pi, (40, 1)).tolist(), seed=s, horizon=40)[1])
               for s in learner.mdp.eval_seeds(20)]
    assert max(lengths) > 6                      # episodes ran past the learning horizon
    assert learner.evaluate(50) > 0.9            # within 6 steps only about half would


def test_dp_gfa_acts_and_backs_up_over_the_admissible_actions_only():
    """DP-GFA (Bellman error, tabular) with a public mask table: every released member's greedy policy is admissible,
    and its targets' V^f_{h+1} is the maximum over the admissible entries (an independent computation)."""
    import torch

    from dppo.algos.gfa import GFALearner

    mdp, table = masked_mdp()
    mdp = random_mdp(S=S, A=A, H=3, seed=4)
    mdp.admissible = table
    learner = GFALearner(mdp, _ctx(1.0), seed=0, episodes=60, batch_size=20, grid_points=3)
    for r in range(learner.num_rounds):
        learner.train_round(r)
        assert table[np.arange(S)[None, :], learner.policy.numpy()].all()
    f = learner.fclass.table[:5].double()
    q = f.view(5, 3, S, A)
    expect_v = torch.stack([torch.stack([torch.stack([q[i, h, s][torch.as_tensor(table[s])].max() for s in range(S)])
                                         for h in range(3)]) for i in range(5)])
    N = learner.stats.transitions.view(3, S, A, S)
    v_next = torch.cat([expect_v[:, 1:], torch.zeros_like(expect_v[:, :1])], 1)
    expect = learner.stats.reward_sum + torch.einsum("hsat,fht->fhsa", N, v_next).reshape(5, -1)
    torch.testing.assert_close(learner.stats.targets(f), expect)
