"""NPG / DP-NPG: compatible features, per-user isolation of the regression rows, learning on the bandit,
ledger and accounting, private-config guards, CLI."""
import json
import os

import numpy as np
import pytest
import torch

from dppo.algos.npg import NaturalPolicyGradient
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.bandit import ContextualBandit
from dppo.envs.gym_env import GymEnvFactory
from dppo.data.streams import public_reset_seeds
from dppo.errors import ConfigError
from dppo.oracles import make_oracle
from dppo.policies.loglinear import LogLinearPolicy
from dppo.policies.mlp import MLPPolicy
from dppo.policies.spaces import make_space
from dppo.privacy.context import PrivacyContext
from dppo.privacy.noise import NoiseSource

CARTPOLE = GymEnvFactory("CartPole-v1", horizon=60)


def mlp(seed=0, actions=None):
    torch.manual_seed(seed)
    env = CARTPOLE
    return MLPPolicy(env.observation_space, actions or env.action_space)


def test_head_features_are_the_autograd_gradients_of_the_head_rows():
    import gymnasium as gym

    policy = mlp(actions=gym.spaces.Discrete(3))
    with torch.no_grad():
        policy.head.weight.normal_()
    obs, actions = torch.randn(4, 4), torch.tensor([0, 2, 1, 2])
    phi = make_space(policy, "head", dim=None).state_action_features(obs, actions)
    for n in range(4):
        policy.zero_grad()
        policy.log_prob(obs[n:n + 1], actions[n:n + 1]).sum().backward()
        expected = torch.cat([policy.head.weight.grad[1:], policy.head.bias.grad[1:, None]], 1).reshape(-1)
        torch.testing.assert_close(phi[n].float(), expected, rtol=1e-5, atol=1e-6)


