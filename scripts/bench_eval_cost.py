"""Cost of the default intermediate evaluations (``eval_every=auto``) against evaluating at the end only
(``eval_every=null``), measured side by side in one process.

For each config (the default ``python train.py``: DP-NPG on CartPole, 200 rounds; DP-PPO on CartPole, 100
rounds; DP-UBEV on RiverSwim, 10 rounds of 1,000 episodes) it runs the whole run through ``dppo.train`` into
a temporary run directory (TensorBoard + progress.csv, as a CLI run) once per mode, ``--repeats`` times in
alternating order after an untimed warm-up run, with seeded noise so that both modes train the very same
policy (the evaluations draw from public episodes nothing else uses): the difference is the evaluations
alone. Prints, per mode, the best wall time and the best CPU time of the process (``time.process_time``:
less sensitive than wall time to other processes sharing the machine) and the ratios auto / end only; and,
measured inside the ``auto`` runs, the seconds spent in the intermediate evaluations, their share of that
run's wall time, and the in-run ratio wall / (wall - intermediate evaluations), the least noisy figure
(the same run, the same trajectory, without its intermediate evaluations).

    python scripts/bench_eval_cost.py [--repeats 2] [--only dp_ppo]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import dppo  # noqa: E402
from dppo.training.callbacks import Callback, eval_interval  # noqa: E402

CONFIGS = {
    "python train.py (dp_npg, CartPole)": [],
    "dp_ppo (CartPole)": ["algo=dp_ppo"],
    "dp_ubev (RiverSwim)": ["algo=dp_ubev", "env=riverswim"],
}
COMMON = ["progress=false", "privacy.secure_rng=false"]


class EvalTimer(Callback):
    """Times every ``learner.evaluate`` call of the run (the last one is the final evaluation)."""

    def __init__(self):
        self.calls: list[float] = []

    def on_train_start(self, trainer):
        learner = trainer.learner
        inner = learner.evaluate

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = inner(*a, **k)
            self.calls.append(time.perf_counter() - t0)
            return out
        learner.evaluate = timed
        self.rounds = learner.num_rounds


def run(overrides: list[str], every: str) -> tuple[float, float, EvalTimer, dict]:
    timer = EvalTimer()
    d = tempfile.mkdtemp(prefix="bench_eval_")
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        summary = dppo.train([*overrides, *COMMON, f"eval_every={every}"], run_dir=os.path.join(d, "run"),
                             callbacks=[timer])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return wall, cpu, timer, summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default=None, help="run the configs whose name contains this text")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'config':35s} {'rounds':>6s} {'evals':>5s} | {'wall s: end only':>16s} {'auto':>6s} {'ratio':>6s} | "
          f"{'cpu s: end only':>15s} {'auto':>6s} {'ratio':>6s} | {'in evals s':>10s} {'share':>6s} {'in-run':>6s}")
    for name, overrides in CONFIGS.items():
        if args.only and args.only not in name:
            continue
        run(overrides, "null")      # warm-up, untimed: the first run pays one-off start-up costs (imports, JIT)
        wall = {"null": float("inf"), "auto": float("inf")}
        cpu = dict(wall)
        inside, share, sha = [], [], {}
        for rep in range(args.repeats):
            for mode in (("null", "auto") if rep % 2 == 0 else ("auto", "null")):
                w, c, timer, summary = run(overrides, mode)
                wall[mode], cpu[mode] = min(wall[mode], w), min(cpu[mode], c)
                sha[mode] = summary.get("policy_sha256"), summary.get("final_return"), summary.get("ledger")
                if mode == "auto":
                    intermediate = sum(timer.calls[:-1])      # the last call is the final evaluation
                    inside.append(intermediate)
                    share.append(intermediate / w)
                    evals, rounds = len(timer.calls), timer.rounds
        best = min(range(len(share)), key=share.__getitem__)
        same = "same policy" if sha["null"] == sha["auto"] else "POLICIES DIFFER"
        print(f"{name:35s} {rounds:6d} {evals:5d} | {wall['null']:16.2f} {wall['auto']:6.2f} "
              f"{wall['auto'] / wall['null']:6.3f} | {cpu['null']:15.2f} {cpu['auto']:6.2f} "
              f"{cpu['auto'] / cpu['null']:6.3f} | {inside[best]:10.3f} {100 * share[best]:5.2f}% "
              f"{1 / (1 - share[best]):6.3f}  (every {eval_interval('auto', rounds)} rounds; {same})", flush=True)


if __name__ == "__main__":
    main()
