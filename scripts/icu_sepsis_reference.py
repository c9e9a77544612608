"""ICU-Sepsis reference rows on the env's own tables (``pip install -e ".[icu]"``): the exact policies, and tabular
Q-learning, the env paper's baseline (a script beside the suite, not part of the package).

* optimal: value iteration over the env's horizon (500 steps); clinicians: the policy shipped with the env (estimated
  from the ICU records); random: uniform over the 25 treatments (``dppo.envs.icu_sepsis_exact``);
* tabular Q-learning: one episode per patient, sampled from the env's tables (P, R, d0; the default inadmissible-
  action strategy of v2, "mean", is what the tables hold), undiscounted; Q0 = 0.5 (optimistic: survival is at most
  1), step size 1 / N(s, a)^0.6, epsilon-greedy with epsilon decaying linearly from 1 to 0.05 over the first 30% of
  the patients; ``--masked``: exploration and the max of the target over the env's admissible actions
  (``tables()["admissible"]``), without: over all 25. The released policy is the greedy one (ties: the lowest
  action; ``--masked``: among the admissible actions), evaluated exactly every ``--checkpoint-every`` patients.

Survival = the expected return (reward 1 when the patient survives) from the env's initial distribution, at the
env's horizon. The training return is the mean return of the patients Q-learning treated while it learned.

    python scripts/icu_sepsis_reference.py                                   # the exact rows
    python scripts/icu_sepsis_reference.py --q-learning --seeds 0 1 2        # Q-learning without the admissible sets
    python scripts/icu_sepsis_reference.py --q-learning --masked --seeds 0   # ... with them
    python scripts/icu_sepsis_reference.py --q-learning --seeds 0 --result out.json   # one JSON per seed (a list)

``scripts/reproduce_icu_sepsis.py`` runs this script per (variant, seed) and keeps the results in
``runs/reference/icu_sepsis.json`` (the table ``icu_sepsis.md``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from bisect import bisect_right

import numpy as np

ENV_ID = "Sepsis/ICU-Sepsis-v2"
PATIENTS = 200_000
CHECKPOINT_EVERY = 10_000
# the Q-learning settings (chosen on seeds 100-102)
Q0, STEP_POWER, EPS_START, EPS_END, EPS_FRACTION = 0.5, 0.6, 1.0, 0.05, 0.3


def _exact():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        import icu_sepsis  # noqa: F401
    except ImportError:
        sys.exit("icu-sepsis is not installed: pip install -e \".[icu]\"")
    from dppo.envs import icu_sepsis_exact

    return icu_sepsis_exact


def exact_rows() -> dict:
    """{name: survival} of the random, clinicians' and optimal policies."""
    ex = _exact()
    return {"random (uniform)": ex.survival(ex.uniform()), "clinicians (the env's policy)": ex.survival(ex.clinicians()),
            "optimal (value iteration)": ex.optimal()[0]}


def epsilon_at(k: int, patients: int) -> float:
    """Exploration rate for patient ``k`` (0-indexed): linear from EPS_START to EPS_END over the first
    EPS_FRACTION of ``patients``, then EPS_END."""
    span = EPS_FRACTION * patients
    return EPS_END if k >= span else EPS_START + (EPS_END - EPS_START) * k / span


def greedy(Q: np.ndarray, admissible: np.ndarray | None) -> np.ndarray:
    """The greedy action per state (ties: the lowest action); among the admissible ones if given."""
    return (Q if admissible is None else np.where(admissible, Q, -np.inf)).argmax(1)


