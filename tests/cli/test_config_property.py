"""Property: over the config schema, every invalid combination exits 2 with one line and writes nothing;
every valid one starts (reaches Hydra's run)."""
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dppo.cli import entry

number = st.one_of(st.floats(-10, 10, allow_nan=False), st.sampled_from([0.0, 1.0, 1e-5, float("inf")]))
FIELDS = {
    "eps": st.one_of(st.none(), number),
    "delta": st.one_of(number, st.sampled_from([1e-5, 0.5, 1.0])),
    "users_per_round": st.integers(-2, 12),
    "max_grad_norm": number,
    "reward_bound": st.one_of(st.none(), number),
    "rounds": st.integers(-1, 5),
    "privacy.population_size": st.one_of(st.none(), st.integers(0, 60)),
}


def is_valid(v):
    finite_pos = lambda x: x is not None and x > 0 and math.isfinite(x)  # noqa: E731
    ok = (v["eps"] is None or finite_pos(v["eps"])) and 0 < v["delta"] < 1 and v["users_per_round"] >= 1
    ok = ok and v["max_grad_norm"] > 0 and (v["reward_bound"] is None or v["reward_bound"] > 0)
    ok = ok and v["rounds"] >= 1
    pop = v["privacy.population_size"]
    if ok and pop is not None:
        ok = pop >= 1 and pop >= v["rounds"] * v["users_per_round"]
    return ok


def fmt(x):
    return "null" if x is None else repr(x) if isinstance(x, float) else str(x)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries(FIELDS))
def test_invalid_configs_exit_2_and_valid_ones_start(capsys, tmp_path_factory, values):
    run_dir = tmp_path_factory.mktemp("run")
    args = [f"{k}={fmt(v)}" for k, v in values.items()] + ["progress=false", "algo=dp_pg"]
    started = []
    try:
        entry(lambda: started.append(True), args)
        code = 0
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    if is_valid(values):
        assert code == 0 and started, err
    else:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and not started and len(lines) == 1 and "Traceback" not in err
    assert list(run_dir.iterdir()) == []  # pre-flight writes nothing anywhere near a run directory
