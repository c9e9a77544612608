"""scripts/example_private_ppo_loop.py: a CleanRL-shaped PPO loop made private with ``dppo.make_private`` writes the
ledger that ``algo=dp_ppo`` writes for the same privacy-relevant settings, its accountant prints the target, and it
meets the example's shape: top-level names only (no ``dppo.privacy`` import), no hand-written ``p.grad``, <= 100
lines."""
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


def test_the_example_uses_top_level_names_only_and_writes_no_gradient_by_hand():
    import ast

    source = open(SCRIPT).read()
    imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    dppo_imports = [(getattr(n, "module", None), [a.name for a in n.names]) for n in imports
                    if any(a.name.startswith("dppo") for a in n.names) or (getattr(n, "module", "") or "").startswith("dppo")]
    assert dppo_imports == [(None, ["dppo"])]                       # `import dppo`, nothing deeper
    assert "dppo.privacy" not in source and ".grad =" not in source and "p.grad" not in source
    assert len(source.splitlines()) <= 100
