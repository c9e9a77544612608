"""scripts/example_private_ppo_loop.py: a CleanRL-shaped PPO loop released through dppo's public release writes the
ledger that ``algo=dp_ppo`` writes for the same privacy-relevant settings, and its accountant prints the target."""
import json
import os
import subprocess
import sys

import pytest

import dppo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "example_private_ppo_loop.py")


def test_the_example_loop_writes_the_ledger_of_algo_dp_ppo(tmp_path):
    path = tmp_path / "example.json"
    r = subprocess.run([sys.executable, SCRIPT, "--rounds", "2", "--users-per-round", "4", "--epochs", "2",
                        "--minibatches", "2", "--horizon", "30", "--eps", "2", "--max-grad-norm", "0.05",
                        "--critic-max-grad-norm", "0.05", "--actor-share", "0.6", "--seeded-noise",
                        "--ledger", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    example = json.load(open(path))
    summary = dppo.train(["algo=dp_ppo", "eps=2", "rounds=2", "users_per_round=4", "group_size=1",
                          "algo.epochs=2", "algo.minibatches=2", "max_grad_norm=0.05",
                          "algo.critic_max_grad_norm=0.05", "algo.actor_share=0.6", "env.horizon=30",
                          "eval_episodes=2", "progress=false", "privacy.secure_rng=false"], run_dir=str(tmp_path / "run"))
    assert len(example["ledger"]) == 2 and example["ledger"] == summary["ledger"]
    assert example["ledger"][0]["releases_per_user"] == 4   # 2 x epochs: actor and critic, one minibatch an epoch
    assert example["spent"] == pytest.approx([2.0, 1e-5])   # the accountant's (eps, delta): one-pass users
