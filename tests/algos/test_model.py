"""algo=model / dp_model (dppo/algos/model.py, dppo/algos/model_plan.py): planning, masks, one-pass rounds, noise."""
import json
import math

import numpy as np
import pytest
import torch

from dppo.algos.model import ModelLearner, round_sizes
from dppo.algos.model_plan import IndexSet, plan
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.tabular import random_mdp, riverswim
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.users import GatedSampler
from tests.cli_helpers import run_cli


def _ctx(eps):
    return PrivacyContext(eps, 1e-5, noise=NoiseSource(0))


def _exact_sums(mdp, index):
    """Counts proportional to the true model (every row 1000 visits) and rewards matching R exactly."""
    P, R = mdp.P.numpy(), mdp.R.numpy()
    m = 1000.0 * P[index.rows_s, index.rows_a]                      # [rows, S]
    y = m * R[index.rows_s, index.rows_a][:, None]                 # mean reward R(s, a) on every next state
    return m.reshape(-1), y.reshape(-1)


def test_the_twins_plan_on_a_known_mdp_is_value_iteration():
    mdp = random_mdp(S=6, A=3, H=8, seed=3)
    index = IndexSet.build(mdp.S, mdp.A, None, None, sink=False)
    m, y = _exact_sums(mdp, index)
    p = plan(index, m, y, horizon=mdp.H, reward_range=(0.0, 1.0))
    V, Q, pi = mdp.value_iteration()
    assert np.allclose(p.q, Q[0].numpy()) and np.allclose(p.v, V[0].numpy())
    assert (p.policy == Q[0].numpy().argmax(1)).all()


def test_masked_maxima_never_pick_an_inadmissible_action():
    mdp = random_mdp(S=8, A=4, H=6, seed=1)
    rng = np.random.default_rng(0)
    mask = rng.random((mdp.S, mdp.A)) < 0.4
    mask[np.arange(mdp.S), rng.integers(0, mdp.A, mdp.S)] = True
    index = IndexSet.build(mdp.S, mdp.A, mask, None, sink=False)
    m, y = _exact_sums(mdp, index)
    p = plan(index, m, y, horizon=mdp.H, reward_range=(0.0, 1.0))
    assert mask[np.arange(mdp.S), p.policy].all()
    assert np.isneginf(p.q[~mask]).all()
    # the masked optimum: value iteration over the admissible actions only
    V = np.zeros(mdp.S)
    P, R = mdp.P.numpy(), mdp.R.numpy()
    for _ in range(mdp.H):
        Q = np.where(mask, R + P @ V, -np.inf)
        V = Q.max(1)
    assert np.allclose(p.v, V)


def test_unknown_pairs_are_pessimistic_and_terminal_columns_are_worth_zero():
    index = IndexSet.build(3, 2, None, [2], sink=False)           # state 2 terminal: no rows
    assert len(index.rows_s) == 4 and index.terminal_cols.tolist() == [False, False, True]
    m = np.zeros((4, 3))
    y = np.zeros((4, 3))
    m[index.row_of[0, 1], 2] = 10.0                               # (0, 1) -> terminal with reward 1
    y[index.row_of[0, 1], 2] = 10.0
    p = plan(index, m.reshape(-1), y.reshape(-1), horizon=5, reward_range=(0.0, 1.0))
    assert p.policy[0] == 1 and p.q[0, 1] == 1.0 and p.q[0, 0] == 0.0 and p.known.sum() == 1


def test_every_user_is_in_exactly_one_release():
    ctx = _ctx(2.0)
    sampler = GatedSampler(OnePassUserSampler(1), ctx.users)
    L = ModelLearner(riverswim(horizon=5), privacy=ctx, sampler=sampler, episodes=700, first_round=100,
                     round_growth=2.0)
    assert L.sizes == round_sizes(700, 100, 2.0) == [100, 200, 400]
    for r in range(L.num_rounds):
        sampler.round = r
        L.train_round(r)
    rounds = ctx.users.round_of
    assert len(rounds) == 700 and sorted(rounds) == list(range(700))
    assert [sum(1 for v in rounds.values() if v == r) for r in range(3)] == [100, 200, 400]
    assert [e["users"] for e in ctx.ledger.entries] == [100, 200, 400] and ctx.spent()[0] == 2.0


def test_the_private_release_noise_scale_comes_from_eps_delta_and_sensitivity():
    for eps in (1.0, 3.0):
        L = ModelLearner(riverswim(horizon=5), privacy=_ctx(eps), episodes=100, transition_cap=7, reward_noise=2.0)
        sens = math.sqrt(2 * 7 * (1 + 1 / 4))
        assert L.release.sensitivity == pytest.approx(sens)
        assert L.release.sigma == pytest.approx(analytic_gaussian_sigma(eps, 1e-5, sens))
    twin = ModelLearner(riverswim(horizon=5), privacy=_ctx(None), episodes=100)
    assert twin.release.sigma == 0.0 and not twin.release.private


def test_the_twin_learns_riverswim_and_resumes_from_its_state():
    mdp = riverswim(horizon=20)
    L = ModelLearner(mdp, privacy=_ctx(None), episodes=3000)
    for r in range(L.num_rounds - 1):
        L.train_round(r)
    state = L.state_dict()
    M = ModelLearner(mdp, privacy=_ctx(None), episodes=3000)
    M.load_state_dict(state)
    for X in (L, M):
        X.train_round(L.num_rounds - 1)
    assert (L.policy_table() == M.policy_table()).all()
    assert L.exact_return() == pytest.approx(float(mdp.to_native_return(torch.tensor(mdp.optimal_value()))), rel=1e-2)


def test_cli_dp_model_riverswim(tmp_path):
    out = run_cli(["algo=dp_model", "env=riverswim", "eps=3", "episodes=2000", "eval_episodes=5", "progress=false",
                   f"hydra.run.dir={tmp_path}"])
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["algo"] == "dp_model" and s["accountant"] == "parallel" and s["epsilon_spent"] == 3.0
    assert [e["mechanism"] for e in s["ledger"]] == ["count_release"] * s["releases"]
    assert (tmp_path / "policy.pt").exists() and s["exact_return"] is not None


def test_public_rewards_need_an_env_that_publishes_them():
    from dppo.errors import ConfigError
    from dppo.envs.gym_env import GymEnvFactory

    with pytest.raises(ConfigError, match="publishes its reward table"):
        ModelLearner(GymEnvFactory("FrozenLake-v1"), privacy=None, episodes=10, reward_model="public",
                     reward_noise=None)


def test_public_rewards_release_only_the_counts_at_sqrt_2K():
    pytest.importorskip("icu_sepsis")
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.envs.icu_sepsis_vector import package_tables

    ctx = PrivacyContext(3.0, 1e-5, noise=NoiseSource(0))
    L = ModelLearner(GymEnvFactory("icu_sepsis:Sepsis/ICU-Sepsis-v2"), privacy=ctx, episodes=1000,
                     reward_model="public", transition_cap=20)
    assert L.release.reward_entries == 0 and L.release.sensitivity == pytest.approx(math.sqrt(40))
    R = np.asarray(package_tables()["R"])
    np.testing.assert_array_equal(L.public_rewards[:, :716], R[L.index.rows_s, L.index.rows_a])
