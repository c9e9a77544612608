"""Correlated noise across rounds against independent noise, side by side on the same seeds.

(a) ``--part noise``: the noise statistic, exact. For a stream of T releases, each user in E of them (DP-PG: E = 1;
DP-PPO: E = epochs, consecutive), every factorization calibrated to the same (eps, delta): the sensitivity factor
sqrt(B_E(c)), the std of one release's noise and the RMS over the stream of the prefix-sum (SGD) or momentum
workload's noise, each relative to independent noise (``dppo.privacy.factorizations``); a Monte Carlo column
draws the streams through ``NoiseStream`` (the learners' code) and checks the exact prefix ratio.

(b) ``--part learn``: CartPole runs through ``dppo.train`` with ``privacy.noise_correlation`` off and on (the
privacy context is built here as the builder builds it, seeded noise, plus the ``CorrelatedNoise`` option), final
evaluation return per seed. ``--algo ppo``: ``+experiment=cartpole_dp_ppo`` (Adam: the measured answer for
Adam); ``--algo pg``: ``+experiment=cartpole_dp_pg`` (SGD with momentum 0.9: the momentum workload).

    python scripts/bench_correlated_noise.py --part noise
    python scripts/bench_correlated_noise.py --part learn --algo ppo --eps 5 1 --seeds 100 101 102 --bands 4 16
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SEEDED_NOTE, mean_std, worker_init  # noqa: E402

EXPERIMENTS = {"ppo": "cartpole_dp_ppo", "pg": "cartpole_dp_pg"}


def noise_rows(T: int, E: int, bands: list[int], momentum: float, trials: int, seed: int) -> list[str]:
    """One markdown row per factorization: exact ratios to independent noise and a Monte Carlo prefix ratio."""
    import torch

    from dppo.privacy.correlated import NoiseStream
    from dppo.privacy.factorizations import (factorization, marginal_variances, participation_norm_sq,
                                             prefix_error_variances, workload_coefficients)
    from dppo.privacy.noise import NoiseSource

    base_b = participation_norm_sq([1.0], E)
    base_prefix = prefix_error_variances([1.0], T, momentum)
    rows = []
    for kind in ("banded_sqrt", "banded"):
        for b in bands:
            c = factorization(kind, b, T, E, momentum)
            scale = math.sqrt(participation_norm_sq(c, E) / base_b)       # sigma_corr / sigma_indep
            per_release = scale * math.sqrt(marginal_variances(c, T)[-1])
            prefix = prefix_error_variances(c, T, momentum)
            rms = scale * math.sqrt(prefix.sum() / base_prefix.sum())
            final = scale * math.sqrt(prefix[-1] / base_prefix[-1])
            stream = NoiseStream(c, NoiseSource(seed))
            w = torch.stack([stream.draw((trials,)) for _ in range(T)]).numpy()
            a = workload_coefficients(T, momentum)
            work = np.array([a[:t + 1][::-1] @ w[:t + 1] for t in range(T)])
            mc = scale * math.sqrt(float((work ** 2).mean(1).sum()) / base_prefix.sum())
            rows.append(f"| {T} | {E} | {momentum:g} | {kind} | {b} | {math.sqrt(participation_norm_sq(c, E)):.4f} | "
                        f"{per_release:.4f} | {rms:.4f} | {final:.4f} | {mc:.4f} |")
    return rows


def noise_table(trials: int, seed: int) -> str:
    out = ["## (a) The noise statistic (exact; same (eps, delta) everywhere, independent noise = 1)", "",
           "sens: sqrt(B_E(c)) (independent: sqrt(E)); release: one release's noise std; prefix RMS / final: the "
           "workload's noise std, RMS over the stream / after the last release; MC: the prefix RMS from "
           f"{trials} streams drawn by NoiseStream.", "",
           "| T | E | momentum | factorization | bands | sens factor | release | prefix RMS | final | MC prefix RMS |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for T, E, mom in ((100, 1, 0.0), (100, 1, 0.9), (300, 6, 0.0)):
        out += noise_rows(T, E, [2, 4, 8, 16, 32], mom, trials, seed)
    return "\n".join(out) + "\n"


def one_run(algo: str, eps: float, seed: int, correlation, extra: list[str]) -> float:
    import dppo
    from dppo.privacy import NoiseSource, PrivacyContext
    from dppo.privacy.accountants import make_accountant

    privacy = PrivacyContext(eps, 1e-5, accountant=make_accountant("parallel"), noise=NoiseSource(seed))
    if correlation is not None:
        privacy.noise_correlation = correlation
    overrides = [f"+experiment={EXPERIMENTS[algo]}", f"seed={seed}", f"eps={eps}", "privacy.secure_rng=false",
                 "progress=false", *extra]
    summary = dppo.train(overrides, privacy=privacy)
    assert abs(summary["epsilon_spent"] - eps) < 1e-9, summary["epsilon_spent"]
    return float(summary["final_return"])


def learn_table(algo: str, eps_values, seeds, arms, extra) -> str:
    from dppo.privacy.correlated import CorrelatedNoise

    rounds = {"ppo": 50, "pg": 100}[algo]
    title = f"{EXPERIMENTS[algo]} {' '.join(extra)}".strip()
    out = [f"## (b) Learning: {title}, final evaluation return, seeds {', '.join(map(str, seeds))}",
           "", "| eps | noise | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | std | s |",
           "|---|---|" + "---|" * (len(seeds) + 3)]
    for eps in eps_values:
        for kind, bands, mom in arms:
            corr = None if kind == "none" else CorrelatedNoise(kind, bands, momentum=mom, rounds=rounds)
            started = time.perf_counter()
            finals = [one_run(algo, eps, s, corr, extra) for s in seeds]
            m, sd = mean_std(finals)
            name = "independent" if corr is None else f"{kind} b={bands}" + (f" momentum {mom:g}" if mom else "")
            out.append(f"| {eps:g} | {name} | " + " | ".join(f"{f:.1f}" for f in finals) +
                       f" | {m:.1f} | {sd:.1f} | {time.perf_counter() - started:.0f} |")
            print(out[-1], file=sys.stderr, flush=True)
    return "\n".join(out) + "\n\n" + SEEDED_NOTE + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("noise", "learn", "all"), default="noise")
    parser.add_argument("--algo", choices=tuple(EXPERIMENTS), default="ppo")
    parser.add_argument("--eps", type=float, nargs="+", default=[5.0, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102])
    parser.add_argument("--arms", nargs="+", default=["none", "banded:4", "banded:16"],
                        help="noise arms: none, or KIND:BANDS[:MOMENTUM] (KIND banded | banded_sqrt)")
    parser.add_argument("--trials", type=int, default=4000, help="Monte Carlo streams of the noise table")
    parser.add_argument("--out", help="also write the markdown to this file")
    parser.add_argument("overrides", nargs="*", help="extra config overrides of the learning runs")
    args = parser.parse_args(argv)
    worker_init()
    import torch

    torch.set_num_threads(1)
    arms = []
    for arm in args.arms:
        parts = arm.split(":")
        arms.append((parts[0], int(parts[1]) if len(parts) > 1 else 1, float(parts[2]) if len(parts) > 2 else 0.0))
    text = "# Correlated noise across rounds against independent noise\n\n"
    if args.part in ("noise", "all"):
        text += noise_table(args.trials, 0) + "\n"
    if args.part in ("learn", "all"):
        text += learn_table(args.algo, args.eps, args.seeds, arms, args.overrides)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
