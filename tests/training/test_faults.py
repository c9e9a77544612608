"""Runs survive faults: damaged checkpoints, concurrent runs, unwritable directories, disk errors."""
import os
import pickle

import pytest
import torch

import dppo
from dppo.build import build
from dppo.errors import ConfigError, DPPOError
from dppo.training.checkpoint import list_checkpoints, load_latest_checkpoint
from dppo.training.runlock import RunLock


def _trainer(tiny, run_dir, *extra):
    return build(dppo.make_config(["algo=dp_pg", *tiny, "checkpoint_every=1", *extra]), str(run_dir))


def test_truncated_checkpoint_is_detected_and_previous_one_used(tiny, tmp_path):
    dppo.train(["algo=dp_pg", *tiny, "checkpoint_every=1"], run_dir=str(tmp_path))
    ckpts = list_checkpoints(str(tmp_path / "checkpoints"))
    newest = ckpts[-1]
    data = open(newest, "rb").read()
    open(newest, "wb").write(data[: len(data) // 2])  # a write cut in half
    open(str(tmp_path / "checkpoints" / "ckpt_000009.pt.tmp.123"), "wb").write(b"partial")
    state, path = load_latest_checkpoint(str(tmp_path / "checkpoints"))
    assert path == ckpts[-2] and state["round"] == 2


def test_loading_a_checkpoint_never_executes_code(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    os.makedirs(tmp_path / "checkpoints")
    with open(tmp_path / "checkpoints" / "ckpt_000001.pt", "wb") as f:
        pickle.dump({"format": "dppo-ckpt-1", "x": Evil()}, f)
    state, _ = load_latest_checkpoint(str(tmp_path / "checkpoints"))
    assert state is None and not marker.exists()


def test_second_process_on_same_run_dir_is_refused(tmp_path):
    first = RunLock(str(tmp_path))
    first.acquire()
    try:
        with pytest.raises(ConfigError, match="another process"):
            RunLock(str(tmp_path)).acquire()
    finally:
        first.release()
    RunLock(str(tmp_path)).acquire()  # free again once the first one is done


def test_unwritable_run_dir_fails_at_start(tiny, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="not writable"):
        _trainer(tiny, blocker / "run")


def test_disk_error_at_checkpoint_is_a_clear_error(tiny, tmp_path, monkeypatch):
    trainer = _trainer(tiny, tmp_path)

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("dppo.training.trainer.save_checkpoint", full_disk)
    with pytest.raises(DPPOError, match="cannot write a checkpoint.*No space left"):
        trainer.fit()


def test_resume_never_reuses_a_user(tiny, tmp_path):
    from dppo.training.callbacks import Callback

    class StopAfterRound1(Callback):
        def on_round_end(self, trainer, round_idx, metrics):
            return round_idx < 1

    args = ["algo=dp_pg", *tiny, "rounds=4", "checkpoint_every=1"]
    dppo.train(args, run_dir=str(tmp_path), callbacks=[StopAfterRound1()])
    state, _ = load_latest_checkpoint(str(tmp_path / "checkpoints"))
    used_before = set(state["sampler"]["used"])
    assert len(used_before) == 6
    cfg = dppo.make_config(args)
    trainer = build(cfg, str(tmp_path))
    assert trainer.try_resume()
    trainer.fit()
    assert used_before < trainer.sampler.used and len(trainer.sampler.used) == 12
    assert [e["round"] for e in trainer.privacy.ledger.entries] == [0, 1, 2, 3]
