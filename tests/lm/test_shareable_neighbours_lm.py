"""The neighbouring-data test of tests/training/test_shareable_neighbours.py for ``env=prompts``: one private
row replaced (by a prompt of another length) in a prompts file, and in rows passed from Python; every
shareable file (summary.json, policy.pt and its config, .hydra/, the model/ folder, events, progress.csv)
is identical once the released tensors and metrics are masked, each neighbour run in a process of its own
with its own hash seed. The test fails when a hash of the rows is put back into the config (the leak of issue
35, repro 1)."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
from omegaconf import open_dict

from dppo.api import make_config, train
from dppo.envs.prompts import PromptsEnv, canonical, load_rows
from tests.lm.conftest import REWARD, lm_overrides
from tests.training.test_shareable_neighbours import (QUIET, _cli, assert_neighbours_indistinguishable,
                                                      differences, neighbouring_runs, neighbours_in_own_processes,
                                                      shareable_view)

MODULE = "tests.lm.test_shareable_neighbours_lm"

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


def _spec(run_dir) -> dict:
    """What the fixture wrote for the worlds' processes (``spec.json`` beside the run directory)."""
    return json.load(open(os.path.join(os.path.dirname(run_dir), "spec.json")))


def prompts_file_world(world, run_dir):
    """The world's rows written to one prompts file (the same path in both worlds), then a CLI run on it."""
    spec = _spec(run_dir)
    _write(spec["data"], spec["file_rows"][world])
    _cli([*lm_overrides(spec["data"], "algo=dp_pg"), *QUIET], run_dir)


def python_rows_world(world, run_dir):
    """``dppo.train(cfg, run_dir, train_dataset=rows, eval_dataset=public)`` with the world's private rows."""
    spec = _spec(run_dir)
    python_rows_world_in(world, run_dir, spec["private"], spec["public"], spec["prompts"])


def python_rows_world_in(world, run_dir, worlds, public, prompts):
    """The world's ``python_rows_world`` run in this process."""
    cfg = make_config(lm_overrides(prompts, "algo=dp_pg", *QUIET))
    train(cfg, run_dir, train_dataset=worlds[world], eval_dataset=public)


def _python_rows(small_prompts):
    rows = load_rows(small_prompts)
    strip = [{k: v for k, v in r.items() if k != "split"} for r in rows]
    public = [r for r, s in zip(strip, rows) if s["split"] == "public"]
    worlds = {}
    for world, given in (("a", rows), ("b", _neighbour(rows, small_prompts))):
        worlds[world] = [{k: v for k, v in r.items() if k != "split"} for r in given if r["split"] == "private"]
    return worlds, public


@pytest.fixture(scope="module")
def neighbours(small_prompts, tmp_path_factory):
    """Both kinds' two neighbours: world a's runs in one process (hash seed 1), world b's in another (2)."""
    base = tmp_path_factory.mktemp("lm_neighbours")
    rows = load_rows(small_prompts)
    private, public = _python_rows(small_prompts)
    (base / "spec.json").write_text(json.dumps({
        "data": str(base / "data.jsonl"), "file_rows": {"a": rows, "b": _neighbour(rows, small_prompts)},
        "private": private, "public": public, "prompts": small_prompts}))
    return neighbours_in_own_processes(base, f"{MODULE}:prompts_file_world", f"{MODULE}:python_rows_world")


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_a_prompts_file_neighbour_writes_the_same_shareable_files(neighbours):
    """One private row of the file replaced; the same path in both runs."""
    a, b = neighbours["prompts_file_world"]
    assert_neighbours_indistinguishable(a, b)
    assert os.path.isfile(os.path.join(a, "model", "adapter_config.json"))
    assert os.path.isfile(os.path.join(a, ".hydra", "config.yaml"))


def test_python_rows_neighbours_write_the_same_shareable_files(neighbours):
    """``dppo.train(..., train_dataset=rows)`` with one private row replaced; the model/ folder (what
    from_pretrained loads) is among the compared files."""
    a, b = neighbours["python_rows_world"]
    assert_neighbours_indistinguishable(a, b)
    assert {"model/adapter_config.json", "model/adapter_model.safetensors", "model/tokenizer.json"} <= set(
        shareable_view(a))


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
    worlds, public = _python_rows(small_prompts)
    a, b = neighbouring_runs(tmp_path, lambda world, run_dir: python_rows_world_in(world, run_dir, worlds, public,
                                                                                    small_prompts))
    assert "policy.pt" in differences(a, b)
