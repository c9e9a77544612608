"""ICU-Sepsis reference rows, computed exactly on the env's own tables (``pip install -e ".[icu]"``).

* optimal: value iteration over the horizon (500 steps: the env's episode limit);
* clinicians: the policy shipped with the env (``_expert_policy``, estimated from the ICU records);
* random: uniform over the 25 treatments;
* tabular Q-learning (the env paper's baseline; not part of the package): epsilon-greedy, one episode per
  patient on the env's tables, its greedy policy evaluated exactly after ``--checkpoints`` patients.

Survival = the expected return (reward 1 when the patient survives), from the env's initial distribution.

    python scripts/icu_sepsis_reference.py                     # the exact rows
    python scripts/icu_sepsis_reference.py --q-learning --seeds 0 1 2 3 4 5 6 7 8 9
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

ENV_ID = "Sepsis/ICU-Sepsis-v2"
HORIZON = 500


def tables():
    """(P [S, A, S], R [S, A, S], d0 [S], clinicians [S, A], terminal states) of the env."""
    try:
        import gymnasium as gym
        import icu_sepsis  # noqa: F401 - registers the env
        from icu_sepsis.utils.constants import STATES_TERMINAL
    except ImportError:
        sys.exit("icu-sepsis is not installed: pip install -e \".[icu]\"")
    env = gym.make(ENV_ID).unwrapped
    return (np.asarray(env._tx_mat, np.float64), np.asarray(env._r_mat, np.float64), np.asarray(env._d_0, np.float64),
            np.asarray(env._expert_policy, np.float64), sorted(int(s) for s in STATES_TERMINAL))


def expected_rewards(P, R) -> np.ndarray:
    return (P * R).sum(-1)                                                   # r(s, a) [S, A]


def evaluate(policy: np.ndarray, P, r, d0, terminal, horizon: int = HORIZON) -> float:
    """E[return] of a stochastic policy [S, A] over ``horizon`` steps (terminal states absorb with reward 0)."""
    live = np.ones(P.shape[0])
    live[terminal] = 0.0
    V = np.zeros(P.shape[0])
    for _ in range(horizon):
        V = live * (policy * (r + P @ V)).sum(-1)
    return float(d0 @ V)


def optimal(P, r, d0, terminal, horizon: int = HORIZON) -> tuple[float, np.ndarray]:
    live = np.ones(P.shape[0])
    live[terminal] = 0.0
    V = np.zeros(P.shape[0])
    for _ in range(horizon):
        Q = r + P @ V
        V = live * Q.max(-1)
    return float(d0 @ V), Q.argmax(-1)


def q_learning(P, R, d0, terminal, patients: int, checkpoints: list[int], seed: int, alpha: float = 0.1,
               epsilon: float = 0.1) -> dict:
    """Tabular Q-learning (undiscounted, one episode per patient), greedy policy evaluated at checkpoints."""
    rng = np.random.default_rng(seed)
    S, A = P.shape[:2]
    term = np.zeros(S, dtype=bool)
    term[terminal] = True
    cdf = np.cumsum(P, -1)
    d0_cdf = np.cumsum(d0)
    Q = np.zeros((S, A))
    r = expected_rewards(P, R)
    out = {}
    for k in range(1, patients + 1):
        s = int(np.searchsorted(d0_cdf, rng.random() * d0_cdf[-1], side="right"))
        for _ in range(HORIZON):
            a = int(rng.integers(A)) if rng.random() < epsilon else int(rng.choice(np.flatnonzero(Q[s] == Q[s].max())))
            s2 = min(int(np.searchsorted(cdf[s, a], rng.random() * cdf[s, a, -1], side="right")), S - 1)
            target = R[s, a, s2] + (0.0 if term[s2] else Q[s2].max())
            Q[s, a] += alpha * (target - Q[s, a])
            s = s2
            if term[s]:
                break
        if k in checkpoints:
            greedy = np.eye(A)[Q.argmax(-1)]
            out[k] = evaluate(greedy, P, r, d0, terminal)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--q-learning", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[10_000, 50_000, 100_000, 200_000])
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    P, R, d0, clinicians, terminal = tables()
    r = expected_rewards(P, R)
    S, A = r.shape
    best, _ = optimal(P, r, d0, terminal)
    rows = {"optimal (value iteration)": best,
            "clinicians (the env's expert policy)": evaluate(clinicians, P, r, d0, terminal),
            "random (uniform)": evaluate(np.full((S, A), 1.0 / A), P, r, d0, terminal)}
    print(f"{ENV_ID}, horizon {HORIZON}: survival (exact, on the env's tables)\n")
    print("| policy | survival |\n|---|---|")
    for name, v in rows.items():
        print(f"| {name} | {v:.4f} |")
    result = {"exact": rows}
    if args.q_learning:
        runs = [q_learning(P, R, d0, terminal, max(args.checkpoints), args.checkpoints, s) for s in args.seeds]
        print(f"\ntabular Q-learning (alpha 0.1, epsilon 0.1), seeds {args.seeds}: survival of the greedy policy\n")
        print("| patients | mean | min | max |\n|---|---|---|---|")
        for c in args.checkpoints:
            v = [run[c] for run in runs]
            print(f"| {c} | {np.mean(v):.4f} | {np.min(v):.4f} | {np.max(v):.4f} |")
        result["q_learning"] = {str(c): [run[c] for run in runs] for c in args.checkpoints}
        result["q_learning_seeds"] = list(args.seeds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
