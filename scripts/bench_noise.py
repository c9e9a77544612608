"""Time of one Gaussian noise draw, seeded generator vs the OS CSPRNG (``privacy.secure_rng``), side by side.

Usage: python scripts/bench_noise.py [--dim 4610] [--repeats 200]   (4,610 = the CartPole 2x64 MLP's parameters)
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dppo.privacy.noise import NoiseSource


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=4610)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    seeded, secure = NoiseSource(0, secure=False), NoiseSource(0, secure=True)
    a = median_ms(lambda: seeded.gaussian((args.dim,), 1.0), args.repeats)
    b = median_ms(lambda: secure.gaussian((args.dim,), 1.0), args.repeats)
    print(f"one {args.dim:,}-dim Gaussian draw (median of {args.repeats}, one thread):")
    print(f"  seeded torch generator  {a:.3f} ms")
    print(f"  OS CSPRNG (secrets)     {b:.3f} ms  ({b / a:.1f}x)")


if __name__ == "__main__":
    main()
