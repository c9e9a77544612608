"""scripts/default_learner.py scores each learner's defaults between the random policy and the suite's best
non-private result per env, and names the learner with the best mean score."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    path = os.path.join(ROOT, "scripts", "default_learner.py")
    spec = importlib.util.spec_from_file_location("default_learner", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_best_non_private_result_per_env_is_the_suites_best_row_without_eps(tmp_path):
    mod = _module()
    suite = tmp_path / "suite.md"
    header = "| learner | seeds | steps | final return (mean) | min |\n|---|---|---|---|---|\n"
    suite.write_text("# x\n\n## CartPole-v1\n\n" + header + "| PPO | 10 | 1 | 491.9 | 1 |\n"
                     "| DP-PPO eps=5 | 10 | 1 | 499.0 | 1 |\n| SB3-PPO | 10 | 1 | 500.0 | 1 |\n"
                     "\n## Acrobot-v1\n\n" + header + "| NPG | 10 | 1 | -86.5 | 1 |\n| DP-NPG eps=1 | 10 | 1 | -60.0 | 1 |\n")
    assert mod.best_non_private(str(suite)) == {"CartPole-v1": 500.0, "Acrobot-v1": -86.5}
    assert set(mod.best_non_private()) >= set(mod.ENVS)     # the shipped reference covers every env
    assert mod.score(22.0, 22.0, 500.0) == 0 and mod.score(500.0, 22.0, 500.0) == 1
    assert mod.score(-293.0, -500.0, -86.0) == pytest.approx(0.5)


def test_it_runs_every_learner_on_every_env_named_and_picks_the_best_mean_score(capsys, tmp_path):
    mod = _module()
    scores = mod.main(["rounds=1", "users_per_round=2", "group_size=2", "eval_episodes=2", "env.horizon=20",
                       "--seeds", "0", "--envs", "CartPole-v1", "--algos", "dp_pg", "dp_npg",
                       "--out", str(tmp_path / "report.md")])
    out = capsys.readouterr().out
    report = (tmp_path / "report.md").read_text()
    assert report.splitlines()[-1] == out.strip().splitlines()[-1] and "| mean score |" in report
    assert set(scores) == {"dp_pg", "dp_npg"}
    assert f"default: algo={max(scores, key=scores.get)}" in out and "| CartPole-v1 | 22.0 | 500.0 |" in out