def q_learning(patients: int = PATIENTS, seed: int = 0, masked: bool = False,
               checkpoint_every: int = CHECKPOINT_EVERY, tables: dict | None = None, survival=None) -> dict:
    """Tabular Q-learning on the env's tables (module docstring). Returns the final released policy's exact
    ``survival``, ``train_return`` (mean return of the ``patients`` training episodes), ``curve`` [[patients,
    survival]] at every checkpoint, ``policy`` (the released greedy actions) and ``steps`` (env steps taken).
    ``tables``/``survival``: the env's tables and the exact evaluator (default: ``dppo.envs.icu_sepsis_exact``)."""
    if tables is None or survival is None:
        ex = _exact()
        tables, survival = tables or ex.tables(), survival or ex.survival
    P, R, d0 = np.asarray(tables["P"]), np.asarray(tables["R"]), np.asarray(tables["d0"], np.float64)
    S, A = P.shape[:2]
    horizon = int(tables.get("horizon", 500))
    terminal = set(int(s) for s in tables["terminal"])
    adm_table = np.asarray(tables["admissible"], bool)
    adm_table = adm_table | ~adm_table.any(1, keepdims=True)         # a state with no admissible action: all are
    acts = [list(np.flatnonzero(adm_table[s])) if masked else list(range(A)) for s in range(S)]
    # per (s, a): the next states with positive probability, their cumulative probabilities and rewards
    nxt, cdf, rew = [], [], []
    for s in range(S):
        ns, cs, rs = [], [], []
        for a in range(A):
            idx = np.flatnonzero(P[s, a] > 0)
            if idx.size == 0:
                idx = np.array([s])
            c = np.cumsum(P[s, a, idx])
            ns.append(idx.tolist())
            cs.append((c / c[-1]).tolist())
            rs.append(R[s, a, idx].tolist())
        nxt.append(ns)
        cdf.append(cs)
        rew.append(rs)
    d0_cdf = (np.cumsum(d0) / d0.sum()).tolist()
    Q = [[Q0] * A for _ in range(S)]
    for s in terminal:
        Q[s] = [0.0] * A
    N = [[0] * A for _ in range(S)]
    rng = np.random.default_rng(seed)
    block, pos = [], 0

    def release() -> np.ndarray:
        return greedy(np.array(Q), adm_table if masked else None)

    curve, total, steps = [], 0.0, 0
    for k in range(patients):
        eps = epsilon_at(k, patients)
        if pos + 3 * horizon + 1 > len(block):         # enough uniforms for a whole episode
            block, pos = rng.random(1 << 16).tolist(), 0
        s = min(bisect_right(d0_cdf, block[pos]), S - 1)
        pos += 1
        ret = 0.0
        for _ in range(horizon):
            q, ok = Q[s], acts[s]
            u = block[pos]
            if u < eps:                                   # explore: uniform over the (admissible) actions
                a = ok[int(block[pos + 1] * len(ok))]
            else:                                         # exploit: a greedy action, ties broken at random
                m = max([q[b] for b in ok])
                ties = [b for b in ok if q[b] == m]
                a = ties[int(block[pos + 1] * len(ties))]
            j = bisect_right(cdf[s][a], block[pos + 2])
            pos += 3
            c = cdf[s][a]
            j = min(j, len(c) - 1)
            s2, r = nxt[s][a][j], rew[s][a][j]
            ret += r
            steps += 1
            n = N[s][a] + 1
            N[s][a] = n
            if s2 in terminal:
                target = r
            else:
                q2 = Q[s2]
                target = r + max([q2[b] for b in acts[s2]])
            q[a] += (target - q[a]) * n ** -STEP_POWER
            s = s2
            if s in terminal:
                break
        total += ret
        if checkpoint_every and (k + 1) % checkpoint_every == 0 and k + 1 < patients:
            curve.append([k + 1, float(survival(release()))])
    policy = release()
    final = float(survival(policy))
    curve.append([patients, final])
    return {"survival": final, "train_return": total / patients, "curve": curve, "policy": policy.tolist(),
            "steps": steps, "patients": patients}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--q-learning", action="store_true", help="run tabular Q-learning (else: the exact rows only)")
    ap.add_argument("--masked", action="store_true", help="Q-learning over the env's admissible actions")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--patients", type=int, default=PATIENTS)
    ap.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY,
                    help="patients between exact evaluations of the greedy policy (the survival curve)")
    ap.add_argument("--result", help="write the results (a JSON list, one per seed, with wall and peak memory)")
    args = ap.parse_args(argv)
    if not args.q_learning:
        rows = exact_rows()
        print(f"{ENV_ID}, horizon 500: survival (exact, on the env's tables)\n")
        print("| policy | survival |\n|---|---|")
        for name, v in rows.items():
            print(f"| {name} | {v:.4f} |")
        return
    import resource

    out = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        res = q_learning(args.patients, seed, args.masked, args.checkpoint_every)
        res.update(seed=seed, masked=args.masked, wall_s=round(time.perf_counter() - t0, 2),
                   peak_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
        print(f"Q-learning{' (masked)' if args.masked else ''} seed {seed}: survival {res['survival']:.4f}, "
              f"training patients' mean return {res['train_return']:.4f}, {res['steps']:,} steps, "
              f"{res['wall_s']:.1f} s", flush=True)
        out.append(res)
    if args.result:
        with open(args.result, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
