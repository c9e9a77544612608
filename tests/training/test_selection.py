"""``eval.select=best``: a run ends with the best of its releases, scored on public selection episodes that are not
the ones it reports on; the users, the releases, the ``eval/return`` curve and the checkpoints are those of the
same run with ``eval.select=last``; the choice survives a crash and resume; learners that cannot put a release
back refuse it in one line."""
from __future__ import annotations

import json

import pytest
import torch

import dppo
from dppo.data.streams import public_reset_seeds
from dppo.errors import ConfigError
from dppo.training.callbacks import Callback

QUIET = ["progress=false", "privacy.secure_rng=false", "logger.tensorboard=false"]
RUN = ["algo=dp_pg", "rounds=8", "users_per_round=4", "group_size=2", "env.horizon=40", "eval_episodes=4",
       "eval_every=1", "max_grad_norm=1.0"]


class Snapshots(Callback):
    """Each round's released policy (a private run's callbacks may read released quantities)."""

    def __init__(self):
        self.states = {}

    def on_round_end(self, trainer, round_idx, metrics):
        self.states[round_idx + 1] = {k: v.clone() for k, v in trainer.learner.policy.state_dict().items()}
        return True


def test_best_ends_with_the_release_that_scores_highest_on_the_selection_episodes(tmp_path):
    snaps = Snapshots()
    best = dppo.train([*RUN, *QUIET, "eval.select=best"], run_dir=str(tmp_path / "best"), callbacks=[snaps])
    chosen = best["final_policy"]
    assert chosen["rule"] == "best" and chosen["candidates"] == 8 and chosen["last_round"] == 8
    # the exported policy is the snapshot after the chosen round, bit for bit
    saved = torch.load(tmp_path / "best" / "policy.pt", weights_only=True)
    for k, v in snaps.states[chosen["round"]].items():
        assert torch.equal(saved["policy"][k], v), k
    assert saved["summary"]["final_policy"] == chosen
    # an independent scoring of every snapshot on the selection stream: the chosen one is the (latest) argmax,
    # and the reported final return is the chosen policy on the *eval* episodes
    run = dppo.load(str(tmp_path / "best"))
    policy, collector = run.learner.policy, run.learner.collector
    scores = {}
    for r, state in snaps.states.items():
        policy.load_state_dict(state)
        scores[r] = collector.evaluate(policy, 4, False, stream="select")
    top = max(scores.values())
    assert chosen["round"] == max(r for r, v in scores.items() if v == top)
    assert chosen["select_return"] == pytest.approx(top, abs=1e-9)
    policy.load_state_dict(snaps.states[chosen["round"]])
    assert best["final_return"] == pytest.approx(collector.evaluate(policy, 4, False), abs=1e-9)


def test_selection_episodes_are_public_and_disjoint_from_the_reported_ones():
    sel, ev = public_reset_seeds(0, "select", 0, 50), public_reset_seeds(0, "eval", 0, 50)
    assert not set(sel) & set(ev) and min(sel) >= 2**31


def test_best_changes_nothing_but_what_the_run_ends_with(tmp_path):
    last = dppo.train([*RUN, *QUIET], run_dir=str(tmp_path / "last"))
    best = dppo.train([*RUN, *QUIET, "eval.select=best"], run_dir=str(tmp_path / "best"))
    assert last["final_policy"] == {"rule": "last"} and best["ledger"] == last["ledger"]
    for name in ("last", "best"):   # the checkpoints hold the last iterate either way (an extension continues it)
        ckpt = sorted((tmp_path / name / "checkpoints").glob("*.pt"))[-1]
        state = torch.load(ckpt, weights_only=False)
        if name == "last":
            ref = state["learner"]["policy"]
        else:
            assert str(state["learner"]["policy"]) == str(ref)
    import csv

    def curve(d):
        with open(tmp_path / d / "progress.csv", newline="") as f:
            return [r["eval/return"] for r in csv.DictReader(f)][:-1]   # the final row is the final policy's
    assert curve("last") == curve("best")
    if best["final_policy"]["round"] == best["final_policy"]["last_round"]:
        assert best["policy_sha256"] == last["policy_sha256"]
    else:
        assert best["policy_sha256"] != last["policy_sha256"]


def test_a_crash_and_an_extension_choose_as_the_run_without_them(tmp_path):
    from tests.cli_helpers import run_cli

    whole = dppo.train([*RUN, *QUIET, "eval.select=best"], run_dir=str(tmp_path / "whole"))
    # killed after round 5's log rows, before its checkpoint (checkpoints every 2 rounds): resumed from round 4
    args = [*RUN, *QUIET, "eval.select=best", "checkpoint_every=2", f"hydra.run.dir={tmp_path / 'cut'}"]
    import os
    os.environ["DPPO_FAULT_KILL_AT"] = "after_dump:5"
    try:
        killed = run_cli(args)
    finally:
        del os.environ["DPPO_FAULT_KILL_AT"]
    assert killed.returncode != 0
    resumed = run_cli([f"resume={tmp_path / 'cut'}", "progress=false"])
    assert resumed.returncode == 0, resumed.stderr
    cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    # an extension: a run of 5 rounds taken to 8 scores the same releases (the 5-round run's final one included)
    half = [a for a in RUN if not a.startswith("rounds=")]
    dppo.train([*half, "rounds=5", *QUIET, "eval.select=best"], run_dir=str(tmp_path / "ext"))
    ext = dppo.train([*half, "rounds=8", *QUIET, "eval.select=best"], run_dir=str(tmp_path / "ext"), resume=True)
    for other in (cut, ext):
        assert other["final_policy"] == whole["final_policy"]
        assert other["policy_sha256"] == whole["policy_sha256"]


@pytest.mark.parametrize("args, match", [
    (["algo=ubev", "env=riverswim", "episodes=50"], "eval.select=best is for the learners whose policy is a network"),
    ([*RUN, "eval_episodes=0"], "needs eval_episodes >= 1"),
    ([*RUN, "eval.select=first"], "eval.select must be last"),
])
def test_refusals_are_one_line(args, match):
    with pytest.raises(ConfigError, match=match):
        dppo.train([*args, *QUIET, *([] if "eval.select=first" in args else ["eval.select=best"])])
