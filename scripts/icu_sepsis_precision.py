"""How precise must a learner's per-treatment estimates be on ICU-Sepsis? (a script beside the suite, not part of
the package; ``pip install -e ".[icu]"``).

A tabular learner, private or not, ends by choosing in each state the treatment with the highest estimated value.
This script measures what the estimates' errors cost the patients, on the env's own tables, with every other error
removed: the targets are the optimal values themselves (value iteration on the tables, masked to the admissible
treatments) and the visit counts are known exactly: an oracle no learner has, so its numbers are a generous
reference for any learner of this kind (not a proof for every algorithm).

1. The patients: ``--patients`` (200,000) episodes treated uniformly among the admissible treatments, sampled from
   the tables (seeds 100-102: the tuning seeds). For each admissible pair (s, a) of a state with a choice, its
   *first visits*: the patients who took a in s, each counted once (at most ``--pairs`` such pairs per patient, in
   the order the patient met them): N(s, a).
2. Sampling only (no privacy): each pair's estimate is the mean over its first visits of the one-step target
   r + V*(s'), so its error is the sampling error of N(s, a) patients.
3. Plus the error a Gaussian release of the per-pair sums adds: c xi / N(s, a), xi ~ N(0, 1). A release in which
   each patient adds one coordinate to at most k pairs (values in [0, 1], replace-one) has noise std z sqrt(2 k),
   z the analytic Gaussian noise multiplier of (eps, delta): c = z sqrt(2 k) (a release that also counts N adds
   more).
4. Survival: the exact expected return of the greedy policy on the tables at the env's horizon (500 steps), mean
   over the seeds; optimal 0.8751, random 0.7801, clinicians 0.7818.

    python scripts/icu_sepsis_precision.py                  # seeds 100-102, 200,000 patients, k = 8
    python scripts/icu_sepsis_precision.py --seeds 0 1 2 --pairs 4 --c 2 4 8

The extra error is drawn from numpy's generator (an analysis of precision: nothing here is released).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def optimal_q(t: dict, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q*[s, a] at the first step over the horizon, admissible treatments only (-inf elsewhere); V*[s])."""
    P, r, live = np.asarray(t["P"], np.float64), np.asarray(t["r"]), np.asarray(t["live"])
    ok = np.asarray(t["admissible"], bool)
    ok = ok | ~ok.any(1, keepdims=True)
    V = np.zeros(r.shape[0])
    for _ in range(horizon):
        Q = np.where(ok, r + P @ V, -np.inf)
        V = np.where(live > 0, Q.max(1), 0.0)
    return Q, V


def episodes(t: dict, patients: int, rng, horizon: int = 500) -> tuple[np.ndarray, ...]:
    """Every step of ``patients`` episodes treated uniformly among the admissible treatments, sampled from the
    tables: flat arrays (patient, t, s, a, s', reward)."""
    P, R, d0, live = np.asarray(t["P"]), np.asarray(t["R"]), np.asarray(t["d0"]), np.asarray(t["live"])
    ok = np.asarray(t["admissible"], bool)
    ok = ok | ~ok.any(1, keepdims=True)
    S, A = ok.shape
    cum_p, cum_b, cum_d = np.cumsum(P, -1), np.cumsum(ok / ok.sum(1, keepdims=True), 1), np.cumsum(d0)
    s = np.minimum(np.searchsorted(cum_d, rng.random(patients), side="right"), S - 1)
    alive, steps = np.arange(patients), []
    for step in range(int(horizon)):
        if not len(alive):
            break
        st = s[alive]
        a = np.minimum((rng.random(len(alive))[:, None] > cum_b[st]).sum(1), A - 1)
        s2 = np.minimum((rng.random(len(alive))[:, None] > cum_p[st, a]).sum(1), S - 1)
        steps.append((alive, np.full(len(alive), step), st, a, s2, R[st, a, s2]))
        s[alive] = s2
        alive = alive[live[s2] > 0]
    return tuple(np.concatenate(col) for col in zip(*steps))


