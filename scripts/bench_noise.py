"""Cost of secure (OS CSPRNG) noise against seeded noise, per round, measured side by side in one run.

For each config (the default ``python train.py``: DP-NPG on CartPole; and a DP-PG round) it builds the
run twice - ``privacy.secure_rng=true`` (the default) and ``false`` - and times ``rounds`` rounds of each,
interleaved, plus the time spent inside the noise source's draws. Prints ms per round and the ratio.

    python scripts/bench_noise.py [--rounds 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import dppo  # noqa: E402
from dppo.build import build  # noqa: E402

CONFIGS = {"python train.py (dp_npg, cartpole)": [], "dp_pg (cartpole)": ["algo=dp_pg"]}


class TimedNoise:
    """Wraps a NoiseSource and accumulates the seconds spent drawing."""

    def __init__(self, inner):
        self.inner, self.seconds, self.draws = inner, 0.0, 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in ("gaussian", "laplace", "gumbel", "uniform"):
            return attr

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = attr(*a, **k)
            self.seconds += time.perf_counter() - t0
            self.draws += 1
            return out
        return timed


def trainer_for(overrides, secure: bool, rounds: int):
    cfg = dppo.make_config([*overrides, f"privacy.secure_rng={str(secure).lower()}", f"rounds={rounds}",
                            "progress=false", "eval_episodes=0"])
    t = build(cfg, None)
    for _ in range(3):                       # warm-up: first calls pay torch / OS start-up costs
        t.privacy.noise.gaussian((4096,), 1.0)
    t.privacy.noise = TimedNoise(t.privacy.noise)
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'config':38s} {'mode':9s} {'ms/round':>9s} {'noise ms/round':>15s}")
    for name, overrides in CONFIGS.items():
        runs = {mode: trainer_for(overrides, mode == "secure", args.rounds) for mode in ("secure", "seeded")}
        wall = {mode: 0.0 for mode in runs}
        for r in range(args.rounds):            # interleaved: both modes see the same machine load
            for mode, t in runs.items():
                t0 = time.perf_counter()
                t.learner.train_round(r)
                wall[mode] += time.perf_counter() - t0
        for mode, t in runs.items():
            noise_ms = 1e3 * t.privacy.noise.seconds / args.rounds
            print(f"{name:38s} {mode:9s} {1e3 * wall[mode] / args.rounds:9.2f} {noise_ms:15.3f}")
        extra = (runs["secure"].privacy.noise.seconds - runs["seeded"].privacy.noise.seconds) / args.rounds
        print(f"{name:38s} secure noise costs {1e3 * extra:.3f} ms more per round "
              f"({100 * extra / (wall['seeded'] / args.rounds):.2f}% of a seeded round)")
    journal_cost()


def journal_cost(n: int = 200) -> None:
    """The other per-round cost of a private run: one fsynced journal line (the round's take)."""
    import tempfile

    from dppo.training.journal import UserJournal

    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) as d:
        j = UserJournal(os.path.join(d, "users.journal"))
        j.open(0)
        t0 = time.perf_counter()
        for r in range(n):
            j.round = r
            j.take(range(10 * r, 10 * r + 10))
        dt = (time.perf_counter() - t0) / n
        j.close()
    print(f"user journal: {1e3 * dt:.2f} ms per round (one fsynced take of 10 users, disk of the checkout)")


if __name__ == "__main__":
    main()
