"""One configuration path: the CLI and the API compose once and build every object once; the API validates
dicts, dataclasses and overrides exactly like the CLI, writes
the same run-directory layout (resumable from the CLI), refuses to reuse a directory holding a run, and checks
objects passed in before any user is drawn."""
from __future__ import annotations

import json
import os

import pytest
import torch

import dppo
from dppo.config import TrainConfig
from dppo.errors import ConfigError

TINY = ["rounds=2", "users_per_round=2", "eval_episodes=1", "progress=false", "env.horizon=20",
        "privacy.secure_rng=false"]


def _cli_error(cli, args):
    proc = cli([*args, "progress=false"])
    assert proc.returncode == 2
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return line


@pytest.mark.parametrize("bad", [{"rounds_": 3}, {"eps": "abc"}, {"privacy": {"accountnt": "rdp"}}],
                         ids=["unknown-key", "wrong-type", "unknown-nested-key"])
def test_a_bad_dict_is_the_same_one_line_error_as_the_cli(cli, bad):
    with pytest.raises(ConfigError) as exc:
        dppo.make_config(bad)
    key, value = next(iter(bad.items()))
    if isinstance(value, dict):
        (k2, v2), = value.items()
        args = [f"{key}.{k2}={v2}"]
    else:
        args = [f"{key}={value}"]
    assert _cli_error(cli, args) == f"dppo: error: {exc.value}"


def test_a_train_config_dataclass_is_accepted_and_validated():
    cfg = dppo.make_config(TrainConfig(algo="pg", rounds=7, users_per_round=3, eval={"greedy": True}))
    assert cfg.algo._target_.endswith("PolicyGradient") and cfg.eps is None and cfg.rounds == 7 and cfg.users_per_round == 3 and cfg.eval.greedy is True
    assert cfg.env.id == "CartPole-v1"  # defaults for the groups not named
    with pytest.raises(ConfigError, match=r"rounds must be an int \(or null\), got .many."):
        dppo.make_config(TrainConfig(rounds="many"))


def test_a_dict_with_group_choices_and_nested_values_composes_like_overrides():
    a = dppo.make_config({"algo": "dp_npg", "env": {"id": "Acrobot-v1"}, "algo": "dp_npg",
                          "oracle": "dp_gd", "eps": 3.0})
    b = dppo.make_config(["algo=dp_npg", "env.id=Acrobot-v1", "oracle=dp_gd", "eps=3.0"])
    assert a == b


def test_an_api_run_has_the_cli_layout_and_resumes_from_the_cli(tmp_path, cli):
    run = tmp_path / "run"
    class StopAfterOne(dppo.training.callbacks.Callback):
        def on_round_end(self, trainer, round_idx, metrics):
            return False

    dppo.train({"algo": "dp_pg", "rounds": 3, "users_per_round": 2, "eval_episodes": 1, "progress": False,
                "env": {"horizon": 20}, "privacy": {"secure_rng": False}}, run_dir=str(run),
               callbacks=[StopAfterOne()])
    assert json.load(open(run / "summary.json"))["rounds_done"] == 1
    assert (run / ".hydra" / "config.yaml").is_file() and (run / ".hydra" / "overrides.yaml").is_file()
    proc = cli([f"resume={run}"])
    assert proc.returncode == 0, proc.stderr
    assert json.load(open(run / "summary.json"))["rounds_done"] == 3


def test_reusing_a_run_directory_for_a_new_run_is_refused(tmp_path, cli):
    run = str(tmp_path / "run")
    dppo.train(["algo=dp_pg", *TINY], run_dir=run)
    ckpts = sorted(os.listdir(os.path.join(run, "checkpoints")))
    with pytest.raises(ConfigError, match="already holds a run"):
        dppo.train(["algo=pg", *TINY], run_dir=run)
    line = _cli_error(cli, ["algo=pg", *TINY, f"hydra.run.dir={run}"])
    assert "already holds a run" in line and f"resume={run}" in line
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ckpts
    assert "eps: 5.0" in open(os.path.join(run, ".hydra", "config.yaml")).read()  # the old (dp_pg) run's config is intact


class _PlainNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x)


