"""Issue 47: the refusal of a resume whose crashed attempt's charges overshoot says what happened to that
attempt's users: one-pass runs burn them; multi-pass runs burn none (users are reused by design, the lost
releases are charged instead)."""
import json
import os

import pytest

import dppo
from dppo.errors import PrivacyError
from dppo.training.callbacks import Callback
from dppo.training.journal import JOURNAL_NAME

BASE = ["algo=dp_pg", "users_per_round=3", "eval_episodes=1", "progress=false", "env.horizon=20", "seed=3",
        "rounds=3", "checkpoint_every=1", "privacy.secure_rng=true"]


class StopAfter(Callback):
    def __init__(self, last_round):
        self.last_round = last_round

    def on_round_end(self, trainer, round_idx, metrics):
        return round_idx < self.last_round


def _refusal(run_dir, args, users) -> str:
    """Stop ``args`` after round 0, append a crashed attempt of round 1 (its take and release), resume."""
    part = dppo.train(args, run_dir=run_dir, callbacks=[StopAfter(0)])
    with open(os.path.join(run_dir, JOURNAL_NAME), "a") as f:
        f.write(json.dumps({"event": "start", "incarnation": 1, "round": 1}) + "\n")
        f.write(json.dumps({"event": "take", "round": 1, "incarnation": 1, "users": users}) + "\n")
        f.write(json.dumps({"event": "release", "round": 1, "incarnation": 1,
                            "entry": dict(part["ledger"][-1], round=1)}) + "\n")
    with pytest.raises(PrivacyError) as err:
        dppo.train(args, run_dir=run_dir, resume=True)
    msg = str(err.value)
    assert msg.startswith("resume refused: the crashed attempt's") and "\n" not in msg
    return msg


def test_a_multi_pass_refusal_says_no_user_is_burned(tmp_path):
    msg = _refusal(str(tmp_path), [*BASE, "privacy.multi_pass=true", "privacy.population_size=30"], [1, 5])
    assert "burned" not in msg.replace("burns no users", "")
    assert "must be charged (multi-pass burns no users: they stay in the population and are drawn again, so the " \
           "lost releases count)" in msg


def test_a_one_pass_refusal_says_the_users_are_burned(tmp_path):
    msg = _refusal(str(tmp_path), [*BASE, "privacy.accountant=basic"], [3, 4, 5])
    assert "must be charged (their users are burned)" in msg and "multi-pass" not in msg
