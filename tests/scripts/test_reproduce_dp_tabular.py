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


def _run(algo, eps, seed, regret_per_round, gate=None):
    rounds = [1000 * (i + 1) for i in range(len(regret_per_round))]
    curve = [sum(regret_per_round[:i + 1]) for i in range(len(regret_per_round))]
    return {"H": 10, "algo": algo, "eps": eps, "seed": seed, "T": rounds[-1], "counter": "gaussian", "pool": True,
            "cumulative_regret": curve[-1], "rounds": rounds, "curve": curve,
            "gate_open_fraction": [gate] * len(rounds), "E": [None if gate is None else 100.0] * len(rounds),
            "final_E": 0.0 if gate is None else 100.0, "epsilon_spent": 0.0 if eps is None else eps, "delta": 1e-5,
            "wall_s": 1.0, "episodes_per_s": 5000.0}


def test_report_pairs_seeds_and_carries_over_missing_groups(tmp_path):
    mod = _module()
    out = tmp_path / "runs"
    out.mkdir()
    for seed, scale in ((0, 1.0), (1, 2.0)):
        for r in (_run("ubev", None, seed, [10.0 * scale] * 5), _run("dp_ubev", 1.0, seed, [20.0 * scale] * 5, 0.5)):
            (out / f"riverswim_h10_{mod._tag(r)}_s{seed}_T5000.json").write_text(json.dumps(r))
    md = tmp_path / "t.md"
    old = ("# grid\n\n" + mod.BEGIN + "\n\n### RiverSwim H = 20, T = 100,000 episodes\n\n| old row |\n\n"
           "![DP-UBEV vs UBEV](tabular_dp.png)\n\n" + mod.END + "\n")
    md.write_text(old)
    mod.report(types.SimpleNamespace(out=str(out), md=str(md), png=str(tmp_path / "t.png")))
    text = md.read_text()
    mod.report(types.SimpleNamespace(out=str(out), md=str(md), png=str(tmp_path / "t.png")))
    assert md.read_text() == text                           # regenerating is idempotent (one label per block)
    assert text.startswith("# grid") and text.count(mod.BEGIN) == 1
    row = next(l for l in text.splitlines() if l.startswith("| dp_ubev_eps1_gaussian | 1 | 0,1 |"))
    assert "| 2.00 | 2.00-2.00 |" in row                  # ratio of means and each seed's own ratio
    assert "| old row |" in text and "carried over" in text  # H = 20 group had no JSON: kept
    gate = next(l for l in text.splitlines() if "| open gates |" in l)
    assert gate.count("0.50") == 3                          # t = 1000, 2000, 5000
    assert not math.isnan(float(row.split("|")[4].split("+-")[0].replace(",", "")))
