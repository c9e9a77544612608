"""Property: over the config schema, every invalid combination exits 2 with one line and writes nothing;
every valid one starts (passes the one build and reaches the round loop, which the test stubs). Invalid includes combinations that used to fail mid-run or
run silently wrong: an accountant or composition that cannot account DP-PG's releases, a max_epsilon below
eps, a horizon <= 0, a population that cannot fit in memory."""
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unittest import mock

from dppo import api, cli
from dppo.cli import entry

number = st.one_of(st.floats(-10, 10, allow_nan=False), st.sampled_from([0.0, 1.0, 1e-5, float("inf")]))
FIELDS = {
    "eps": st.one_of(st.none(), number),
    "delta": st.one_of(number, st.sampled_from([1e-5, 0.5, 1.0])),
    "users_per_round": st.integers(-2, 12),
    "max_grad_norm": number,
    "reward_bound": st.one_of(st.none(), number),
    "rounds": st.integers(-1, 5),
    "privacy.population_size": st.one_of(st.none(), st.integers(0, 60), st.just(10**14)),
    "privacy.accountant": st.sampled_from([None, "parallel", "basic", "rdp", "prv", "advanced", "zcdp"]),
    "privacy.max_epsilon": st.sampled_from([None, -1.0, 0.5, 3.0, 100.0]),
    "privacy.composition": st.sampled_from(["advanced", "advanced", "zcdp"]),
    "env.horizon": st.sampled_from([None, -2, 0, 1, 30]),
}


def is_valid(v):
    finite_pos = lambda x: x is not None and x > 0 and math.isfinite(x)  # noqa: E731
    ok = (v["eps"] is None or finite_pos(v["eps"])) and 1e-100 <= v["delta"] < 1 and v["users_per_round"] >= 1
    ok = ok and finite_pos(v["max_grad_norm"]) and (v["reward_bound"] is None or finite_pos(v["reward_bound"]))
    ok = ok and v["rounds"] >= 1
    pop = v["privacy.population_size"]
    if ok and pop is not None:
        ok = pop >= 1 and pop >= v["rounds"] * v["users_per_round"] and pop < 10**12  # 10**14 cannot fit in memory
    cap, horizon = v["privacy.max_epsilon"], v["env.horizon"]
    ok = ok and (cap is None or cap > 0) and (horizon is None or horizon >= 1)
    if ok and v["eps"] is not None:   # a private DP-PG run: Gaussian one-pass releases
        ok = v["privacy.accountant"] in (None, "parallel", "basic") and v["privacy.composition"] == "advanced"
        ok = ok and (cap is None or cap >= v["eps"])
    return ok


def fmt(x):
    return "null" if x is None else repr(x) if isinstance(x, float) else str(x)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries(FIELDS))
def test_invalid_configs_exit_2_and_valid_ones_start(capsys, tmp_path_factory, values):
    run_dir = tmp_path_factory.mktemp("run")
    out = tmp_path_factory.mktemp("out")
    args = [f"{k}={fmt(v)}" for k, v in values.items()] + ["progress=false", "algo=dp_pg", f"hydra.run.dir={out}/r"]
    started = []

    def finish(trainer, dist):  # the build passed: the run would start here
        started.append(True)
        trainer.close() if hasattr(trainer, "close") else None
        return {}

    try:
        with mock.patch.object(api, "finish", finish), mock.patch.object(cli, "_report", lambda *a: None):
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
