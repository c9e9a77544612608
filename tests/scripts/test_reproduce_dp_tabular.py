"""scripts/reproduce_dp_tabular.py's report: crossover t (measured and extrapolated), per-seed ratio range,
gate-open table, carried-over subsections - on synthetic run records (no training)."""
import importlib.util
import json
import math
import pathlib
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("reproduce_dp_tabular", ROOT / "scripts" / "reproduce_dp_tabular.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_crossover_is_the_first_t_from_which_the_ratio_stays_below_1_5():
    mod = _module()
    ts = [1000, 2000, 3000, 4000]
    table = {1000: 1.0, 2000: 1.7, 3000: 1.4, 4000: 1.2}
    assert mod._crossover(ts, table.get) == "3,000"
    assert mod._crossover(ts, lambda t: 1.1) == "1,000"


def test_crossover_extrapolates_a_falling_power_law_and_refuses_a_rising_one():
    mod = _module()
    ts = [10 ** 5 * k for k in range(1, 11)]
    ratio = lambda t: 3.0 * (t / 1e5) ** -0.25          # 3 at 1e5, 1.5 at 1.6e6
    text = mod._crossover(ts, ratio)
    assert text.startswith("> 1,000,000 (extrapolated ~")
    assert float(text.split("~")[1].rstrip(")").replace(",", "")) == pytest.approx(1e5 * 2 ** 4, rel=1e-2)
    assert "not falling" in mod._crossover(ts, lambda t: 2.0 + t / 1e6)


def _run(algo, eps, seed, regret_per_round, gate=None, kw=None):
    kw = kw or {}
    rounds = [1000 * (i + 1) for i in range(len(regret_per_round))]
    curve = [sum(regret_per_round[:i + 1]) for i in range(len(regret_per_round))]
    mod = _module()
    return {"env": "riverswim", "H": 10, "algo": algo, "eps": eps, "kw": kw, "tag": mod.tag(algo, eps, kw),
            "seed": seed, "T": rounds[-1], "cumulative_regret": curve[-1], "rounds": rounds, "curve": curve,
            "gate_open_fraction": [gate] * len(rounds), "E": [None if gate is None else 100.0] * len(rounds),
            "final_E": 0.0 if gate is None else 100.0, "releases": 50, "epsilon_spent": 0.0 if eps is None else eps,
            "delta": 1e-5, "wall_s": 1.0, "episodes_per_s": 5000.0}


def test_tags_and_twins():
    mod = _module()
    assert mod.tag("dp_ubev", 5.0, {}) == "dp_ubev_eps5" and mod.tag("dp_ubev", None, {}) == "dp_ubev_exact"
    assert mod.tag("dp_ubev", None, {"block_growth": None}) == "dp_ubev_exact_every_episode"
    assert mod.tag("dp_ubev", 1.0, {"pool_steps": False}) == "dp_ubev_eps1_per_step"
    assert mod.twin_tag({"algo": "dp_ubev", "eps": 1.0, "kw": {"pool_steps": False}}) == "dp_ubev_exact_per_step"
    assert mod.twin_tag({"algo": "pucb", "eps": 5.0, "kw": {}}) == "pucb_exact"
    assert mod.twin_tag({"algo": "ubev", "eps": None, "kw": {}}) is None


def test_report_divides_each_private_learner_by_its_own_twin_and_by_the_best(tmp_path):
    mod = _module()
    out = tmp_path / "runs"
    out.mkdir()
    for seed, scale in ((0, 1.0), (1, 2.0)):
        runs = (_run("ubev", None, seed, [30.0 * scale] * 5), _run("dp_ubev", None, seed, [10.0 * scale] * 5),
                _run("dp_ubev", None, seed, [8.0 * scale] * 5, kw={"block_growth": None}),
                _run("dp_ubev", 1.0, seed, [20.0 * scale] * 5, 0.5), _run("pucb", None, seed, [40.0 * scale] * 5),
                _run("pucb", 5.0, seed, [60.0 * scale] * 5, 0.0))
        for r in runs:
            (out / f"riverswim_h10_{r['tag']}_s{seed}_T5000.json").write_text(json.dumps(r))
    md = tmp_path / "t.md"
    md.write_text("# grid\n\n" + mod.BEGIN + "\n\nold section\n\n" + mod.END + "\n")
    args = types.SimpleNamespace(out=str(out), md=str(md), png=str(tmp_path / "t.png"))
    mod.report(args)
    text = md.read_text()
    mod.report(args)
    assert md.read_text() == text                           # regenerating is idempotent
    assert text.startswith("# grid") and text.count(mod.BEGIN) == 1 and "old section" not in text
    row = lambda name: next(l for l in text.splitlines() if l.startswith(f"| {name} |"))
    assert "| **2.00** (2.00-2.00) | 2.50 (2.50-2.50) |" in row("dp_ubev_eps1")   # / twin 20/10, / best 20/8
    assert "| **1.50** (1.50-1.50) | 7.50 (7.50-7.50) |" in row("pucb_eps5")
    assert "(best)" in row("dp_ubev_exact_every_episode")
    gate = next(l for l in text.splitlines() if l.startswith("| dp_ubev_eps1 | open gates |"))
    assert gate.count("0.50") == 3                          # t = 1000, 2000, 5000
    assert not math.isnan(float(row("dp_ubev_eps1").split("|")[4].split("+-")[0].replace(",", "")))
