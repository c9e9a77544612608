"""Bad config or input: one line on stderr, exit code 2, no traceback.

Most cases go through the CLI's own entry function in-process (fast); a few run ``train.py`` in a
subprocess to check the real exit code and that no traceback reaches the terminal.
"""
import pytest

from dppo.cli import entry

CASES = [
    (["eps=0"], "eps must be > 0"),
    (["eps=-1"], "eps must be > 0"),
    (["delta=0"], "delta"),
    (["delta=1.5"], "delta"),
    (["algo=nope"], "algo"),
    (["env.id=NoSuchEnv-v9"], "unknown env.id"),
    (["env.id=FrozenLake-v1", "algo=dp_pg"], "Box observation"),
    (["users_per_round=0"], "users_per_round"),
    (["max_grad_norm=0"], "max_grad_norm"),
    (["privacy.population_size=50", "rounds=10"], "population has 50"),
    (["resume=/tmp/definitely/not/a/run"], "not a run directory"),
    (["eps=abc"], "bad config"),
    (["unknown_key=3"], "bad config"),
    (["algo=dp_pg", "privacy.multi_pass=true", "privacy.population_size=20", "eps=0.01", "rounds=1000"],
     "cannot be met"),
    (["algo=dp_npg", "privacy.multi_pass=true", "privacy.population_size=20"], "one-pass training only"),
]


def _never_called():
    raise AssertionError("Hydra's run must not start for a bad config")


@pytest.mark.parametrize("args,needle", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        entry(_never_called, [*args, "progress=false"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


@pytest.mark.parametrize("args,needle", [(["eps=0"], "eps must be > 0"), (["unknown_key=3"], "bad config"),
                                         (["env.id=NoSuchEnv-v9"], "unknown env.id")])
def test_subprocess_exit_code_and_no_traceback(cli, tmp_path, args, needle):
    r = cli([*args, "progress=false", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()  # rejected before Hydra made a run directory
