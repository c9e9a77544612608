"""Exact values on ICU-Sepsis's own tables (``pip install -e ".[icu]"``): the expected return (survival: reward 1
when the patient survives) of a policy from the env's initial distribution, over the env's horizon (500 steps),
by backward induction on the tables; the optimal policy (value iteration over the same horizon) and the
clinicians' policy shipped with the env (estimated from the ICU records).

These are public computations on the env's published tables (no patient of a run enters them): the suite's
survival column (``scripts/reproduce_icu_sepsis.py``) and the reference rows use them.
"""
from __future__ import annotations

import numpy as np

HORIZON = 500


def tables() -> dict:
    """P [S, A, S], r [S, A] (expected reward), d0 [S], live [S] (0 at terminal states), admissible [S, A]."""
    from dppo.envs.icu_sepsis_vector import package_tables

    t = package_tables()
    if "r" not in t:
        P = np.asarray(t["P"], np.float64)
        t["r"] = np.einsum("sat,sat->sa", P, np.asarray(t["R"], np.float64))     # no [S, A, S] temporary
        live = np.ones(P.shape[0])
        live[list(t["terminal"])] = 0.0
        t["live"] = live
    return t


def _as_matrix(policy, S: int, A: int) -> np.ndarray:
    p = np.asarray(policy)
    if p.shape == (S,):
        return np.eye(A)[p.astype(np.int64)]
    if p.shape != (S, A):
        raise ValueError(f"a policy is an action per state ({S},) or probabilities ({S}, {A}), got {p.shape}")
    return p.astype(np.float64)


def survival(policy, horizon: int = HORIZON) -> float:
    """Expected return of ``policy`` (an action per state, or [S, A] probabilities) over ``horizon`` steps."""
    t = tables()
    P, r, d0, live = t["P"], t["r"], t["d0"], t["live"]
    S, A = r.shape
    pi = _as_matrix(policy, S, A)
    P_pi = np.einsum("sa,sat->st", pi, P)
    r_pi = (pi * r).sum(-1)
    V = np.zeros(S)
    for _ in range(int(horizon)):
        V = live * (r_pi + P_pi @ V)
    return float(np.asarray(d0, np.float64) @ V)


def optimal(horizon: int = HORIZON, masked: bool = False) -> tuple[float, np.ndarray]:
    """(optimal survival, a greedy optimal policy [S]); ``masked``: over the admissible actions only."""
    t = tables()
    P, r, d0, live = t["P"], t["r"], t["d0"], t["live"]
    ok = np.asarray(t["admissible"], bool) if masked else np.ones(r.shape, bool)
    ok = ok | ~ok.any(1, keepdims=True)
    V = np.zeros(r.shape[0])
    for _ in range(int(horizon)):
        Q = np.where(ok, r + P @ V, -np.inf)
        V = live * Q.max(-1)
    return float(np.asarray(d0, np.float64) @ V), Q.argmax(-1)


def clinicians() -> np.ndarray:
    """The clinicians' policy shipped with the env, [S, A] probabilities."""
    import gymnasium as gym

    from dppo.envs.icu_sepsis_vector import import_package

    import_package()   # registers the env (without the legacy gym's banner)

    return np.asarray(gym.make("Sepsis/ICU-Sepsis-v2").unwrapped._expert_policy, np.float64)


def uniform(masked: bool = False) -> np.ndarray:
    """The uniformly random policy [S, A] (over the admissible actions with ``masked``)."""
    t = tables()
    ok = np.asarray(t["admissible"], bool) if masked else np.ones(t["r"].shape, bool)
    ok = ok | ~ok.any(1, keepdims=True)
    return ok / ok.sum(1, keepdims=True)
