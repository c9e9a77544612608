"""Logging conventions: global_step = cumulative env steps (episodes without diagnostics), rollout/round,
eval/return every eval_every rounds and at the end, TensorBoard HParams with resolved values, no empty event
files, and the W&B output behind the same logger interface."""
from __future__ import annotations

import csv
import glob
import sys
import types

import dppo
from dppo.training.logger import Logger, make_logger

TINY = ["algo=dp_pg", "rounds=4", "users_per_round=3", "eval_episodes=2", "progress=false", "env.horizon=30",
        "privacy.secure_rng=false", "checkpoint_every=2"]


def _rows(run_dir):
    return list(csv.DictReader(open(f"{run_dir}/progress.csv")))


def _events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accs = []
    for f in sorted(glob.glob(f"{run_dir}/events.out.tfevents.*")):
        ea = EventAccumulator(f)
        ea.Reload()
        accs.append(ea)
    return accs


def test_scalars_are_logged_against_cumulative_env_steps_with_the_round_as_a_scalar(tmp_path):
    dppo.train(TINY + ["eval_every=2"], run_dir=str(tmp_path))
    rows = _rows(tmp_path)
    steps = [int(float(r["global_step"])) for r in rows]
    env_steps = [int(float(r["diag/env_steps"])) for r in rows]
    assert steps == [sum(env_steps[:i + 1]) for i in range(len(rows))]  # cumulative env steps
    assert [float(r["rollout/round"]) for r in rows] == [0.0, 1.0, 2.0, 3.0]
    (ea,) = _events(tmp_path)
    assert [e.step for e in ea.Scalars("rollout/round")] == steps
    # eval/return: after round 2 (eval_every) and at the end (the final evaluation = summary final_return)
    evals = [(e.step, e.value) for e in ea.Scalars("eval/return")]
    summary = __import__("json").load(open(tmp_path / "summary.json"))
    assert [s for s, _ in evals] == [steps[1], steps[3]]
    assert abs(evals[-1][1] - summary["final_return"]) < 1e-4


def test_without_diagnostics_the_axis_is_cumulative_episodes_and_diag_keys_are_dropped(tmp_path):
    dppo.train(TINY + ["logger.diagnostics=false"], run_dir=str(tmp_path))
    rows = _rows(tmp_path)
    episodes = [int(float(r["rollout/episodes"])) for r in rows]  # users x group size: public
    assert [int(float(r["global_step"])) for r in rows] == [sum(episodes[:i + 1]) for i in range(4)]
    assert not any(k.startswith("diag/") for k in rows[0])