def test_full_features_are_per_sample_gradients():
    policy = mlp()
    obs, actions = torch.randn(3, 4), torch.tensor([1, 0, 1])
    phi = make_space(policy, "full", dim=None).state_action_features(obs, actions)
    for n in range(3):
        policy.zero_grad()
        policy.log_prob(obs[n:n + 1], actions[n:n + 1]).sum().backward()
        expected = torch.cat([p.grad.reshape(-1) for p in policy.parameters()])
        torch.testing.assert_close(phi[n].float(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,dim", [("head", None), ("head", 6), ("full", 6)])
def test_subspace_step_moves_log_probs_by_the_linearization(kind, dim):
    policy = mlp()
    space = make_space(policy, kind, dim=dim, seed=1)
    obs, actions = torch.randn(8, 4), torch.randint(0, 2, (8,))
    w = 1e-3 * torch.randn(space.dim, dtype=torch.float64)
    before = policy.log_prob(obs, actions).detach().double()
    phi = space.state_action_features(obs, actions)
    space.step(w)
    after = policy.log_prob(obs, actions).detach().double()
    torch.testing.assert_close(after - before, phi @ w, rtol=2e-2, atol=1e-6)


def test_regression_rows_of_other_users_do_not_change_when_one_user_is_replaced():
    """Replace-one isolation: user j's group enters only user j's (X_j, y_j) (no batch baselines)."""
    def rows(users):
        learner = cartpole_learner()
        batch = learner.collect(users, 0)
        return dict(zip(users, learner.regression_rows(batch)[0]))

    base, changed = rows([11, 12, 13, 14]), rows([11, 99, 13, 14])
    for u in (11, 13, 14):
        torch.testing.assert_close(base[u][0], changed[u][0], rtol=0, atol=0)
        torch.testing.assert_close(base[u][1], changed[u][1], rtol=0, atol=0)
    assert not torch.equal(base[12][1][:3], changed[99][1][:3])


def cartpole_learner(eps=None, group_size=4):
    policy = mlp()
    privacy = PrivacyContext(eps=eps, delta=1e-5, noise=NoiseSource(0))
    oracle = make_oracle("exact", x_bound=None, y_bound=None, ridge=0.01)
    return NaturalPolicyGradient(policy, CARTPOLE, privacy, OnePassUserSampler(4), oracle, seed=3, rounds=2,
                                 group_size=group_size, reward_bound=1.0)


def bandit_learner(eps=None, oracle="exact", rounds=30, seed=0, **kw):
    bandit = ContextualBandit(population=2000, dim=5, actions=4, noise_std=0.1, seed=seed)
    policy = LogLinearPolicy(bandit.observation_space, bandit.action_space)
    privacy = PrivacyContext(eps=eps, delta=1e-5, noise=NoiseSource(seed))
    sampler = OnePassUserSampler(20, population_size=2000, seed=seed)
    defaults = dict(x_bound=2.0, y_bound=2.0, ridge=0.1) if oracle != "exact" else dict(x_bound=None, y_bound=None, ridge=0.1)
    kw.setdefault("group_size", 4)
    kw.setdefault("momentum", 0.0)
    kw.setdefault("max_step_norm", None)
    learner = NaturalPolicyGradient(policy, bandit, privacy, sampler, make_oracle(oracle, **defaults), seed=seed,
                                    rounds=rounds, reward_bound=1.0, space=make_space(policy, "full", seed=seed),
                                    step=kw.pop("step", "fixed"), lr=kw.pop("lr", 1.0), **kw)
    return learner, bandit, privacy


def expected_reward(learner, bandit, n=500):
    """Exact E_{x ~ held-out, a ~ pi}[r(x, a)] (independent of the learner's own evaluate)."""
    phi = np.stack([bandit.context(bandit.public_seed(s)) for s in public_reset_seeds(0, "eval", 0, n)])
    probs = torch.softmax(learner.policy.logits(torch.tensor(phi, dtype=torch.float32)), -1).detach().numpy()
    means = bandit.mean_reward(phi.reshape(-1, phi.shape[-1])).reshape(n, -1)
    return float((probs * means).sum(1).mean()), float(means.max(1).mean())


def test_npg_learns_the_linear_bandit():
    learner, bandit, _ = bandit_learner()
    start, best = expected_reward(learner, bandit)
    for r in range(30):
        learner.train_round(r)
    end, _ = expected_reward(learner, bandit)
    assert end - start > 0.6 * (best - start), (start, end, best)


@pytest.mark.parametrize("oracle", ["ssp", "dp_gd", "exp_mech"])
def test_dp_npg_releases_once_per_round_and_spends_eps(oracle):
    learner, bandit, privacy = bandit_learner(eps=2.0, oracle=oracle, rounds=5, step="norm", lr=0.5)
    for r in range(5):
        learner.train_round(r)
    assert [e["round"] for e in privacy.ledger.entries] == list(range(5))
    assert {e["mechanism"] for e in privacy.ledger.entries} == {"exponential" if oracle == "exp_mech" else oracle}
    assert all(e["users"] == 20 for e in privacy.ledger.entries)
    eps, delta = privacy.spent()
    assert eps == pytest.approx(2.0)
    assert delta == (0.0 if oracle == "exp_mech" else 1e-5)


def test_dp_npg_learns_the_bandit_at_large_eps():
    learner, bandit, _ = bandit_learner(eps=20.0, oracle="ssp", rounds=40, step="norm", lr=0.5)
    start, best = expected_reward(learner, bandit)
    for r in range(40):
        learner.train_round(r)
    end, _ = expected_reward(learner, bandit)
    assert end - start > 0.4 * (best - start), (start, end, best)


@pytest.mark.parametrize("bad", [dict(step="kl", fisher_episodes=0), dict(advantage="group", group_size=1),
                                 dict(advantage="batch")])
def test_settings_that_cannot_work_are_config_errors(bad):
    with pytest.raises(ConfigError):
        bandit_learner(eps=1.0, **{"oracle": "ssp", **bad})


def test_exact_oracle_with_eps_is_a_config_error():
    with pytest.raises(ConfigError):
        bandit_learner(eps=1.0, oracle="exact")


def test_state_dict_round_trip_resumes_identically():
    a, _, _ = bandit_learner(rounds=4, momentum=0.5)
    b, _, _ = bandit_learner(rounds=4, momentum=0.5)
    for r in range(2):
        a.train_round(r), b.train_round(r)
    state = a.state_dict()
    c, _, _ = bandit_learner(rounds=4, momentum=0.5)
    c.load_state_dict(state)
    c.sampler.load_state_dict(a.sampler.state_dict())
    b.train_round(2), c.train_round(2)
    torch.testing.assert_close(b.policy.theta, c.policy.theta)


def test_tail_average_is_the_mean_of_the_last_rounds_iterates_and_survives_a_resume():
    """average_last=k: the final policy is the mean of the parameters the last-iterate learner has after each of
    rounds T-k..T-1 (the iterates themselves are unchanged: rollouts use them); a learner restored inside the
    tail ends at the same average."""
    plain, _, _ = bandit_learner(rounds=5, average_last=0)
    iterates = []
    for r in range(5):
        plain.train_round(r)
        iterates.append(plain.policy.theta.detach().clone())
    averaged, _, _ = bandit_learner(rounds=5, average_last=3)
    for r in range(3):
        averaged.train_round(r)
    torch.testing.assert_close(averaged.policy.theta, iterates[2])  # inside the tail: still the iterate
    resumed, _, _ = bandit_learner(rounds=5, average_last=3)
    resumed.load_state_dict(averaged.state_dict())
    resumed.sampler.load_state_dict(averaged.sampler.state_dict())
    for r in range(3, 5):
        averaged.train_round(r), resumed.train_round(r)
    expected = torch.stack(iterates[2:]).mean(0)
    torch.testing.assert_close(averaged.policy.theta, expected)
    torch.testing.assert_close(resumed.policy.theta, expected)
    assert not torch.allclose(expected, iterates[-1])


@pytest.mark.parametrize("algo", ["dp_npg", pytest.param("npg", marks=pytest.mark.slow)])
def test_cli_dp_npg_and_npg_run_and_write_the_ledger(cli, tiny, tmp_path, algo):
    for algo, extra in ((algo, ["eps=3"] if algo == "dp_npg" else []),):
        out = tmp_path / algo
        res = cli([f"algo={algo}", *extra, *tiny, f"hydra.run.dir={out}"])
        assert res.returncode == 0, res.stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds_done"] == 3
        if algo == "dp_npg":
            assert summary["epsilon_spent"] == pytest.approx(3.0)
            assert [e["mechanism"] for e in summary["ledger"]] == ["ssp"] * 3
            assert all(e["gram"] == "public" and e["adjacency"] == "replace_one" for e in summary["ledger"])
        else:
            assert summary["ledger"] == []


@pytest.mark.slow
def test_cli_bandit_loglinear_with_each_oracle(cli, tmp_path):
    for oracle in ("ssp", "exp_mech"):
        out = tmp_path / oracle
        res = cli(["algo=dp_npg", "env=bandit", "policy=loglinear", f"oracle={oracle}", "rounds=3", "users_per_round=5",
                   "eval_episodes=5", "progress=false", f"hydra.run.dir={out}"])
        assert res.returncode == 0, res.stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert [e["mechanism"] for e in summary["ledger"]] == ["exponential" if oracle == "exp_mech" else oracle] * 3


def test_public_fisher_is_the_expected_outer_product_of_score_features():
    learner = cartpole_learner()
    space = learner.space
    F = learner.public_fisher(0).matrix
    ep = learner.collector.public(learner.policy, "fisher", 0, learner.fisher_episodes)
    obs = ep.obs[ep.mask]
    obs = obs[torch.linspace(0, obs.shape[0] - 1, min(obs.shape[0], learner.fisher_states)).long()]
    probs = torch.softmax(learner.policy.logits(obs), -1).detach().double()
    expected = torch.zeros(space.dim, space.dim, dtype=torch.float64)
    for n in range(obs.shape[0]):
        for a in range(2):
            phi = space.state_action_features(obs[n:n + 1], torch.tensor([a]))[0]
            expected += probs[n, a] * torch.outer(phi, phi) / obs.shape[0]
    torch.testing.assert_close(F, expected)


def test_public_fisher_states_come_from_public_seeds_only():
    """The Fisher's rollouts start from public seeds (>= 2^31), never from a user's reset seed."""
    learner = cartpole_learner()
    seeds = learner.collector.public_seeds("fisher", 5, 50)
    users = learner.collector.user_reset_seeds(range(1000), 1)
    assert min(seeds) >= 2**31 and max(users) < 2**31


def test_redrawn_subspace_is_a_public_function_of_seed_and_round_and_spans_the_head():
    """Round t's basis is orthonormal, the same for the same (seed, t) on any space instance, new every round,
    and the bases of a few rounds together span the whole native space (a fixed one spans only dim of it)."""
    a, b = make_space(mlp(0), "head", dim=8, seed=3), make_space(mlp(1), "head", dim=8, seed=3)
    bases = []
    for t in range(9):
        old = a.projection.clone()
        change = a.redraw(t)
        b.redraw(t)
        P = a.projection
        torch.testing.assert_close(P.T @ P, torch.eye(8, dtype=torch.float64))
        assert torch.equal(P, b.projection)  # a function of (seed, round) only: no policy, no data
        torch.testing.assert_close(change, P.T @ old)  # d in the new coordinates: P_t^T P_{t-1} d
        bases.append(P)
    assert not torch.allclose(bases[0], bases[1])
    assert torch.linalg.matrix_rank(torch.cat(bases, 1)) == a.native_dim  # 9 x 8 = 72 >= 65 columns
    assert make_space(mlp(0), "head", dim=None, seed=3).redraw(1) is None  # the whole space: nothing to redraw


def test_redrawn_subspace_carries_the_direction_and_resumes_from_a_checkpoint():
    """A learner restored from state_dict() continues with the same subspace, direction and policy as the
    uninterrupted one (the subspace of the round it stopped at travels with the checkpoint)."""
    def learner():
        env = GymEnvFactory("CartPole-v1", horizon=40)
        policy = mlp(0)
        return NaturalPolicyGradient(policy, env, PrivacyContext(), OnePassUserSampler(3), make_oracle("exact"),
                                     seed=5, rounds=4, group_size=4, reward_bound=1.0, momentum=0.5,
                                     space=make_space(policy, "head", dim=8, seed=5))
    a, b = learner(), learner()
    for r in range(2):
        a.train_round(r), b.train_round(r)
    old_P, old_d = a.space.projection.clone(), a.direction.clone()
    c = learner()
    c.load_state_dict(a.state_dict())
    c.sampler.load_state_dict(a.sampler.state_dict())
    assert torch.equal(c.space.projection, old_P)
    b.train_round(2), c.train_round(2)
    new_P = b.space.projection
    assert not torch.allclose(new_P, old_P)
    torch.testing.assert_close(c.space.projection, new_P)
    torch.testing.assert_close(b.policy.head.weight, c.policy.head.weight)
    torch.testing.assert_close(b.direction, c.direction)
