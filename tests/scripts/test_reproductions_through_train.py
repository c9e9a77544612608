"""The tabular and GFA reproductions run each configuration through ``dppo.train`` (a run directory with its
config, journal, checkpoints and summary), and what they read back from the run is what the same learner,
driven round by round in this process as the scripts used to do, computes: the same regret of every episode,
the same release schedule, the same counters."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_is_a_run(path) -> None:
    for f in (".hydra/config.yaml", "users.journal", "summary.json", "progress.csv"):
        assert os.path.isfile(os.path.join(path, f)), f
    assert os.listdir(os.path.join(path, "checkpoints"))


def test_a_tabular_run_through_train_gives_the_reference_grids_regret(tmp_path):
    """Seed 0, T = 1000 on RiverSwim (H = 20): UBEV's cumulative regret of runs/reference/tabular.md, the value
    tests/algos/test_ucb.py pins for the learner driven by hand."""
    mod = script("reproduce_tabular")
    res = mod.run_one("riverswim", "ubev", None, 0, 1000, "reference", str(tmp_path / "run"))
    assert res["cumulative_regret"] == pytest.approx(3352.501763466624, rel=1e-12)
    assert res["users"] == 1000 and res["E"] == 0.0
    assert_is_a_run(tmp_path / "run")


def test_a_dp_ubev_run_through_train_matches_the_learner_driven_by_hand(tmp_path):
    from dppo.algos.dp_ubev import DPUBEV
    from dppo.data.sampler import OnePassUserSampler
    from dppo.envs.tabular import riverswim
    from dppo.privacy import NoiseSource, PrivacyContext
    from dppo.privacy.accountants import make_accountant

    mod = script("reproduce_dp_tabular")
    res = mod.run_one("riverswim", 5, "dp_ubev", 1.0, 0, 3000, {}, str(tmp_path / "run"))
    assert_is_a_run(tmp_path / "run")
    privacy = PrivacyContext(1.0, 1e-5, accountant=make_accountant(DPUBEV.accountant_name(None, {})),
                             noise=NoiseSource(0, secure=False))
    learner = DPUBEV(riverswim(horizon=5), privacy=privacy, sampler=OnePassUserSampler(1000, seed=0), seed=0,
                     episodes=3000, episodes_per_round=1000)
    E = [learner.train_round(r)["counters/error_bound"] for r in range(learner.num_rounds)]
    cum = torch.cumsum(learner.episode_regret, 0)
    assert res["rounds"] == [1000, 2000, 3000]
    assert res["curve"] == [float(cum[t - 1]) for t in res["rounds"]]
    assert res["E"] == E and res["releases"] == learner.stats.steps_done
    assert res["epsilon_spent"] == privacy.spent()[0]


def test_a_gfa_run_through_train_matches_the_learner_driven_by_hand(tmp_path):
    from dppo.algos.gfa import GFAOutcomeLearner
    from dppo.data.sampler import OnePassUserSampler
    from dppo.envs.context_bits import ContextBitsMDP
    from dppo.privacy import NoiseSource, PrivacyContext
    from dppo.privacy.accountants import make_accountant

    mod = script("reproduce_gfa")
    args = mod.build_parser().parse_args(["--episodes", "120", "--runs", str(tmp_path / "runs")])
    regret, facts, spent = mod.run_one("hard", 5.0, None, "advanced", 3, args, budget_decay=1.0)
    privacy = PrivacyContext(5.0, args.delta, accountant=make_accountant("advanced"), noise=NoiseSource(3))
    learner = GFAOutcomeLearner(ContextBitsMDP("hard"), privacy, OnePassUserSampler(1), seed=3, episodes=120,
                                batch_size=None, batch_const=args.batch_const, eta=args.eta,
                                class_size=args.class_size, class_scales=tuple(args.scales), budget_decay=1.0,
                                sensitivity="class")
    for r in range(learner.num_rounds):
        learner.train_round(r)
    assert torch.equal(regret, torch.tensor(learner.regret, dtype=torch.float64))
    assert facts["eps_schedule"] == learner.eps_schedule and len(set(learner.eps_schedule)) > 1   # front-loaded
    assert (facts["B"], facts["sensitivity"], facts["beta"]) == (learner.B, learner.sensitivity, learner.beta)
    assert spent == privacy.spent()[0]
    assert_is_a_run(mod.run_dir(args, "hard", 5.0, None, "advanced", 3, budget_decay=1.0))
