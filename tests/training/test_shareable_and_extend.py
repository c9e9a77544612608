"""Shareable files are self-sufficient (``dppo.load`` / ``python -m dppo.evaluate`` from summary.json,
policy.pt and .hydra/ alone, or from policy.pt alone; SB3's ``a, _ = model.predict(obs)``), and a finished
one-pass run can be extended with more rounds of new users where that leaves every user's guarantee as it
was, and is refused, with the reason, where it would not."""
import json
import os
import shutil

import numpy as np
import pytest

import dppo
from dppo import evaluate as evaluate_cli
from dppo.cli import entry
from dppo.errors import ConfigError
from dppo.training.journal import JOURNAL_NAME, UserJournal

TINY = ["rounds=2", "users_per_round=3", "group_size=2", "eval_episodes=3", "progress=false", "env.horizon=30",
        "checkpoint_every=1"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("run"))
    summary = dppo.train(["algo=dp_pg", "logger.diagnostics=false", *TINY], run_dir=run)
    return run, summary


def _never():
    raise AssertionError("a resume never starts Hydra's run")


def _shareable_copy(run, dest, with_hydra=True):
    os.makedirs(dest)
    for name in ("summary.json", "policy.pt"):
        shutil.copy(os.path.join(run, name), dest)
    if with_hydra:
        shutil.copytree(os.path.join(run, ".hydra"), os.path.join(dest, ".hydra"))
    return dest


