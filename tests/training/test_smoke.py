import json
import os

import pytest
import torch

import dppo
from dppo.training.callbacks import Callback

SCHEMA = {"algo", "env_id", "seed", "eps", "delta", "epsilon_spent", "delta_spent", "rounds_done", "users_seen",
          "final_return", "wall_time_s", "ledger", "adjacency", "noise_source", "users_burned", "diag"}


@pytest.mark.parametrize("algo", ["pg", "dp_pg"])
def test_three_round_run_writes_summary_with_schema(algo, tiny, tmp_path):
    summary = dppo.train([f"algo={algo}", *tiny], run_dir=str(tmp_path))
    on_disk = json.load(open(tmp_path / "summary.json"))
    assert SCHEMA <= set(on_disk) and on_disk["rounds_done"] == 3 and on_disk["users_seen"] == 9
    assert on_disk["algo"] == algo and "best_round_return" in on_disk["diag"]
    if algo == "dp_pg":
        assert len(on_disk["ledger"]) == 3 and on_disk["epsilon_spent"] == pytest.approx(5.0)
        e = on_disk["ledger"][0]
        assert {"mechanism", "round", "users", "eps", "delta", "noise_multiplier", "sensitivity", "sigma",
                "adjacency"} <= set(e)
        assert e["noise_multiplier"] == pytest.approx(e["sigma"] / e["sensitivity"])
        assert on_disk["adjacency"] == "replace_one" and on_disk["noise_source"] == "seeded"
    else:
        assert on_disk["ledger"] == [] and on_disk["epsilon_spent"] == 0.0
    assert os.listdir(tmp_path / "checkpoints") and any(f.startswith("events.out") for f in os.listdir(tmp_path))
    assert summary["final_return"] > 0


def test_tensorboard_has_the_documented_keys(tiny, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dppo.train(["algo=dp_pg", *tiny], run_dir=str(tmp_path))
    acc = EventAccumulator(str(tmp_path)).Reload()
    keys = set(acc.Tags()["scalars"])
    assert {"diag/return", "diag/episode_length", "privacy/epsilon", "privacy/noise_multiplier",
            "diag/clip_fraction", "diag/reward_clip_fraction", "diag/env_steps",
            "diag/zero_spread_fraction", "rollout/episodes", "losses/grad_norm", "perf/users_per_s"} <= keys
    assert not {"rollout/return", "privacy/clip_fraction", "privacy/reward_clip_fraction"} & keys
    assert acc.Tags()["tensors"]  # the hyper-parameter text table


def test_callback_returning_false_stops_cleanly_with_checkpoint(tiny, tmp_path):
    class StopAfterOne(Callback):
        def on_round_end(self, trainer, round_idx, metrics):
            return round_idx < 0

    s = dppo.train(["algo=dp_pg", *tiny, "rounds=5"], run_dir=str(tmp_path), callbacks=[StopAfterOne()])
    assert s["rounds_done"] == 1 and "callback" in s["stop_reason"]
    assert os.path.exists(tmp_path / "checkpoints" / "ckpt_000001.pt")


def test_own_policy_module_can_be_passed_in(tiny):
    from dppo.policies.base import Policy

    class Linear(Policy):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def logits(self, obs):
            return self.lin(obs)

    pol = Linear()
    before = pol.lin.weight.detach().clone()
    dppo.train(["algo=dp_pg", *tiny], policy=pol)
    assert not torch.equal(before, pol.lin.weight)


def test_init_from_loads_pretrained_weights(tiny, tmp_path):
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.policies.mlp import MLPPolicy

    env = GymEnvFactory("CartPole-v1")
    pre = MLPPolicy(env.observation_space, env.action_space)
    torch.nn.init.constant_(pre.head.bias, 0.25)
    torch.save(pre.state_dict(), tmp_path / "pre.pt")
    cfg = dppo.make_config(["algo=dp_pg", *tiny, f"policy.init_from={tmp_path / 'pre.pt'}", "policy.init_users_offset=0",
                            "eval_episodes=0"])
    from dppo.build import build

    trainer = build(cfg)
    assert torch.allclose(trainer.learner.policy.head.bias, torch.full((2,), 0.25))


def test_multi_pass_uses_rdp_accountant(tiny):
    s = dppo.train(["algo=dp_pg", *tiny, "privacy.multi_pass=true", "privacy.population_size=30", "eps=8"])
    assert s["accountant"] == "rdp" and 0 < s["epsilon_spent"] <= 8.0 + 1e-6


def test_budget_cap_stops_run_cleanly(tiny, tmp_path):
    """A cap between the first round's spend and the run's total stops the run after a few rounds, cleanly."""
    from dppo.privacy.accountants.opacus import multi_pass_first_release_epsilon

    first = multi_pass_first_release_epsilon(50.0, 1e-5, 3 / 12, 4, "rdp")
    cap = 1.01 * first  # admits round 0, not all four
    s = dppo.train(["algo=dp_pg", *tiny, "rounds=4", "privacy.multi_pass=true", "privacy.population_size=12",
                    "eps=50", f"privacy.max_epsilon={cap}"], run_dir=str(tmp_path))
    assert 1 <= s["rounds_done"] < 4 and "max_epsilon" in s["stop_reason"] and s["epsilon_spent"] <= cap


def test_multi_pass_round_with_no_sampled_user_releases_noise_only():
    from dppo.build import build

    # algo.shrink=false: the James-Stein step (on by default) shrinks a pure-noise mean to zero whenever its squared
    # norm is below d s^2 (about 60% of draws for d = 8), which is right but hides the noise this test looks for
    cfg = dppo.make_config(["algo=dp_pg", "rounds=2", "users_per_round=1", "progress=false", "eval_episodes=0",
                            "privacy.multi_pass=true", "privacy.population_size=1000", "eps=8", "algo.shrink=false"])
    trainer = build(cfg)
    trainer.sampler.next_round = lambda: []
    before = [p.detach().clone() for p in trainer.learner.policy.parameters()]
    metrics = trainer.learner.train_round(0)
    assert metrics["rollout/users"] == 0 and len(trainer.privacy.ledger) == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.learner.policy.parameters()))
