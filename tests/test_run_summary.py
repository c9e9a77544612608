"""What ``dppo.train`` returns prints in a few lines, whatever the number of rounds, and is still the plain dict
``summary.json`` holds."""
from __future__ import annotations

import json

import dppo

QUIET = ["progress=false", "privacy.secure_rng=false", "logger.tensorboard=false", "env.horizon=20",
         "users_per_round=2", "group_size=2"]


def test_the_summary_prints_in_five_lines_and_is_the_json_dict(tmp_path):
    short = dppo.train(["algo=dp_pg", "rounds=2", *QUIET], run_dir=str(tmp_path / "a"))
    long = dppo.train(["algo=dp_pg", "rounds=20", *QUIET])
    for s, rounds in ((short, 2), (long, 20)):
        text = repr(s)
        assert len(text.splitlines()) == 5 and len(text) < 300
        assert text.splitlines()[0] == "RunSummary(dp_pg on CartPole-v1)"
        assert f"rounds: {rounds} (complete)" in text and f"ledger: {rounds} releases" in text
        assert str(s) == text and isinstance(s, dict) and len(s["ledger"]) == rounds
    assert json.loads(json.dumps(short)) == json.load(open(tmp_path / "a" / "summary.json"))
    non_private = dppo.train(["algo=pg", "rounds=2", *QUIET])
    assert "privacy: none (non-private: eps null)" in repr(non_private)
