"""``python -m dppo.audit [--fast | --trials N] [--only NAME ...] [--out FILE]``: run the privacy audit, print the table.

Exit status 1 if any mechanism's eps_LB exceeds its claimed eps (a privacy bug), else 0.
"""
from __future__ import annotations

import argparse
import sys

import torch

from dppo.audit.run import markdown, run_suite, suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dppo.audit", description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="few trials (seconds), as in the default test suite")
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"mechanisms: {[s.name for s in suite()]}")
    parser.add_argument("--trials", type=int, help="trials per audit (overrides --fast and the full counts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = [s.name for s in suite()]
    if args.only and set(args.only) - set(names):
        print(f"unknown mechanism(s) {sorted(set(args.only) - set(names))}; choose from {names}", file=sys.stderr)
        return 2
    if args.trials is not None and args.trials < 8:
        print(f"--trials must be >= 8, got {args.trials}", file=sys.stderr)
        return 2
    rows = run_suite(fast=args.fast, only=args.only, seed=args.seed, trials=args.trials,
                     progress=lambda r: print(f"{r.mechanism}: claimed eps {r.claimed_eps:.4g}, eps_LB {r.eps_lb:.3f}, "
                                              f"{r.trials} trials, {r.seconds:.1f} s", file=sys.stderr, flush=True))
    text = markdown(rows, reduced_trials=args.fast or args.trials is not None)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
