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


def test_evaluate_cli_prints_the_mean_and_std_and_writes_nothing(saved, capsys):
    run_dir, summary, _ = saved
    before = _snapshot(run_dir)
    assert evaluate_cli.main([run_dir, "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    std = dppo.load(run_dir).evaluate(3, return_std=True)[1]
    assert f"mean return {summary['final_return']:.6g} +/- {std:.6g} (std) over 3 held-out episodes" in out
    assert _snapshot(run_dir) == before


def test_evaluate_video_without_moviepy_is_one_line_exit_2(saved, capsys, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "moviepy" else real(n, *a))
    assert evaluate_cli.main([saved[0], "--video", str(tmp_path / "v")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and 'pip install -e ".[video]"' in err[0]      # the README's install line


def _fake_moviepy(monkeypatch, written):
    """Just enough of moviepy for gymnasium's RecordVideo: an ImageSequenceClip that writes a small file."""
    import importlib.machinery
    import sys
    import types

    class ImageSequenceClip:
        def __init__(self, frames, fps=None):
            self.frames = list(frames)

        def write_videofile(self, path, logger=None):
            with open(path, "wb") as f:
                f.write(b"frames:%d" % len(self.frames))
            written.append((path, len(self.frames)))

    for name in ("moviepy", "moviepy.video", "moviepy.video.io", "moviepy.video.io.ImageSequenceClip"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules["moviepy.video.io.ImageSequenceClip"].ImageSequenceClip = ImageSequenceClip


def test_evaluate_video_records_the_held_out_episodes(saved, monkeypatch, tmp_path, capsys):
    """The --video branch end to end (a stand-in moviepy, frames without pygame): one file per episode, from the
    trainer's held-out reset seeds, and nothing written into the run."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    written = []
    _fake_moviepy(monkeypatch, written)
    monkeypatch.setattr(CartPoleEnv, "render", lambda self: np.zeros((8, 8, 3), dtype=np.uint8))
    run_dir = saved[0]
    before = _snapshot(run_dir)
    videos = tmp_path / "videos"
    assert evaluate_cli.main([run_dir, "--episodes", "2", "--video", str(videos), "--video-episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "video: 2 episode(s)" in out and len(written) == 2
    assert all(os.path.dirname(p) == str(videos) and n > 1 for p, n in written)
    assert _snapshot(run_dir) == before
    from dppo.evaluate import evaluation_seeds

    seeds = evaluation_seeds(dppo.load(run_dir), 2)
    assert all(s >= 2**31 for s in seeds)         # public evaluation seeds, never a training user's


def test_load_of_a_directory_without_a_run_is_one_line(tmp_path):
    with pytest.raises(dppo.errors.ConfigError, match="not a run directory"):
        dppo.load(str(tmp_path))
