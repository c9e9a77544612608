"""dppo.load / policy.predict / python -m dppo.evaluate: a saved run acts, evaluates and leaves its logs alone."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import dppo
from dppo import evaluate as evaluate_cli

TINY = ["rounds=3", "users_per_round=2", "eval_episodes=3", "progress=false", "env.horizon=30",
        "privacy.secure_rng=false", "checkpoint_every=1"]


def _snapshot(run_dir):
    out = {}
    for root, _, files in os.walk(run_dir):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, run_dir)] = (os.path.getsize(p), os.path.getmtime(p))
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("run"))
    captured = {}

    class Keep(dppo.training.callbacks.Callback):
        def on_train_end(self, trainer):
            captured["policy"] = trainer.learner.policy

    summary = dppo.train(["algo=dp_pg", *TINY], run_dir=run_dir, callbacks=[Keep()])
    return run_dir, summary, captured["policy"]


def test_predict_round_trip_from_a_saved_run(saved):
    run_dir, summary, trained = saved
    before = _snapshot(run_dir)
    run = dppo.load(run_dir)
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    # the loaded policy is the trained one: same parameters, same greedy actions as the original module
    for (k, v), (k2, v2) in zip(run.policy.state_dict().items(), trained.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    expected = trained.logits(torch.as_tensor(obs)).argmax(-1).numpy()
    assert np.array_equal(run.policy.predict(obs, deterministic=True), expected)
    single = run.policy.predict(obs[0], deterministic=True)
    assert np.ndim(single) == 0 and int(single) == expected[0]
    assert run.summary["algo"] == "dp_pg" and run.summary["rounds_done"] == 3 == run.rounds_done
    # evaluation on the trainer's held-out seeds reproduces final_return; nothing is written into the run
    assert run.evaluate() == pytest.approx(summary["final_return"])
    assert _snapshot(run_dir) == before


def test_load_leaves_the_callers_rng_alone(saved):
    torch.manual_seed(123)
    np.random.seed(7)
    expected_t, expected_n = torch.rand(1), np.random.rand()
    torch.manual_seed(123)
    np.random.seed(7)
    dppo.load(saved[0])
    assert torch.equal(torch.rand(1), expected_t) and np.random.rand() == expected_n


def test_evaluate_cli_prints_the_mean_and_writes_nothing(saved, capsys):
    run_dir, summary, _ = saved
    before = _snapshot(run_dir)
    assert evaluate_cli.main([run_dir, "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert f"mean return {summary['final_return']:.6g} over 3 held-out episodes" in out
    assert _snapshot(run_dir) == before


def test_evaluate_video_without_moviepy_is_one_line_exit_2(saved, capsys, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "moviepy" else real(n, *a))
    assert evaluate_cli.main([saved[0], "--video", str(tmp_path / "v")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "pip install moviepy" in err[0]


def test_load_of_a_directory_without_a_run_is_one_line(tmp_path):
    with pytest.raises(dppo.errors.ConfigError, match="not a run directory"):
        dppo.load(str(tmp_path))
