"""Benchmark DP-GFA (Algorithm 2 on ContextBits): `python scripts/bench_gfa.py`.

Prints (1) the time of one policy update (score of all f + Gumbel-max + greedy policy) and of one
batch's incremental loss update vs |F| in {243, 1e3, 1e4, 1e5}; (2) the update time vs history length
(it must not grow: the loss is kept as a running sufficient statistic); (3) the wall time of a full
private run with |F| = 1e5 and K = 1000 episodes (target < 60 s), split into class construction,
sensitivity computation and training.
"""
from __future__ import annotations

import argparse
import time

import torch

from dppo.algos.gfa import GFAOutcomeLearner
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.context_bits import ContextBitsMDP
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant


def make(size, episodes, batch_size=None, sensitivity="class", eps=8.0):
    privacy = PrivacyContext(eps, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(0))
    return GFAOutcomeLearner(ContextBitsMDP("hard"), privacy, OnePassUserSampler(1), seed=0, episodes=episodes,
                             batch_size=batch_size, class_size=size, sensitivity=sensitivity)


def timed_round(learner, r):
    """(policy-update seconds, play + incremental-update seconds) of one round."""
    t0 = time.perf_counter()
    score = learner.score()
    learner.current, _ = learner._select(r, score)
    learner._set_policy(learner.current)
    t1 = time.perf_counter()
    n = min(learner.B, learner.K - learner.episodes_done)
    learner.sampler.take(n)
    learner.play_and_record(n)
    learner.episodes_done += n
    return t1 - t0, time.perf_counter() - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="243,1000,10000,100000")
    ap.add_argument("--full-size", type=int, default=100_000)
    ap.add_argument("--full-episodes", type=int, default=1000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("## time per policy update vs |F| (batch B = 63, median of 5 rounds)")
    print("| |F| | policy update (ms) | batch loss update, 63 episodes (ms) |")
    print("|---|---|---|")
    for size in [int(s) for s in args.sizes.split(",")]:
        learner = make(size, episodes=1000, batch_size=63, sensitivity="worst_case")
        times = [timed_round(learner, r) for r in range(5)]
        upd = sorted(t[0] for t in times)[2] * 1e3
        dat = sorted(t[1] for t in times)[2] * 1e3
        print(f"| {size} | {upd:.2f} | {dat:.1f} |", flush=True)
    print("\n## time per policy update vs history length (|F| = 1e4, B = 1)")
    print("| episodes so far | policy update (ms) | one-episode loss update (ms) |")
    print("|---|---|---|")
    learner = make(10_000, episodes=2001, batch_size=1, sensitivity="worst_case")
    for r in range(2001):
        u, d = timed_round(learner, r)
        if r in (10, 100, 1000, 2000):
            print(f"| {r} | {u * 1e3:.2f} | {d * 1e3:.2f} |", flush=True)
    print(f"\n## full private run: |F| = {args.full_size}, K = {args.full_episodes} (B = c K^(3/5), zCDP, eps = 8)")
    t0 = time.perf_counter()
    learner = make(args.full_size, episodes=args.full_episodes, sensitivity="worst_case")
    t1 = time.perf_counter()
    sens = learner.residual_sensitivity("class")
    t2 = time.perf_counter()
    for r in range(learner.num_rounds):
        learner.train_round(r)
    t3 = time.perf_counter()
    print(f"class + learner construction {t1 - t0:.1f} s; exact class sensitivity ({sens:.4g}) {t2 - t1:.1f} s; "
          f"training {learner.num_rounds} rounds of B = {learner.B}: {t3 - t2:.1f} s; total {t3 - t0:.1f} s")
    learner = make(args.full_size, episodes=args.full_episodes, batch_size=1, eps=None, sensitivity="worst_case")
    t4 = time.perf_counter()
    for r in range(learner.num_rounds):
        learner.train_round(r)
    print(f"non-private, B = 1 ({learner.num_rounds} updates, |F| = {args.full_size}): "
          f"{time.perf_counter() - t4:.1f} s")


if __name__ == "__main__":
    main()
