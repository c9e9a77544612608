"""scripts/reproduce_icu_sepsis.py (the suite's ICU-Sepsis table, filled row by row across sittings) and the tabular
Q-learning of scripts/icu_sepsis_reference.py: the pieces that hold without the optional icu_sepsis package (the
store skips the (row, seed) pairs it holds and keeps results written side by side, the table's cells, the columns
read from a run's progress.csv, Q-learning on a small MDP), and the exact rows where icu_sepsis is installed."""
import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mod():
    return _module("reproduce_icu_sepsis")


@pytest.fixture(scope="module")
def ref():
    return _module("icu_sepsis_reference")


def test_the_store_skips_stored_pairs_and_keeps_what_another_invocation_wrote(mod, tmp_path):
    path = str(tmp_path / "icu.json")
    q, exact = mod.ROW["q"], mod.ROW["optimal"]
    mod.record(path, q, 0, {"survival": 0.84, "train_return": 0.81, "wall_s": 30.0, "peak_mib": 700.0,
                            "curve": [[10, 0.8]], "policy": [0, 1]})
    store = mod.load_store(path)
    assert mod.is_stored(store, "q", 0) and not mod.is_stored(store, "q", 1)
    assert "policy" not in store["rows"]["q"]["seeds"]["0"]          # the policy itself is not kept
    pairs = mod.todo(store, [q, exact], [0, 1, 2])
    assert [(r["id"], s) for r, s in pairs] == [("q", 1), ("q", 2), ("optimal", None)]
    assert len(mod.todo(store, [q], [0, 1], rerun=True)) == 2
    # another invocation, started from an older copy of the store, adds its seed: both are kept
    mod.record(path, q, 2, {"survival": 0.85, "train_return": 0.80})
    mod.record(path, exact, None, {"survival": 0.8751, "train_return": None})
    seeds = mod.load_store(path)["rows"]["q"]["seeds"]
    assert list(seeds) == ["0", "2"]
    assert mod.is_stored(mod.load_store(path), "optimal", None)


def test_table_cells_and_report(mod):
    assert mod.stat([0.8, 0.9, None]) == "0.8500 [0.8000, 0.9000]" and mod.stat([0.5]) == "0.5000"
    assert mod.stat([None]) == "n/a"
    assert mod.seed_list(["0", "1", "2", "3"]) == "4 (0-3)" and mod.seed_list(["0", "5"]) == "2 (0, 5)"
    assert mod.seed_list(["exact"]) == "exact"
    assert mod.parse_seeds(["0-9"]) == list(range(10)) and mod.parse_seeds(["3", "1"]) == [3, 1]
    store = {"rows": {}}
    mod.put(store, mod.ROW["optimal"], None, {"survival": 0.8751, "train_return": None})
    mod.put(store, mod.ROW["q"], 0, {"survival": 0.84, "train_return": 0.81, "wall_s": 30.0, "peak_mib": 700.0})
    mod.put(store, mod.ROW["q"], 1, {"survival": 0.86, "train_return": 0.83, "wall_s": 40.0, "peak_mib": 2500.0})
    lines = mod.table_lines(store)
    assert "| optimal (value iteration) | exact | 0.8751 | n/a | - | - |" in lines
    assert "| tabular Q-learning | 2 (0, 1) | 0.8500 [0.8400, 0.8600] | 0.8200 [0.8100, 0.8300] | 35 | 2500 |" in lines
    assert "| PPO | 0 | (not run) | | | |" in lines
    text = mod.report_text(store)
    assert "raw diagnostic of the private data" in text and "secure_rng=false" in text and "seeds 100-102" in text
    assert "**over 2048 MiB**: q" in text


def test_the_columns_of_a_dppo_run_come_from_its_progress_csv(mod):
    rows = [{"rollout/episodes": "100", "diag/return": "0.8", "eval/return": ""},
            {"rollout/episodes": "300", "diag/return": "0.9", "eval/return": "0.85"}]
    got = mod.progress_columns(rows)
    assert got["train_return"] == pytest.approx((80 + 270) / 400) and got["patients"] == 400
    assert got["curve"] == [[400.0, 0.85]]
    assert mod.progress_columns([{"rollout/episodes": "5"}])["train_return"] is None   # no diagnostics logged


def test_released_policies(mod):
    admissible = np.array([[True, False, True], [False, True, False]])
    assert mod.masked_argmax([[1.0, 9.0, 2.0], [5.0, 0.0, 7.0]], admissible).tolist() == [2, 1]

    class Saved:
        policy = None
        learner = type("Learner", (), {"policy_table": lambda self: np.array([2, 1, 0])})()

    assert mod.released_actions(Saved(), admissible).tolist() == [2, 1]       # the table, cut to the env's states
    Saved.learner = object()
    with pytest.raises(NotImplementedError, match="policy_table"):
        mod.released_actions(Saved(), admissible)


