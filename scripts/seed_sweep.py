"""Final return of one configuration over several seeds, with the default secure noise (what the plain command gives).

    python scripts/seed_sweep.py --seeds 0-9                                  # python train.py, seeds 0-9
    python scripts/seed_sweep.py --seeds 100-102 +experiment=mountaincar_dp_npg algo.explore_bonus=5

Each seed runs as ``python train.py OVERRIDES seed=S`` would, through the Python API in this one process (no run
directory is written); one line per seed (final return, best round's mean return, the users' env steps, wall
seconds of the whole run and of its training loop), then the mean, min and max. The numbers of docs/npg_defaults.md are this script's output.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import dppo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import seed_list  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-2", help="seeds: 0-9, or 100,101,102")
    parser.add_argument("--out", help="also write the lines to this Markdown file (e.g. runs/reference/default_command.md)")
    parser.add_argument("overrides", nargs="*", help="train.py overrides (key=value)")
    args = parser.parse_args(argv)
    finals, lines = [], []
    for seed in seed_list(args.seeds):
        start = time.time()
        summary = dppo.train(list(args.overrides) + [f"seed={seed}", "progress=false"])
        finals.append(summary["final_return"])
        best = summary.get("diag", {}).get("best_round_return")
        best = "" if best is None else f" best_round={best:.1f}"
        steps = summary.get("env_steps", {}).get("users")
        steps = "" if steps is None else f" users_env_steps={steps / 1e6:.2f}M"
        lines.append(f"seed={seed} final={finals[-1]:.1f}{best} eps={summary['epsilon_spent']}{steps} "
                     f"t={time.time() - start:.1f}s train={summary.get('wall_time_s', float('nan')):.1f}s")
        print(lines[-1], flush=True)
    spread = f" std {statistics.pstdev(finals):.1f}" if len(finals) > 1 else ""
    lines.append(f"{' '.join(args.overrides) or '(defaults)'}: mean {statistics.mean(finals):.1f}{spread} "
                 f"min {min(finals):.1f} max {max(finals):.1f} over {len(finals)} seeds")
    print(lines[-1], flush=True)
    if args.out:
        command = " ".join(["python scripts/seed_sweep.py", *(argv if argv is not None else sys.argv[1:])])
        with open(args.out, "w") as f:
            f.write(f"# {command}\n\nWith the default secure noise (OS CSPRNG), one torch thread: final return on 20 "
                    f"held-out episodes, wall seconds of the run (t) and of its training loop (train).\n\n```\n"
                    + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
