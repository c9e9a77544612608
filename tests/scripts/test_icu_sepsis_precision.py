"""scripts/icu_sepsis_precision.py (what a per-treatment estimate's error costs on ICU-Sepsis): its counts of first
visits against a per-patient loop, its sampled episodes against the tables' law, and its optimal values against
plain value iteration, on a small MDP in the tables' format (no icu_sepsis package needed)."""
import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("icu_sepsis_precision",
                                                  os.path.join(ROOT, "scripts", "icu_sepsis_precision.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def small_tables(seed=0):
    """5 states (3 and 4 terminal: 4 = survival, entered with reward 1), 3 actions, action 2 inadmissible in 0."""
    rng = np.random.default_rng(seed)
    S, A = 5, 3
    P = rng.dirichlet(np.ones(S), size=(S, A))
    P[3:] = 0.0
    P[3:, :, 3] = 1.0                                   # terminal states absorb (never reached: episodes stop)
    R = np.zeros((S, A, S))
    R[:, :, 4] = 1.0
    adm = np.ones((S, A), bool)
    adm[0, 2] = False
    live = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
    return {"P": P, "R": R, "d0": np.array([0.5, 0.3, 0.2, 0.0, 0.0]), "live": live, "admissible": adm,
            "r": np.einsum("sat,sat->sa", P, R)}


def test_first_visits_equal_a_per_patient_count(mod):
    t = small_tables()
    V = np.array([0.3, 0.6, 0.1, 0.0, 0.0])
    steps = mod.episodes(t, 300, np.random.default_rng(1))
    for pairs in (1, 2, 10):
        N, Y = mod.first_visits(t, V, steps, pairs)
        user, step, s, a, s2, r = steps
        N2, Y2 = np.zeros((5, 3)), np.zeros((5, 3))
        for u in np.unique(user):
            rows = np.flatnonzero(user == u)
            rows = rows[np.argsort(step[rows])]
            met = []
            for i in rows:
                if (s[i], a[i]) in met or len(met) >= pairs:
                    continue
                met.append((s[i], a[i]))
                N2[s[i], a[i]] += 1
                Y2[s[i], a[i]] += r[i] + V[s2[i]] * t["live"][s2[i]]
        assert np.array_equal(N, N2)
        np.testing.assert_allclose(Y, Y2, rtol=0, atol=1e-9)
        assert N[0, 2] == 0                              # an inadmissible treatment is never taken


def test_episodes_follow_the_tables_and_treat_among_the_admissible(mod):
    t = small_tables()
    user, step, s, a, s2, r = mod.episodes(t, 20000, np.random.default_rng(2))
    first = step == 0
    starts = np.bincount(s[first], minlength=5) / first.sum()
    np.testing.assert_allclose(starts, t["d0"], atol=0.02)
    taken = s == 0
    np.testing.assert_allclose(np.bincount(a[taken], minlength=3) / taken.sum(), [0.5, 0.5, 0.0], atol=0.02)
    pick = (s == 1) & (a == 0)
    np.testing.assert_allclose(np.bincount(s2[pick], minlength=5) / pick.sum(), t["P"][1, 0], atol=0.03)
    assert np.array_equal(r, (s2 == 4).astype(float))
    assert not np.isin(s[step > 0], [3, 4]).any()        # an episode stops on entering a terminal state


def test_optimal_values_are_value_iteration_over_the_admissible_treatments(mod):
    t = small_tables()
    Q, V = mod.optimal_q(t, 50)
    V2 = np.zeros(5)
    for _ in range(50):
        Q2 = t["r"] + t["P"] @ V2
        Q2[0, 2] = -np.inf
        V2 = np.where(t["live"] > 0, Q2.max(1), 0.0)
    np.testing.assert_allclose(V, V2, atol=1e-12)
    assert Q[0, 2] == -np.inf and np.isfinite(Q[0, :2]).all()