def first_visits(t: dict, V: np.ndarray, steps, pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """N[s, a]: the patients' first visits of the pairs of states with a choice (each patient's first ``pairs`` such
    pairs, in the order met), and Y[s, a]: the sums of their one-step targets r + V(s')."""
    user, step, s, a, s2, r = steps
    ok = np.asarray(t["admissible"], bool)
    S, A = ok.shape
    choice = (ok.sum(1) >= 2) & (np.asarray(t["live"]) > 0)
    keep = choice[s]
    user, step, s, a, s2, r = (x[keep] for x in (user, step, s, a, s2, r))
    pair = s * A + a
    order = np.lexsort((step, pair, user))                # by patient, pair, time
    head = np.ones(len(order), bool)
    head[1:] = (user[order][1:] != user[order][:-1]) | (pair[order][1:] != pair[order][:-1])
    firsts = order[head]
    firsts = firsts[np.lexsort((step[firsts], user[firsts]))]          # each patient's first visits, in time order
    u = user[firsts]
    rank = np.arange(len(u)) - np.searchsorted(u, u)
    firsts = firsts[rank < pairs]
    live = np.asarray(t["live"])
    y = r[firsts] + V[s2[firsts]] * live[s2[firsts]]
    N = np.bincount(pair[firsts], minlength=S * A).reshape(S, A).astype(np.float64)
    Y = np.bincount(pair[firsts], weights=y, minlength=S * A).reshape(S, A)
    return N, Y


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102])
    ap.add_argument("--patients", type=int, default=200_000)
    ap.add_argument("--pairs", type=int, default=8, help="k: pairs with a choice counted per patient")
    ap.add_argument("--c", type=float, nargs="*", default=[2, 4, 8])
    ap.add_argument("--eps", type=float, nargs="+", default=[1, 3, 5])
    ap.add_argument("--delta", type=float, default=1e-5)
    args = ap.parse_args(argv)
    try:
        from dppo.envs import icu_sepsis_exact as ex
    except ImportError:                                   # pragma: no cover
        sys.exit("icu-sepsis is not installed: pip install -e \".[icu]\"")
    from dppo.privacy.calibration import analytic_gaussian_sigma

    t = ex.tables()
    Q, V = optimal_q(t, ex.HORIZON)
    ok = np.isfinite(Q)
    errors = [(f"+ a release at eps {e:g} (c = {c:.2f})", c) for e in args.eps
              for c in [analytic_gaussian_sigma(e, args.delta, np.sqrt(2 * args.pairs))]]
    errors += [(f"+ a release error c = {c:g}", c) for c in args.c if c > 0]
    rows = {"exact optimal values (no error)": [], "sampling only (first visits)": []}
    rows.update({name: [] for name, _ in errors})
    visits = []
    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        N, Y = first_visits(t, V, episodes(t, args.patients, rng, ex.HORIZON), args.pairs)
        choice = ok & (ok.sum(1, keepdims=True) >= 2)
        visits.append(np.median(N[choice]))
        sampled = np.where(N > 0, Y / np.maximum(N, 1), Q)          # a pair nobody took keeps its exact value
        rows["exact optimal values (no error)"].append(ex.survival(np.where(ok, Q, -np.inf).argmax(1)))
        rows["sampling only (first visits)"].append(ex.survival(np.where(ok, sampled, -np.inf).argmax(1)))
        for name, c in errors:
            est = sampled + c * rng.standard_normal(Q.shape) / np.maximum(N, 1)
            rows[name].append(ex.survival(np.where(ok, est, -np.inf).argmax(1)))
    print(f"ICU-Sepsis, {args.patients:,} patients treated at random among the admissible treatments, seeds "
          f"{' '.join(map(str, args.seeds))}. Estimates of Q*(s, a) from each patient's first {args.pairs} pairs "
          f"with a choice (median first visits of such a pair: {np.mean(visits):.0f}); a release's c: one [0, 1] "
          f"value per pair, Delta_2 = sqrt(2 k) under replace-one, delta {args.delta:g}, N(s, a) known exactly\n")
    print("| estimates | survival of their greedy policy (exact), mean [min, max] |\n|---|---|")
    for name, vals in rows.items():
        print(f"| {name} | {np.mean(vals):.4f} [{min(vals):.4f}, {max(vals):.4f}] |")


if __name__ == "__main__":
    main()
