"""Multi-pass DP-PPO (privacy.multi_pass=true): Poisson-sampled users, one subsampled-Gaussian ledger entry per
round, the eps the run prints recomputed with Opacus' RDP accountant from the ledger, the one-line refusal of
minibatches, and a round that draws nobody (its sums are noise only, still accounted)."""
import pytest
import torch
from opacus.accountants import RDPAccountant as OpacusRDP

import dppo
from dppo.algos.ppo import PPO
from dppo.data.sampler import PoissonUserSampler
from dppo.envs.gym_env import GymEnvFactory
from dppo.errors import ConfigError
from dppo.policies.mlp import MLPPolicy
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants.opacus import RDPAccountant

RUN = ["algo=dp_ppo", "eps=3", "privacy.multi_pass=true", "privacy.population_size=40", "users_per_round=8",
       "rounds=4", "privacy.secure_rng=false", "algo.minibatches=1", "algo.epochs=2", "env.horizon=30",
       "eval_episodes=2", "progress=false"]


def test_the_printed_eps_is_the_accountants_recomputed_from_the_ledger(tmp_path):
    summary = dppo.train(RUN, run_dir=str(tmp_path / "run"))
    ledger = summary["ledger"]
    assert len(ledger) == 4 and {e["mechanism"] for e in ledger} == {"poisson_composed_gaussian_sum"}
    assert all(e["adjacency"] == "add_remove" and e["sample_rate"] == pytest.approx(0.2) for e in ledger)
    assert all(e["releases_per_user"] == 4 for e in ledger)   # 2 x epochs
    direct = OpacusRDP()
    direct.history = [(e["noise_multiplier"], e["sample_rate"], 1) for e in ledger]
    eps = direct.get_epsilon(1e-5)
    assert summary["epsilon_spent"] == pytest.approx(eps, rel=1e-9) and 2.8 < eps <= 3.0 + 1e-9


def test_multi_pass_with_several_minibatches_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="algo.minibatches=1"):
        dppo.train([*RUN[:-4], "algo.minibatches=2", *RUN[-3:]], run_dir=str(tmp_path / "run"))


def test_a_round_that_draws_nobody_releases_noise_only_and_is_accounted():
    torch.manual_seed(0)
    env = GymEnvFactory("CartPole-v1", horizon=20)
    policy = MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    privacy = PrivacyContext(3.0, 1e-5, accountant=RDPAccountant(), noise=NoiseSource(0, secure=False),
                             multi_pass=True, population_size=40)
    learner = PPO(policy, env, privacy, PoissonUserSampler(8, 40, seed=0), seed=0, rounds=4, max_grad_norm=1.0,
                  group_size=1, epochs=2, critic_hidden_sizes=(4,), reward_bound=1.0)
    before = [p.detach().clone() for p in policy.parameters()]
    stats = learner.update(None, 0, [])
    # the entry records the expected count q N = 8 (public), not the realised 0 (private under add/remove)
    assert len(privacy.ledger) == 1 and privacy.ledger.entries[0]["users"] == 8
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))   # it stepped along the noise
    assert stats["losses/actor_update_norm"] > 0 and "diag/value_error" not in stats
