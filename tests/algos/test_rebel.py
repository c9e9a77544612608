"""REBEL / DP-REBEL: exact linearization for log-linear bandits, two responses per user from the same start,
learning on the bandit, ledger and accounting, CLI."""
import json

import numpy as np
import pytest
import torch

from dppo.algos.rebel import REBEL
from dppo.data.streams import public_reset_seeds
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.bandit import ContextualBandit
from dppo.envs.gym_env import GymEnvFactory
from dppo.oracles import make_oracle
from dppo.policies.loglinear import LogLinearPolicy
from dppo.policies.spaces import make_space
from dppo.privacy.context import PrivacyContext
from dppo.privacy.noise import NoiseSource


def rebel_learner(eps=None, oracle="exact", rounds=30, seed=0, **kw):
    bandit = ContextualBandit(population=2000, dim=5, actions=4, noise_std=0.0, seed=seed)
    policy = LogLinearPolicy(bandit.observation_space, bandit.action_space)
    privacy = PrivacyContext(eps=eps, delta=1e-5, noise=NoiseSource(seed))
    sampler = OnePassUserSampler(20, population_size=2000, seed=seed)
    bounds = dict(x_bound=None, y_bound=None) if oracle == "exact" else dict(x_bound=2.0, y_bound=2.0)
    okw = kw.pop("oracle_kwargs", {})
    learner = REBEL(policy, bandit, privacy, sampler, make_oracle(oracle, ridge=0.1, **bounds, **okw), seed=seed,
                    rounds=rounds, reward_bound=1.0, eta=1.0, space=make_space(policy, "full", seed=seed),
                    group_size=kw.pop("group_size", 2),
                    momentum=kw.pop("momentum", 0.0), max_step_norm=kw.pop("max_step_norm", None), **kw)
    return learner, bandit, privacy


def test_rebel_regression_is_exact_for_log_linear_policies():
    """log-ratio difference of two responses = w . (phi(x, y) - phi(x, y')) exactly (log Z cancels)."""
    learner, bandit, _ = rebel_learner()
    policy = learner.policy
    with torch.no_grad():
        policy.theta.normal_()
    x = torch.tensor(np.stack([bandit.context(u) for u in range(6)]), dtype=torch.float32).reshape(6, -1)
    y, y2 = torch.tensor([0, 1, 2, 3, 0, 1]), torch.tensor([1, 1, 0, 2, 3, 2])
    w = torch.randn(policy.theta.shape[0], dtype=torch.float64)
    phi_y = learner.space.state_action_features(x, y)
    phi_y2 = learner.space.state_action_features(x, y2)
    before = (policy.log_prob(x, y) - policy.log_prob(x, y2)).detach().double()
    learner.space.step(w)
    after = (policy.log_prob(x, y) - policy.log_prob(x, y2)).detach().double()
    torch.testing.assert_close(after - before, (phi_y - phi_y2) @ w, rtol=1e-4, atol=1e-4)


def test_a_users_group_shares_its_start_state_and_differs_in_actions():
    from dppo.policies.mlp import MLPPolicy

    env = GymEnvFactory("CartPole-v1", horizon=30)
    policy = MLPPolicy(env.observation_space, env.action_space)
    learner = REBEL(policy, env, PrivacyContext(), OnePassUserSampler(3), make_oracle("exact", x_bound=None,
                    y_bound=None), seed=0, group_size=4, rounds=1, reward_bound=1.0)
    batch = learner.collect([5, 6, 7], 0)
    starts = batch.grouped(batch.obs[:, 0])
    torch.testing.assert_close(starts, starts[:, :1].expand_as(starts))
    assert not torch.equal(batch.grouped(batch.actions)[:, 0], batch.grouped(batch.actions)[:, 1])


def test_group_form_with_two_responses_has_the_pair_regression_minimizer():
    """G = 2: rows +-(x - x', eta (R - R')) / 2 give the same least-squares solution as the paper's pair rows."""
    learner, bandit, _ = rebel_learner(group_size=2)
    batch = learner.collect(list(range(20)), 0)
    rows, _ = learner.regression_rows(batch)
    pairs = [(X[:1] - X[1:], y[:1] - y[1:]) for X, y in rows]
    oracle = make_oracle("exact", x_bound=None, y_bound=None, ridge=0.0)
    torch.testing.assert_close(oracle.solve(rows), oracle.solve(pairs) * 1.0, rtol=1e-6, atol=1e-9)


def expected_reward(learner, bandit, n=500):
    phi = np.stack([bandit.context(bandit.public_seed(s)) for s in public_reset_seeds(0, "eval", 0, n)])
    probs = torch.softmax(learner.policy.logits(torch.tensor(phi, dtype=torch.float32)), -1).detach().numpy()
    means = bandit.mean_reward(phi.reshape(-1, phi.shape[-1])).reshape(n, -1)
    return float((probs * means).sum(1).mean()), float(means.max(1).mean())


def test_rebel_learns_the_linear_bandit():
    learner, bandit, _ = rebel_learner(step="fixed", lr=1.0)
    start, best = expected_reward(learner, bandit)
    for r in range(30):
        learner.train_round(r)
    end, _ = expected_reward(learner, bandit)
    assert end - start > 0.6 * (best - start), (start, end, best)


def test_dp_rebel_releases_one_dp_gd_entry_per_round_and_learns_at_large_eps():
    learner, bandit, privacy = rebel_learner(eps=20.0, oracle="dp_gd", rounds=40, step="norm", lr=0.5,
                                             oracle_kwargs=dict(steps=3, clip=1.0, radius=None))
    start, best = expected_reward(learner, bandit)
    for r in range(40):
        learner.train_round(r)
    end, _ = expected_reward(learner, bandit)
    assert [e["mechanism"] for e in privacy.ledger.entries] == ["dp_gd"] * 40
    assert all(e["steps"] == 3 and e["users"] == 20 for e in privacy.ledger.entries)
    assert privacy.spent() == pytest.approx((20.0, 1e-5))
    assert end - start > 0.3 * (best - start), (start, end, best)


def test_cli_dp_rebel_runs(cli, tiny, tmp_path):
    res = cli(["algo=dp_rebel", "eps=5", *tiny, f"hydra.run.dir={tmp_path}"])
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epsilon_spent"] == pytest.approx(5.0)
    assert [e["mechanism"] for e in summary["ledger"]] == ["dp_gd"] * 3
