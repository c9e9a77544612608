"""The README's FrozenLake line against its non-private twin, seed by seed: runs/reference/frozenlake.md.

    python scripts/frozenlake_readme.py --jobs 2                   # seeds 0-9, every row
    python scripts/frozenlake_readme.py --seeds 100-102 --jobs 2   # the tuning seeds (the table goes to --out)

Rows (each seed as ``python train.py ROW seed=S`` would run it, with the default secure noise, the command as the
README prints it): the private line (``+experiment=frozenlake_dp_ppo``), its twin from the same file
(``eps=null``) and the twin at PPO's own defaults (``env.id=FrozenLake-v1 algo=ppo``, the README's line before
the file). The ratio is the private mean over the mean of the better twin. Final return: the run's public
evaluation (20 held-out episodes); wall seconds: the run's training loop. Run directories go to --runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from multiprocessing import Pool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, QUIET, default_jobs, mean_std, seed_list, train_in_process, worker_init  # noqa: E402

ROWS = {   # name -> train.py overrides
    "DP-PPO eps 5 (README)": ["+experiment=frozenlake_dp_ppo"],
    "PPO, the same file (eps=null)": ["+experiment=frozenlake_dp_ppo", "eps=null"],
    "PPO, its own defaults": ["env.id=FrozenLake-v1", "algo=ppo"],
}
PRIVATE = "DP-PPO eps 5 (README)"


def _job(item: tuple[str, list[str], int, str]) -> tuple[str, int, dict | None]:
    name, overrides, seed, path = item
    _, rc, _ = train_in_process([*overrides, *QUIET, f"seed={seed}"], path)
    if rc:
        return name, seed, None
    with open(os.path.join(path, "summary.json")) as f:
        s = json.load(f)
    return name, seed, {"final": s["final_return"], "wall": s.get("wall_time_s"), "eps": s.get("epsilon_spent")}


def table(results: dict, seeds: list[int], command: str) -> str:
    means = {n: mean_std([results[n][s]["final"] for s in seeds if results[n].get(s)])[0] for n in ROWS}
    twin = max((n for n in ROWS if n != PRIVATE), key=means.get)
    lines = [f"# {command}", "",
             "With the default secure noise (OS CSPRNG), one torch thread a run: final return on 20 held-out episodes "
             "(the run's public evaluation), wall seconds of the training loop.", "",
             "| seed | " + " | ".join(ROWS) + " |", "|---|" + "---|" * len(ROWS)]
    for s in seeds:
        cells = []
        for n in ROWS:
            r = results[n].get(s)
            cells.append("failed" if r is None else f"{r['final']:.2f} ({r['wall']:.0f} s)")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    cells = []
    for n in ROWS:
        finals = [results[n][s]["final"] for s in seeds if results[n].get(s)]
        walls = [results[n][s]["wall"] for s in seeds if results[n].get(s)]
        m, sd = mean_std(finals)
        cells.append(f"**{m:.3f}** (std {sd:.3f}, min {min(finals):.2f}; {min(walls):.0f}-{max(walls):.0f} s)")
    lines.append("| mean | " + " | ".join(cells) + " |")
    ratio = means[PRIVATE] / means[twin] if means[twin] > 0 else float("nan")
    lines += ["", f"Ratio: {PRIVATE} {means[PRIVATE]:.3f} / the better twin ({twin}) {means[twin]:.3f} = "
                  f"**{ratio:.2f}** (target >= 0.5).", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-9", help="seeds: 0-9, or 100,101,102")
    ap.add_argument("--jobs", type=int, default=default_jobs(), help="runs at a time (one thread each)")
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs", "frozenlake_readme"), help="run directories")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "reference", "frozenlake.md"))
    args = ap.parse_args(argv)
    seeds = seed_list(args.seeds)
    items = [(n, ov, s, os.path.join(args.runs, f"{i}_s{s}")) for i, (n, ov) in enumerate(ROWS.items()) for s in seeds]
    results = {n: {} for n in ROWS}
    with Pool(args.jobs, initializer=worker_init) as pool:
        for name, seed, r in pool.imap_unordered(_job, items):
            results[name][seed] = r
            print(f"{name} seed={seed}: " + ("failed" if r is None else f"final={r['final']:.2f} "
                                                                        f"train={r['wall']:.1f}s"), flush=True)
    command = " ".join(["python scripts/frozenlake_readme.py", *(argv if argv is not None else sys.argv[1:])])
    text = table(results, seeds, command)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
