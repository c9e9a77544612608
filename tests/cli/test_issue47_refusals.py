"""Issue 47: inputs that used to run (or were refused with a misleading line) are refused before round 0 in one
line, exit code 2, through ``dppo.errors.ConfigError``, as the project's other config errors are."""
import pytest

from dppo.cli import entry


def _never_called():
    raise AssertionError("Hydra's run must not start for a bad config")


def _line(capsys, args):
    with pytest.raises(SystemExit) as exc:
        entry(_never_called, [*args, "progress=false"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


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


def test_the_issues_negative_eval_size_command_exits_2_without_a_run_directory(cli, tmp_path):
    r = cli(["+experiment=lm_addition", "env.eval_size=-1", f"hydra.run.dir={tmp_path / 'run'}"], timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and lines == ["dppo: error: env.eval_size must be >= 0, got -1"], r.stderr[-2000:]
    assert not (tmp_path / "run").exists()
