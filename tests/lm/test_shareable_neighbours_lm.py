"""The neighbouring-data test of tests/training/test_shareable_neighbours.py for ``env=prompts``: one private
row replaced (by a prompt of another length) in a prompts file, and in rows passed from Python; every
shareable file (summary.json, policy.pt and its config, .hydra/, the adapter folder, events, progress.csv)
is identical once the released tensors and metrics are masked. The test fails when a hash of the rows is
put back into the config (the leak of issue 35, repro 1)."""
from __future__ import annotations

import hashlib
import json

import pytest
from omegaconf import open_dict

from dppo.api import make_config, train
from dppo.envs.prompts import PromptsEnv, canonical, load_rows
from tests.lm.conftest import REWARD, lm_overrides
from tests.training.test_shareable_neighbours import (QUIET, _cli, assert_neighbours_indistinguishable,
                                                      differences, neighbouring_runs)

REPLACEMENT = {"prompt": "7+8=", "answer": "15"}     # another length than every row of the file


def _neighbour(rows: list[dict], path_for_mapping: str) -> list[dict]:
    """``rows`` with the private row that user 0 trains on replaced."""
    first = PromptsEnv(path_for_mapping, REWARD, seed=0).user_rows([0])[0]
    i = next(i for i, r in enumerate(rows) if r["prompt"] == first["prompt"] and r.get("split") != "public")
    return [dict(REPLACEMENT, **({"split": r["split"]} if "split" in r else {})) if j == i else r
            for j, r in enumerate(rows)]


def _write(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_a_prompts_file_neighbour_writes_the_same_shareable_files(small_prompts, tmp_path):
    """One private row of the file replaced; the same path in both runs."""
    rows = load_rows(small_prompts)
    data = str(tmp_path / "data.jsonl")
    worlds = {"a": rows, "b": _neighbour(rows, small_prompts)}

    def run(world, run_dir):
        _write(data, worlds[world])
        _cli([*lm_overrides(data, "algo=dp_pg"), *QUIET], run_dir)

    a, b = neighbouring_runs(tmp_path, run)
    assert_neighbours_indistinguishable(a, b)
    assert (tmp_path / "a" / "adapter").is_dir() and (tmp_path / "a" / ".hydra" / "config.yaml").is_file()


def _python_rows_runs(small_prompts, tmp_path):
    rows = load_rows(small_prompts)
    strip = [{k: v for k, v in r.items() if k != "split"} for r in rows]
    public = [r for r, s in zip(strip, rows) if s["split"] == "public"]
    worlds = {}
    for world, given in (("a", rows), ("b", _neighbour(rows, small_prompts))):
        worlds[world] = [{k: v for k, v in r.items() if k != "split"} for r in given if r["split"] == "private"]

    def run(world, run_dir):
        cfg = make_config(lm_overrides(small_prompts, "algo=dp_pg", *QUIET))
        train(cfg, run_dir, train_dataset=worlds[world], eval_dataset=public)

    return neighbouring_runs(tmp_path, run), public, worlds


def test_python_rows_neighbours_write_the_same_shareable_files(small_prompts, tmp_path):
    """``dppo.train(..., train_dataset=rows)`` with one private row replaced."""
    (a, b), _, _ = _python_rows_runs(small_prompts, tmp_path)
    assert_neighbours_indistinguishable(a, b)


def test_the_neighbour_test_catches_a_hash_of_the_rows_put_back_in_the_config(small_prompts, tmp_path,
                                                                                monkeypatch):
    """The comparison is not blind: the SHA-256 of the rows written into ``cfg.env`` (as dppo did before)
    makes policy.pt's config differ between neighbours."""
    from dppo.build import env as build   # where build_env calls it

    record = build.record_env_inputs

    def with_hash(cfg, env, given):
        record(cfg, env, given)
        rows = env.public + env.private
        with open_dict(cfg):
            cfg.env.data_sha256 = hashlib.sha256(b"".join(canonical(r) + b"\n" for r in rows)).hexdigest()

    monkeypatch.setattr(build, "record_env_inputs", with_hash)
    (a, b), _, _ = _python_rows_runs(small_prompts, tmp_path)
    assert "policy.pt" in differences(a, b)
