"""Issue 47: inputs that used to run (or were refused with a misleading line) are refused before round 0 in one
line, exit code 2, through ``dppo.errors.ConfigError``, as the project's other config errors are."""
import pytest

from tests.cli_helpers import one_error_line as _line


@pytest.mark.parametrize("args", [
    ["algo=pg", "eps=null", "privacy.noise_correlation=banded", "privacy.bands=-3"],   # non-private: no noise at all
    ["algo=pg", "eps=null", "privacy.bands=0"],
    ["algo=dp_pg", "privacy.bands=0"],                                                  # noise_correlation=none
    ["algo=dp_pg", "privacy.noise_correlation=banded", "privacy.bands=-1"],
    ["algo=dp_ppo", "privacy.noise_correlation=banded_sqrt", "privacy.bands=0"],
], ids=" ".join)
def test_a_non_positive_privacy_bands_is_refused_whatever_eps_and_algo(capsys, args):
    bands = args[-1].split("=")[1]
    assert _line(capsys, args) == f"dppo: error: privacy.bands must be >= 1, got {bands}"


@pytest.mark.slow   # the same refusal in-process above; here through a train.py subprocess
def test_the_issues_non_private_banded_command_exits_2_without_a_run_directory(cli, tmp_path):
    r = cli(["algo=pg", "eps=null", "privacy.noise_correlation=banded", "privacy.bands=-3", "progress=false",
             f"hydra.run.dir={tmp_path / 'run'}"], timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and lines == ["dppo: error: privacy.bands must be >= 1, got -3"], r.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key", ["eval_size", "show_completions", "show_every"])
def test_a_negative_prompts_env_count_is_refused_before_round_0(capsys, key):
    """A negative env.eval_size used to run (a negative slice of the public rows evaluates all but the last one)."""
    assert _line(capsys, ["+experiment=lm_addition", f"env.{key}=-1"]) == f"dppo: error: env.{key} must be >= 0, got -1"


@pytest.mark.slow   # the same refusal in-process above; here through a train.py subprocess
def test_the_issues_negative_eval_size_command_exits_2_without_a_run_directory(cli, tmp_path):
    r = cli(["+experiment=lm_addition", "env.eval_size=-1", f"hydra.run.dir={tmp_path / 'run'}"], timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and lines == ["dppo: error: env.eval_size must be >= 0, got -1"], r.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def dp_pg_run(tmp_path_factory):
    import dppo

    run = tmp_path_factory.mktemp("resume") / "run"
    dppo.train(["algo=dp_pg", "rounds=2", "users_per_round=2", "group_size=2", "eval_episodes=1", "progress=false",
                "env.horizon=20", "checkpoint_every=1", "privacy.secure_rng=false"], run_dir=str(run))
    return run


def test_a_resume_that_names_another_algorithm_says_the_run_keeps_its_algorithm(capsys, dp_pg_run):
    """Was: "the 'algo' group has no _target_" (the choice read as a value of the stored config's algo node)."""
    line = _line(capsys, [f"resume={dp_pg_run}", "algo=dp_ppo"])
    assert line == (f"dppo: error: resume={dp_pg_run} continues a dp_pg run, and a resumed run keeps its algorithm "
                    f"(algo=dp_pg): drop algo=dp_ppo to continue it, or start a new run with algo=dp_ppo by leaving "
                    f"out resume=")


@pytest.mark.parametrize("choice", ["env=pendulum", "policy=mlp", "+experiment=cartpole_ppo"])
def test_a_resume_that_names_another_group_option_says_the_run_keeps_it(capsys, dp_pg_run, choice):
    group = choice.lstrip("+").split("=")[0]
    line = _line(capsys, [f"resume={dp_pg_run}", choice])
    assert f"a resumed run keeps its {group}" in line and f"drop {choice} to continue it" in line
    assert "has no _target_" not in line


def test_a_resume_that_names_its_own_algorithm_continues(capsys, dp_pg_run):
    from dppo.cli import entry

    def never_called():
        raise AssertionError("a finished run has nothing to do")

    entry(never_called, [f"resume={dp_pg_run}", "algo=dp_pg", "progress=false"])   # finished: nothing to do
    assert "has done all 2 of its rounds" in capsys.readouterr().err