@pytest.mark.parametrize("files", ["summary_policy_hydra", "policy_only"])
def test_the_shareable_files_alone_load_act_and_evaluate(finished, tmp_path, files, capsys):
    run, summary = finished
    full = dppo.load(run)
    if files == "policy_only":
        target = os.path.join(_shareable_copy(run, str(tmp_path / "shared"), with_hydra=False), "policy.pt")
        os.remove(tmp_path / "shared" / "summary.json")
    else:
        target = _shareable_copy(run, str(tmp_path / "shared"))
    shared = dppo.load(target)
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    assert np.array_equal(shared.policy.predict(obs, deterministic=True), full.policy.predict(obs, deterministic=True))
    assert shared.evaluate() == pytest.approx(summary["final_return"])   # the trainer's held-out episodes
    assert shared.rounds_done == 2 and shared.provenance["consumed"][0]["users"] == [[0, 6]]
    assert evaluate_cli.main([target, "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert f"mean return {summary['final_return']:.6g} +/- " in out and " (std) over 3 held-out episodes" in out


def test_a_lone_policy_pt_carries_the_public_part_of_the_summary(finished, tmp_path):
    """``dppo.load`` on a policy.pt with nothing beside it says what the run spent and its public evaluation:
    the same values as summary.json, and no key that summary.json does not hold (no count, no ledger)."""
    from dppo.training.trainer import POLICY_SUMMARY_KEYS

    run, summary = finished
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(os.path.join(run, "policy.pt"), lone)
    carried = dppo.load(str(lone / "policy.pt")).summary
    assert carried["epsilon_spent"] == summary["epsilon_spent"] == pytest.approx(5.0)
    assert {k: summary[k] for k in POLICY_SUMMARY_KEYS if k in summary} == carried
    assert {"epsilon_spent", "delta_spent", "accountant", "adjacency", "noise_source", "rounds_done",
            "final_return"} <= set(carried)
    assert not {"ledger", "users_seen", "users_burned", "diag", "env_steps", "wall_time_s"} & set(carried)


def test_a_resume_with_nothing_to_do_says_so_in_one_line_and_changes_nothing(tmp_path, capsys):
    run = str(tmp_path / "run")
    dppo.train(["algo=dp_pg", "privacy.secure_rng=false", *TINY], run_dir=run)
    before = {name: open(os.path.join(run, name), "rb").read() for name in ("summary.json", "policy.pt", JOURNAL_NAME)}
    capsys.readouterr()
    entry(_never, [f"resume={run}"])                  # `python train.py resume=<finished run>`: exit 0
    out = capsys.readouterr()
    lines = [ln for ln in (out.out + out.err).splitlines() if ln.strip() and "seeded" not in ln.lower()]
    assert lines == [f"dppo: nothing to do: {run} has done all 2 of its rounds; to extend it with new users, "
                     f"raise rounds: python train.py resume={run} rounds=4"]
    assert before == {name: open(os.path.join(run, name), "rb").read() for name in before}


def test_an_extended_run_resumes_as_what_it_now_is(tmp_path, capsys):
    """After ``rounds=4`` extends a 2-round run, ``resume=`` alone has nothing to do (it is not refused as
    shortening the run): the extension is written into ``.hydra/config.yaml`` and ``overrides.yaml``."""
    run = str(tmp_path / "run")
    dppo.train(["algo=dp_pg", "privacy.secure_rng=false", *TINY], run_dir=run)
    entry(_never, [f"resume={run}", "rounds=4"])
    capsys.readouterr()
    entry(_never, [f"resume={run}"])
    assert "has done all 4 of its rounds" in capsys.readouterr().err
    assert "rounds=4" in open(os.path.join(run, ".hydra", "overrides.yaml")).read()
    assert dppo.load(run).config.rounds == 4


def test_a_finished_run_that_cannot_grow_says_why_and_to_start_a_new_run(tmp_path, capsys):
    run = str(tmp_path / "run")
    dppo.train(["algo=pucb", "env=riverswim", "episodes=20", "algo.episodes_per_round=10", *BASE], run_dir=run)
    capsys.readouterr()
    entry(_never, [f"resume={run}"])
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dppo: nothing to do: {run} has done all 20 of its episodes; it cannot be extended (")
    assert err.endswith("start a new run") and len(err.splitlines()) == 1


def test_sb3_style_predict_returns_actions_and_a_state(finished):
    run = dppo.load(finished[0])
    obs = np.zeros(4, dtype=np.float32)
    action, state = run.predict(obs, deterministic=True)
    assert state is None and int(action) == int(run.policy.predict(obs, deterministic=True))
    actions, _ = run.predict(np.zeros((5, 4), dtype=np.float32), state=None, episode_start=np.ones(5, bool))
    assert actions.shape == (5,)


def test_a_bare_state_dict_without_config_is_refused_in_one_line(finished, tmp_path):
    import torch

    bare = str(tmp_path / "bare.pt")
    torch.save(torch.load(os.path.join(finished[0], "policy.pt"), weights_only=True)["policy"], bare)
    with pytest.raises(ConfigError, match="bare state_dict without its config"):
        dppo.load(bare)


def test_a_finished_one_pass_run_continues_with_more_rounds_of_new_users(tmp_path):
    run = str(tmp_path / "run")
    first = dppo.train(["algo=dp_pg", "privacy.secure_rng=false", *TINY], run_dir=run)
    entry(_never, [f"resume={run}", "rounds=5"])      # `python train.py resume=<run> rounds=5`, in-process
    done = json.load(open(os.path.join(run, "summary.json")))
    assert first["rounds_done"] == 2 and done["rounds_done"] == 5 and done["complete"]
    assert [e["round"] for e in done["ledger"]] == list(range(5))
    assert done["ledger"][:2] == first["ledger"]                        # the ledger continues
    assert done["epsilon_spent"] == pytest.approx(first["epsilon_spent"]) == pytest.approx(5.0)
    takes = [u for e in UserJournal.read(os.path.join(run, JOURNAL_NAME)) if e["event"] == "take" for u in e["users"]]
    assert takes == list(range(15))                                      # the new rounds take new users


GROUP = ["algo=dp_pg", *TINY]
BASE = ["progress=false", "eval_episodes=1", "checkpoint_every=1"]


@pytest.mark.parametrize("args,extra,needle", [
    ([*GROUP, "privacy.multi_pass=true", "privacy.population_size=30", "eps=8"], ["rounds=4"],
     "multi-pass training composes every round's release"),
    ([*GROUP, "privacy.accountant=basic"], ["rounds=4"], "the basic accountant composes"),
    (["algo=gfa", "env=riverswim", "episodes=20", "batch_size=10", "algo.grid_points=4", *BASE], ["episodes=40"],
     "splits its budget over the batches"),
    (["algo=pucb", "env=riverswim", "episodes=20", "algo.episodes_per_round=10", *BASE], ["episodes=40"],
     "sizes its counters and confidence bounds"),
    (["algo=pucb", "env=riverswim", "episodes=20", "algo.episodes_per_round=10", *BASE], ["rounds=200"],
     "runs for a number of episodes"),
    (GROUP, ["rounds=1"], "can only be extended"),
])
def test_extending_is_refused_with_the_reason_where_more_would_change_the_guarantee(tmp_path, capsys, args, extra,
                                                                                    needle):
    run = str(tmp_path / "run")
    dppo.train(args, run_dir=run)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:           # the CLI's own entry, in-process: `python train.py resume=...`
        entry(_never, [f"resume={run}", *extra])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err
