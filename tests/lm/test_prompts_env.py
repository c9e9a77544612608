"""env=prompts: reward errors (one line, exit 2, nothing released), one-pass use of prompts, splits."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.cli_helpers import run_cli
from dppo.api import make_config, train
from dppo.envs.prompts import PromptsEnv
from dppo.errors import ConfigError, DataError, PrivacyError
from dppo.training.callbacks import Callback
from tests.lm.conftest import REWARD, lm_overrides


def ledger_entries(ledger_state):
    return ledger_state["entries"] if isinstance(ledger_state, dict) else ledger_state


def test_columns_reach_the_reward_and_rewards_are_clipped(small_prompts):
    env = PromptsEnv(small_prompts, REWARD)
    rows = env.private[:3]
    answers = [r["answer"] for r in rows]
    out, clipped = env.rewards(rows, [a for a in answers for _ in range(2)], 2, reward_bound=0.5)
    assert out.shape == (3, 2) and np.all(out == 0.5) and clipped == 6  # exact answers earn 1, clipped to 0.5


@pytest.mark.parametrize("reward", ["tests.lm.rewards.wrong_length", "tests.lm.rewards.nan_reward"])
def test_bad_reward_values_release_nothing(small_prompts, tmp_path, reward):
    cfg = make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", f"env.reward={reward}"))
    with pytest.raises(DataError):
        train(cfg, str(tmp_path / "run"))
    state = torch.load(next((tmp_path / "run" / "checkpoints").glob("ckpt_*.pt")), weights_only=True)
    assert state["round"] == 0 and not ledger_entries(state["privacy"]["ledger"])
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["ledger"] == []


def test_reward_value_error_is_one_line_exit_2(small_prompts, tmp_path):
    r = run_cli(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "env.reward=tests.lm.rewards.nan_reward",
                             f"hydra.run.dir={tmp_path / 'run'}"))
    assert r.returncode == 2 and "NaN" in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("dppo: error")]) == 1
    summary = tmp_path / "run" / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["ledger"] == []


def test_bad_reward_target_is_one_line_exit_2_before_any_run(small_prompts, tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "env.reward=no_such_module.reward",
                             f"hydra.run.dir={run_dir}"))
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip() and "warn" not in line.lower()]
    assert lines == [lines[0]] and lines[0].startswith("dppo: error") and "cannot be imported" in lines[0]
    assert not (run_dir / "summary.json").exists()


@pytest.mark.parametrize("override,needle", [
    ("policy.max_new_tokens=30", "longer than the model's context"),
    ("users_per_round=40", "private prompts"),
])
def test_config_errors_are_raised_at_build_before_any_release(small_prompts, override, needle):
    """The CLI's pre-flight build raises these before a run directory exists (one line, exit 2)."""
    from dppo.build import build

    with pytest.raises(ConfigError, match=needle):
        build(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", override)))


def test_user_ids_map_to_distinct_private_rows_and_never_to_public(small_prompts):
    env = PromptsEnv(small_prompts, REWARD, seed=5)
    rows = env.user_rows(range(env.population))
    prompts = [r["prompt"] for r in rows]
    assert len(set(prompts)) == env.population == 64
    assert not set(prompts) & {r["prompt"] for r in env.public}
    with pytest.raises(PrivacyError):
        env.user_rows([env.population])
    other = PromptsEnv(small_prompts, REWARD, seed=6)
    assert [r["prompt"] for r in other.user_rows(range(8))] != prompts[:8]  # the order depends on the seed


def test_a_file_without_split_column_is_all_private_unless_public_size(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i:03d}+000=", "answer": f"0{i:03d}"}) for i in range(20)))
    env = PromptsEnv(str(path), REWARD)
    assert env.public == [] and env.population == 20 and not env.evaluates
    assert "no 'split' column and no env.eval_path: all 20 rows" in env.split_note
    env = PromptsEnv(str(path), REWARD, public_size=5)
    assert len(env.public) == 5 and env.population == 15


def test_a_prompt_is_never_used_twice_across_rounds_and_resume(small_prompts, tmp_path):
    run = tmp_path / "run"
    seen = []
    original = PromptsEnv.user_rows

    def spy(self, users):
        rows = original(self, users)
        seen.extend(r["prompt"] for r in rows)
        return rows

    class StopAfterTwo(Callback):
        def on_round_end(self, trainer, round_idx, metrics):
            return round_idx < 1

    PromptsEnv.user_rows = spy
    try:
        cfg = make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "checkpoint_every=1", "rounds=4"))
        first = train(cfg, str(run), callbacks=[StopAfterTwo()])
        assert first["rounds_done"] == 2
        summary = train(cfg, str(run), resume=True)
    finally:
        PromptsEnv.user_rows = original
    assert summary["rounds_done"] == 4 and len(summary["ledger"]) == 4
    assert len(seen) == 4 * 8 == len(set(seen))  # 4 rounds x 8 users, all distinct
    assert summary["users_seen"] == 32


def test_shipped_prompts_file_loads_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty directory: the relative default resolves against the repository
    env = PromptsEnv("assets/lm/addition.jsonl.gz", REWARD)
    assert len(env.public) == 512 and len(env.private) == 16384
    with pytest.raises(ConfigError, match="is not a file"):
        PromptsEnv("assets/lm/missing.jsonl", REWARD)