def test_a_plain_module_as_policy_fails_before_any_user_is_drawn():
    from dppo.build import build

    with pytest.raises(ConfigError, match="policy protocol") as exc:
        dppo.train(["algo=dp_pg", *TINY], policy=_PlainNet())
    assert "environment" not in str(exc.value)
    from dppo.data import OnePassUserSampler

    sampler = OnePassUserSampler(2, None, seed=0)
    with pytest.raises(ConfigError):
        build(dppo.make_config(["algo=dp_pg", *TINY]), policy=_PlainNet(), sampler=sampler)
    assert len(sampler.used) == 0


def test_a_policy_for_other_spaces_is_refused_before_training():
    from dppo.policies.mlp import MLPPolicy
    import gymnasium as gym

    wrong = MLPPolicy(gym.spaces.Box(-1, 1, shape=(6,)), gym.spaces.Discrete(3))
    with pytest.raises(ConfigError, match="fails on an observation|actions in 0..1"):
        dppo.train(["algo=dp_pg", *TINY], policy=wrong)


BUILDERS = ("build_env", "build_privacy", "build_sampler", "build_policy", "build_space", "build_learner")


@pytest.fixture
def counted(monkeypatch):
    """Counts of Hydra compositions and of each builder's calls (the one configuration path: one of each)."""
    import hydra

    import dppo.build.run

    counts = {}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(hydra, "compose", counting("compose", hydra.compose))
    for name in BUILDERS:
        monkeypatch.setattr(dppo.build.run, name, counting(name, getattr(dppo.build.run, name)))  # where build() calls it
    return counts


def _never_called():
    raise AssertionError("a single run does not go through Hydra's run machinery")


def test_a_cli_run_composes_once_and_builds_every_object_once(tmp_path, counted):
    from dppo.cli import entry

    run = tmp_path / "run"
    entry(_never_called, ["algo=dp_npg", *TINY, f"hydra.run.dir={run}"])
    assert json.load(open(run / "summary.json"))["rounds_done"] == 2
    assert counted == {"compose": 1, **{name: 1 for name in BUILDERS}}
    assert (run / ".hydra" / "config.yaml").is_file() and (run / ".hydra" / "overrides.yaml").is_file()


@pytest.mark.parametrize("given", [["algo=dp_pg", *TINY],
                                   {"algo": "dp_pg", "rounds": 2, "users_per_round": 2, "eval_episodes": 1,
                                    "progress": False, "env": {"horizon": 20}, "privacy": {"secure_rng": False}},
                                   TrainConfig(algo="dp_pg", rounds=2, users_per_round=2, eval_episodes=1,
                                               progress=False, env={"horizon": 20}, privacy={"secure_rng": False})],
                         ids=["list", "dict", "TrainConfig"])
def test_an_api_run_composes_once_and_builds_every_object_once(tmp_path, counted, given):
    s = dppo.train(given, run_dir=str(tmp_path / "run"))
    assert s["rounds_done"] == 2 and s["algo"] == "dp_pg"
    assert counted == {"compose": 1, **{name: 1 for name in BUILDERS}}


def test_a_cli_resume_reads_the_saved_config_once_and_builds_once(tmp_path, counted):
    from dppo.cli import entry

    run = tmp_path / "run"
    dppo.train(["algo=dp_pg", *TINY], run_dir=str(run), callbacks=[StopAfterOne()])
    counted.clear()
    entry(_never_called, [f"resume={run}"])
    assert json.load(open(run / "summary.json"))["rounds_done"] == 2
    assert counted == {name: 1 for name in BUILDERS}  # the saved config: no composition at all


def test_a_config_refused_by_the_last_check_of_the_build_leaves_no_run_directory(tmp_path, capsys):
    """Every object is built and checked before the run directory is made (the population's capacity is
    checked last, on the built trainer)."""
    from dppo.cli import entry

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        entry(_never_called, ["algo=dp_npg", "env=bandit", "users_per_round=500", "rounds=5", "progress=false",
                              f"hydra.run.dir={run}"])
    assert exc.value.code == 2 and "more users" in capsys.readouterr().err
    assert not run.exists()


class StopAfterOne(dppo.training.callbacks.Callback):
    def on_round_end(self, trainer, round_idx, metrics):
        return False
