"""Provenance chains (issue 47, item 4): a statement ``policy.init_data_disjoint=true`` is about one run's rows
only. Run A consumes 16 private rows of F1; run B starts from A's lone ``policy.pt`` on another file F2,
stating (truly) that F2 shares no person with A's data; a run C from B back on F1 must never train on A's
rows. A's members are in no record B could read, so B keeps A's withheld entry, marked as stated disjoint
from F2's rows, and any later run from B (or from its descendants, however deep) on other rows is refused
in one line (exit 2); from A's run directory the members are known and the chain skips them instead."""
from __future__ import annotations

import json

import pytest
import torch

from dppo.api import make_config, train
from dppo.cli import entry
from dppo.envs.prompts import load_rows
from dppo.envs.tasks.addition import digit_reward, write_prompts
from dppo.errors import ConfigError
from tests.lm.conftest import lm_overrides


def _private(path) -> set:
    return {r["prompt"] for r in load_rows(str(path)) if r["split"] == "private"}


def _run(path, run_dir, *extra) -> set:
    """A 2-round dp_pg run (16 private rows consumed) on the prompts file ``path``: the private prompts it saw."""
    seen: list = []

    def reward(prompts, completions, answer, **_):
        seen.extend(prompts)
        return digit_reward(prompts, completions, answer)

    train(make_config(lm_overrides(str(path), "algo=dp_pg", "eps=8", *extra)), str(run_dir), reward_funcs=[reward])
    return set(seen) & _private(path)


def _refused(path, run_dir, *extra) -> str:
    with pytest.raises(ConfigError) as err:
        _run(path, run_dir, *extra)
    assert "\n" not in str(err.value) and not run_dir.exists()
    return str(err.value)


@pytest.fixture(scope="module")
def chain(small_prompts, tmp_path_factory):
    """F1 (the shared small file), F2 (its rows share no private prompt with F1), A on F1, B from A's lone
    policy.pt on F2 with the statement."""
    root = tmp_path_factory.mktemp("chain")
    f2 = root / "f2.jsonl"
    write_prompts(str(f2), public=16, private=64, seed=4)
    rows = [r for r in load_rows(str(f2)) if not (r["split"] == "private" and r["prompt"] in _private(small_prompts))]
    f2.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert not _private(small_prompts) & _private(f2)
    a = _run(small_prompts, root / "A")
    assert len(a) == 16
    b = _run(f2, root / "B", f"+policy.init_from={root / 'A'}/policy.pt", "+policy.init_data_disjoint=true")
    assert len(b) == 16
    return {"f1": small_prompts, "f2": f2, "root": root, "a": a, "b": b}


def test_the_statement_keeps_the_withheld_entry_in_the_secret_record_only(chain):
    root = chain["root"]
    ckpt = sorted((root / "B" / "checkpoints").glob("*.pt"))[-1]
    secret = torch.load(ckpt, weights_only=True)["provenance"]["consumed"]
    a_entry, b_entry = sorted(secret, key=lambda e: not e.get("withheld"))
    assert a_entry["withheld"] and len(a_entry["stated_disjoint"]) == 1 and len(b_entry["members"]) == 16
    shared = json.dumps(torch.load(root / "B" / "policy.pt", weights_only=True)["provenance"])
    assert "stated_disjoint" not in shared and "key" not in shared and "members" not in shared


@pytest.mark.parametrize("how", ["run_dir", "init_provenance"])
def test_a_run_from_b_back_on_a_s_rows_is_refused(chain, tmp_path, how):
    """Repro: C = policy.init_from=<B> on F1 trained on A's 16 rows, unnoticed (eps 5 printed, ~7.5 true)."""
    b = chain["root"] / "B"
    extra = [f"+policy.init_from={b}"] if how == "run_dir" else [f"+policy.init_from={b}/policy.pt",
                                                                  f"+policy.init_provenance={b}"]
    msg = _refused(chain["f1"], tmp_path / "C", *extra)
    assert "stated disjoint from other rows" in msg and "policy.init_data_disjoint=true" in msg


def test_the_cli_refuses_it_in_one_line_exit_2(chain, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        entry(lambda: None, lm_overrides(str(chain["f1"]), "algo=dp_pg", "eps=8",
                                         f"+policy.init_from={chain['root'] / 'B'}", f"hydra.run.dir={tmp_path}/C"))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dppo: error")]
    assert exc.value.code == 2 and len(lines) == 1 and "cannot be skipped" in lines[0]
    assert not (tmp_path / "C").exists()


def test_deeper_chains_on_the_stated_rows_go_on_and_back_on_a_s_rows_are_refused(chain, tmp_path):
    """C from B on F2's rows (renamed, reordered): B's statement covers them, B's own rows are skipped; D from C on
    F1 is refused; C3 on a third file states its own, and D from C3 on F1 is refused as well."""
    f2, root = chain["f2"], chain["root"]
    moved = tmp_path / "f2_renamed.jsonl"
    moved.write_text("".join(reversed(f2.read_text().splitlines(keepends=True))))
    c = _run(moved, tmp_path / "C", f"+policy.init_from={root / 'B'}")
    assert len(c) == 16 and not c & chain["b"]
    _refused(chain["f1"], tmp_path / "D", f"+policy.init_from={tmp_path / 'C'}")
    fresh = sorted(_private(f2) - chain["b"] - c)[:16]   # F2's rows no run saw: another set of rows, F3
    rows = [r for r in load_rows(str(f2)) if r["split"] == "public" or r["prompt"] in fresh]
    f3 = tmp_path / "f3.jsonl"
    f3.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _refused(f3, tmp_path / "C3x", f"+policy.init_from={tmp_path / 'C'}")   # B's statement was about F2's rows
    c3 = _run(f3, tmp_path / "C3", f"+policy.init_from={tmp_path / 'C'}", "+policy.init_data_disjoint=true",
              "rounds=1")
    assert c3 and not c3 & chain["b"]
    _refused(chain["f1"], tmp_path / "D3", f"+policy.init_from={tmp_path / 'C3'}")


def test_from_a_s_run_directory_the_chain_skips_a_s_rows(chain, tmp_path):
    """B' from A's run directory (members known) on F2 with the statement: C' from B' on F1 skips A's rows, and
    D' from C' on F1 skips A's and C''s."""
    root, f1 = chain["root"], chain["f1"]
    _run(chain["f2"], tmp_path / "B", f"+policy.init_from={root / 'A'}", "+policy.init_data_disjoint=true")
    c = _run(f1, tmp_path / "C", f"+policy.init_from={tmp_path / 'B'}")
    assert len(c) == 16 and not c & chain["a"]
    d = _run(f1, tmp_path / "D", f"+policy.init_from={tmp_path / 'C'}")
    assert len(d) == 16 and not d & (chain["a"] | c)