def test_a_row_that_cannot_run_says_why_in_one_line(mod):
    row = {**mod.ROW["ppo"], "experiment": "icu_sepsis_not_written_yet"}
    why = mod.unavailable(row)
    assert why is not None and "\n" not in why
    if importlib.util.find_spec("icu_sepsis") is not None:
        assert "icu_sepsis_not_written_yet.yaml does not exist" in why
        assert mod.unavailable({**mod.ROW["sb3_ppo"], "package": "no_such_package_xyz"}).startswith("no_such_package")


def test_the_plot_draws_the_stored_curves(mod, tmp_path):
    pytest.importorskip("matplotlib")
    store = {"rows": {}}
    mod.put(store, mod.ROW["optimal"], None, {"survival": 0.8751})
    for seed, end in ((0, 0.84), (1, 0.86)):
        mod.put(store, mod.ROW["q"], seed, {"survival": end, "curve": [[10_000, 0.79], [200_000, end]]})
    x, mean, low, high = mod.mean_curve([[[1, 0.5], [3, 0.7]], [[2, 0.6]]])
    assert x == [1.0, 2.0, 3.0] and mean == pytest.approx([0.55, 0.55, 0.65]) and high == [0.6, 0.6, 0.7]
    mod.plot(store, str(tmp_path / "icu.png"))
    assert (tmp_path / "icu.png").stat().st_size > 1000


def _chain_mdp():
    """Two live states and two terminal ones (2: survival, reward 1; 3: death). In state 0 action 1 survives with
    0.9 and action 0 with 0.5; action 1 is admissible only in state 0; state 1 moves to 0 with every action."""
    S, A = 4, 2
    P = np.zeros((S, A, S))
    P[0, 0, [2, 3]] = 0.5
    P[0, 1, [2, 3]] = [0.9, 0.1]
    P[1, :, 0] = 1.0
    P[2, :, 2] = P[3, :, 3] = 1.0
    R = np.zeros((S, A, S))
    R[:, :, 2] = 1.0
    R[2:, :, :] = 0.0
    admissible = np.array([[True, True], [True, False], [True, True], [True, True]])
    tables = {"P": P, "R": R, "d0": np.array([0.5, 0.5, 0.0, 0.0]), "terminal": [2, 3], "admissible": admissible}

    def survival(policy):
        return float(0.5 * P[0, policy[0], 2] + 0.5 * P[0, policy[0], 2])

    return tables, survival


@pytest.mark.parametrize("masked", [False, True])
def test_q_learning_finds_the_better_treatment_on_a_small_mdp(ref, masked):
    tables, survival = _chain_mdp()
    res = ref.q_learning(patients=2000, seed=0, masked=masked, checkpoint_every=500, tables=tables, survival=survival)
    assert res["policy"][0] == 1 and res["survival"] == pytest.approx(0.9)
    assert [p for p, _ in res["curve"]] == [500, 1000, 1500, 2000]
    assert 0.5 < res["train_return"] < 0.9            # exploration (epsilon 1 -> 0.05 over 600 patients) costs
    again = ref.q_learning(patients=2000, seed=0, masked=masked, checkpoint_every=500, tables=tables, survival=survival)
    assert again["train_return"] == res["train_return"]          # seeded
    if masked:
        assert res["policy"][1] == 0                  # the released action is admissible


def test_the_exploration_schedule(ref):
    assert ref.epsilon_at(0, 1000) == 1.0 and ref.epsilon_at(300, 1000) == pytest.approx(0.05)
    assert ref.epsilon_at(150, 1000) == pytest.approx(0.525) and ref.epsilon_at(999, 1000) == 0.05


@pytest.mark.slow     # the package's tables take 5-20 s to load on this machine
def test_the_exact_rows_on_the_env_tables():
    pytest.importorskip("icu_sepsis")
    from dppo.envs import icu_sepsis_exact as ex    # what the exact rows are (optimal's value iteration: ~5 s, not here)

    assert ex.survival(ex.uniform()) == pytest.approx(0.7801, abs=1e-4)
    assert ex.survival(ex.clinicians()) == pytest.approx(0.7818, abs=1e-4)


def test_the_stored_reference_has_every_exact_row_and_both_q_learning_variants():
    path = os.path.join(ROOT, "runs", "reference", "icu_sepsis.json")
    if not os.path.isfile(path):
        pytest.skip("runs/reference/icu_sepsis.json not made yet")
    with open(path) as f:
        rows = json.load(f)["rows"]
    assert {"random", "clinicians", "optimal", "q", "q_masked"} <= set(rows)
    assert all(r["peak_mib"] <= 2048 for e in rows.values() for r in e["seeds"].values() if r.get("peak_mib"))