def test_hparams_are_in_the_event_file_with_resolved_values_and_final_metrics(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    dppo.train(TINY, run_dir=str(tmp_path))
    (ea,) = _events(tmp_path)
    content = ea.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"} <= set(content)
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = {k: (v.string_value or v.number_value or v.bool_value) for k, v in start.session_start_info.hparams.items()}
    assert hp["privacy.accountant"] == "parallel"  # the accountant used, not the config's null
    assert hp["algo"] == "dp_pg" and hp["eps"] == 5.0 and hp["users_per_round"] == 3
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    metrics = {m.name.tag for m in exp.experiment.metric_infos}
    assert {"eval/return", "privacy/epsilon"} <= metrics
    assert "eval/return" in ea.Tags()["scalars"] and "privacy/epsilon" in ea.Tags()["scalars"]


def test_non_private_hparams_say_eps_null(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    dppo.train([*TINY[1:], "algo=pg"], run_dir=str(tmp_path))
    (ea,) = _events(tmp_path)
    start = plugin_data_pb2.HParamsPluginData.FromString(ea.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["eps"].string_value == "null"
    assert start.session_start_info.hparams["private"].bool_value is False


def test_a_resume_that_has_nothing_to_do_writes_no_event_file(tmp_path):
    dppo.train(TINY, run_dir=str(tmp_path))
    before = sorted(glob.glob(f"{tmp_path}/events.out.tfevents.*"))
    rows_before = _rows(tmp_path)
    dppo.train(TINY, run_dir=str(tmp_path), resume=True)
    assert sorted(glob.glob(f"{tmp_path}/events.out.tfevents.*")) == before
    assert _rows(tmp_path) == rows_before


class StopAfter(dppo.training.callbacks.Callback):
    def __init__(self, rounds):
        self.rounds = rounds

    def on_round_end(self, trainer, round_idx, metrics):
        return round_idx + 1 < self.rounds


def test_a_resumed_run_continues_the_step_axis(tmp_path):
    dppo.train(TINY, run_dir=str(tmp_path), callbacks=[StopAfter(2)])
    assert len(_rows(tmp_path)) == 2
    dppo.train(TINY, run_dir=str(tmp_path), resume=True)
    steps = [int(float(r["global_step"])) for r in _rows(tmp_path)]
    assert len(steps) == 4 and steps == sorted(steps) and len(set(steps)) == 4


def test_no_writer_is_created_before_the_first_dump(tmp_path):
    log = make_logger(str(tmp_path))
    log.log_hparams({"a": 1})
    log.close()
    assert not glob.glob(f"{tmp_path}/events.out.tfevents.*")


class _FakeRun:
    def __init__(self, **kw):
        self.init_kwargs, self.logged, self.defined = kw, [], []
        self.config = types.SimpleNamespace(data={}, update=lambda d, allow_val_change=False: self.config.data.update(d))
        self.summary = {}
        self.finished = False

    def define_metric(self, name, step_metric=None):
        self.defined.append((name, step_metric))

    def log(self, d):
        self.logged.append(dict(d))

    def finish(self):
        self.finished = True


def test_wandb_output_logs_against_global_step_and_records_hparams(tmp_path, monkeypatch):
    runs = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(_FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    dppo.train(TINY + ["logger=wandb", "logger.wandb_mode=offline"], run_dir=str(tmp_path))
    (run,) = runs
    assert run.init_kwargs["mode"] == "offline" and run.init_kwargs["dir"] == str(tmp_path)
    assert ("*", "global_step") in run.defined
    csv_steps = [int(float(r["global_step"])) for r in _rows(tmp_path)]
    assert [d["global_step"] for d in run.logged][:4] == csv_steps
    assert run.config.data["privacy.accountant"] == "parallel"
    assert run.summary["eval/return"] is not None and run.finished


def test_logger_wandb_without_the_package_is_a_one_line_error(monkeypatch):
    import importlib.util

    import pytest

    from dppo.errors import ConfigError

    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(ConfigError, match="pip install wandb"):
        make_logger(None, wandb=True)


def test_the_diagnostics_switch_drops_diag_keys_in_the_logger():
    log = Logger([], diagnostics=False)
    log.record("diag/return", 1.0)
    log.record("eval/return", 2.0)
    assert log.values == {"eval/return": 2.0}


def test_without_diagnostics_the_events_file_carries_no_clock_host_or_process(tmp_path):
    """diagnostics off: the events file is named by the session's first round and index, and every record's
    wall time is a round index (docs/deployment.md, Timing); a resumed session gets the next index."""
    import os
    import socket

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    quiet = [*TINY, "logger.diagnostics=false"]
    dppo.train(quiet, run_dir=str(tmp_path), callbacks=[StopAfter(2)])
    dppo.train(quiet, run_dir=str(tmp_path), resume=True)
    files = sorted(os.path.basename(f) for f in glob.glob(f"{tmp_path}/events.out.tfevents.*"))
    assert files == ["events.out.tfevents.0000000000.dppo.0.0", "events.out.tfevents.0000000000.dppo.1.0"]
    assert not any(socket.gethostname() in f or str(os.getpid()) in f.split(".") for f in files)
    for f in files:
        walls = [e.wall_time for e in EventFileLoader(f"{tmp_path}/{f}").Load()]
        assert walls and all(w == int(w) and 0 <= w < 4 for w in walls)   # round indices, never a clock
