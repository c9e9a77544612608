"""Fine-tuning on prompts never reuses a person: the members a run consumed are keyed digests of their
content, kept in its secret files, so ``policy.init_from`` skips the same prompts whatever file, object,
name or order they arrive in; a lone shareable ``policy.pt`` carries no member list and is refused in one
line unless the source run's directory is named or the data are stated disjoint."""
from __future__ import annotations

import json

import pytest
import torch

from dppo.api import make_config, train
from dppo.envs.prompts import load_rows
from dppo.envs.tasks.addition import digit_reward
from dppo.errors import ConfigError
from tests.lm.conftest import lm_overrides


def _recorder(private_prompts: set):
    seen: list = []

    def reward(prompts, completions, answer, **_):
        seen.extend(p for p in prompts if p in private_prompts)
        return digit_reward(prompts, completions, answer)

    return reward, seen


@pytest.fixture(scope="module")
def source_run(small_prompts, tmp_path_factory):
    """Run 1: 16 private prompts consumed, the rows passed from Python."""
    rows = load_rows(small_prompts)
    strip = [{k: v for k, v in r.items() if k != "split"} for r in rows]
    public = [r for r, s in zip(strip, rows) if s["split"] == "public"]
    private = [r for r, s in zip(strip, rows) if s["split"] == "private"]
    reward, seen = _recorder({r["prompt"] for r in private})
    run = tmp_path_factory.mktemp("source") / "run"
    train(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8")), str(run), reward_funcs=[reward],
          train_dataset=private, eval_dataset=public)
    assert len(set(seen)) == 16
    # the same rows as a file under another name, in another order
    moved = tmp_path_factory.mktemp("moved") / "same_rows_renamed.jsonl"
    moved.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    return run, set(seen), str(moved), {r["prompt"] for r in private}


def _fine_tune(moved, private, run_dir, *extra):
    reward, seen = _recorder(private)
    cfg = make_config(lm_overrides(moved, "algo=dp_pg", "eps=8", *extra))
    train(cfg, str(run_dir), reward_funcs=[reward])
    return set(seen)


def test_the_shared_policy_pt_carries_no_member_list(source_run):
    run, _, _, _ = source_run
    saved = torch.load(run / "policy.pt", weights_only=True)
    (e,) = saved["provenance"]["consumed"]
    assert e == {"population": {"kind": "content", "env_id": e["population"]["env_id"]}, "users": [],
                 "all": False, "source": "training", "withheld": True}
    assert "key" not in json.dumps(saved["provenance"]) and "members" not in json.dumps(saved["provenance"])


def test_a_lone_policy_pt_on_prompts_is_refused_in_one_line(source_run, tmp_path):
    run, _, moved, private = source_run
    with pytest.raises(ConfigError) as err:
        _fine_tune(moved, private, tmp_path / "refused", f"+policy.init_from={run}/policy.pt")
    assert "\n" not in str(err.value) and "policy.init_provenance=<run_dir>" in str(err.value)
    assert "policy.init_data_disjoint=true" in str(err.value) and not (tmp_path / "refused").exists()
    seen = _fine_tune(moved, private, tmp_path / "stated", f"+policy.init_from={run}/policy.pt",
                      "+policy.init_data_disjoint=true")       # the user's statement: nothing is skipped
    assert len(seen) == 16


@pytest.mark.parametrize("how", ["init_provenance", "run_dir"])
def test_fine_tuning_skips_the_same_prompts_under_another_file_name_and_order(source_run, tmp_path, how):
    """Repro: run 2 on the same rows, given as a renamed, reversed file: 0 of run 1's 16 prompts reused."""
    run, consumed, moved, private = source_run
    extra = ([f"+policy.init_from={run}/policy.pt", f"+policy.init_provenance={run}"] if how == "init_provenance"
             else [f"+policy.init_from={run}"])
    seen = _fine_tune(moved, private, tmp_path / "fine", *extra)
    assert len(seen) == 16 and not seen & consumed
    shared = torch.load(tmp_path / "fine" / "policy.pt", weights_only=True)["provenance"]
    assert all(e.get("withheld") for e in shared["consumed"])    # still no member list, after two runs
    ckpt = sorted((tmp_path / "fine" / "checkpoints").glob("*.pt"))[-1]
    secret = torch.load(ckpt, weights_only=True)["provenance"]["consumed"]
    assert [e["population"]["kind"] for e in secret] == ["content", "content"]   # each run's key, its members
    assert [len(e["members"]) for e in secret] == [16, 16]          # the secret record: both runs' prompts


def test_init_provenance_must_be_the_run_that_wrote_the_weights(source_run, tmp_path, small_prompts):
    run, _, moved, private = source_run
    other = tmp_path / "other"
    train(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "rounds=1")), str(other))
    with pytest.raises(ConfigError, match="is not the run that wrote policy.init_from"):
        _fine_tune(moved, private, tmp_path / "x", f"+policy.init_from={run}/policy.pt",
                   f"+policy.init_provenance={other}")
