"""DP-UBEV (Gaussian continual counters) beside UBEV and the paper's PUCB on RiverSwim: one JSON per run
under --out, then a section of runs/reference/tabular.md (between markers; the PUCB / UBEV grid above it
is scripts/reproduce_tabular.py's) and runs/reference/tabular_dp.png.

    python scripts/reproduce_dp_tabular.py --H 20 --T 100000 --seeds 0 1 2 3 4 --eps 1 5        # table rows
    python scripts/reproduce_dp_tabular.py --H 10 --T 1000000 --seeds 0 --eps 1 5                # ratio curve
    python scripts/reproduce_dp_tabular.py --report                                              # section + plot

Each run uses the real learners through the Python API (one fresh user per episode from the one-pass
sampler, releases in the ledger, eps from the zCDP accountant at delta = 1e-5). The noise is seeded
(``NoiseSource(seed, secure=False)``, the CLI's ``privacy.secure_rng=false``) so that runs reproduce.
Every run records its cumulative regret, count-error bound E and gate-open fraction after every round
(1000 episodes), so one run of length T gives the curve against t <= T (its counters are calibrated for
T, so the early part is slightly noisier than a run of that length would be).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import time

import torch

from dppo.algos.dp_ubev import DPUBEV
from dppo.algos.ucb import PUCB, UBEV
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.tabular import riverswim
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant

BEGIN, END = "<!-- dp_ubev section: scripts/reproduce_dp_tabular.py -->", "<!-- end dp_ubev section -->"


def run_one(H: int, algo: str, eps, seed: int, T: int, counter: str, pool: bool) -> dict:
    mdp = riverswim(horizon=H)
    accountant = "basic" if algo in ("ubev", "pucb") else "zcdp"
    privacy = PrivacyContext(eps, 1e-5, accountant=make_accountant(accountant), noise=NoiseSource(seed, secure=False))
    sampler = OnePassUserSampler(1000, seed=seed)
    common = dict(privacy=privacy, sampler=sampler, seed=seed, episodes=T, episodes_per_round=min(1000, T))
    if algo == "ubev":
        learner = UBEV(mdp, **common)
    elif algo == "pucb":
        learner = PUCB(mdp, **common)
    else:
        learner = DPUBEV(mdp, counter=counter, pool_steps=pool, **common)
    t0 = time.perf_counter()
    rounds, gate, E = [], [], []
    for r in range(learner.num_rounds):
        m = learner.train_round(r)
        rounds.append(learner.episodes_done)
        gate.append(m.get("counters/gate_open_fraction"))
        E.append(m.get("counters/error_bound"))
        if r % 100 == 99:
            print(f"  {algo} H={H} eps={eps} seed={seed}: {learner.episodes_done:,}/{T:,} episodes, "
                  f"regret {m['regret/cumulative']:,.0f}, {time.perf_counter() - t0:.0f} s", flush=True)
    wall = time.perf_counter() - t0
    cum = torch.cumsum(learner.episode_regret, 0)
    return {"H": H, "algo": algo, "eps": eps, "seed": seed, "T": T, "counter": counter, "pool": pool,
            "cumulative_regret": float(cum[-1]), "rounds": rounds, "curve": [float(cum[t - 1]) for t in rounds],
            "gate_open_fraction": gate, "E": E, "final_E": learner.count_error_bound(),
            "epsilon_spent": privacy.spent()[0], "delta": privacy.spent()[1], "wall_s": wall,
            "episodes_per_s": T / wall, "noise_std": learner.noise_std() if algo == "dp_ubev" else None}


def _tag(r):
    if r["algo"] == "ubev":
        return "ubev"
    if r["algo"] == "pucb":
        return f"pucb_eps{r['eps']:g}"
    eps = "exact" if r["eps"] is None else f"eps{r['eps']:g}"
    return f"dp_ubev_{eps}_{r['counter']}" + ("" if r["pool"] else "_perstep")


def run_grid(args) -> None:
    os.makedirs(args.out, exist_ok=True)
    configs = [("ubev", None)] * (not args.no_ubev) + [("pucb", e) for e in args.pucb_eps] + \
        [("dp_ubev", e) for e in args.eps]
    for T in args.T:
        for seed in args.seeds:
            for algo, eps in configs:
                spec = {"algo": algo, "eps": eps, "counter": args.counter, "pool": not args.per_step}
                path = os.path.join(args.out, f"riverswim_h{args.H}_{_tag(spec)}_s{seed}_T{T}.json")
                if os.path.exists(path):
                    continue
                res = run_one(args.H, algo, eps, seed, T, args.counter, not args.per_step)
                with open(path + ".tmp", "w") as f:
                    json.dump(res, f)
                os.replace(path + ".tmp", path)
                print(f"{os.path.basename(path)}: regret {res['cumulative_regret']:.1f} eps {res['epsilon_spent']:.3g} "
                      f"E {res['final_E']:.4g} {res['episodes_per_s']:.0f} ep/s", flush=True)


def bound_check(H: int, T: int, eps: float, seed: int = 0) -> list[str]:
    """Count-error bound E at episode T for every counter / layout, and the empirical fraction of the
    default counter's releases (every stream, every episode) outside its per-episode E, on the
    statistics of uniformly random RiverSwim episodes."""
    import numpy as np

    mdp = riverswim(horizon=H)
    rows = ["| learner | counter | statistics | E at T | releases checked | fraction outside E |", "|---|---|---|---|---|---|"]
    ctx = lambda: PrivacyContext(eps, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(seed, secure=False))
    pucb = PUCB(mdp, privacy=PrivacyContext(eps, accountant=make_accountant("basic"), noise=NoiseSource(seed)),
                episodes=T)
    rows.append(f"| pucb | laplace_tree | per step | {pucb.count_error_bound():.4g} (reference E_eps) | - | - |")
    for counter in ("laplace_tree", "gaussian_tree", "gaussian_sqrt"):
        for pool in (False, True):
            L = DPUBEV(mdp, privacy=ctx(), seed=seed, episodes=T, counter=counter, pool_steps=pool)
            rows.append(f"| dp_ubev | {counter} | {'pooled, cap 1' if pool else 'per step'} | "
                        f"{L.final_count_error_bound():.4g} | - | - |")
    L = DPUBEV(mdp, privacy=ctx(), seed=seed, episodes=T)
    g = torch.Generator().manual_seed(seed)
    pi = torch.randint(mdp.A, (T, H, mdp.S), generator=g)
    L.stats.reserve(T)
    outside = checked = 0
    for t in range(T):
        states, actions, rewards = mdp.episode_from_uniforms(pi[t].tolist(), mdp.uniforms(1, g)[0].tolist())
        L._feed(states, actions, rewards)
        err = np.abs(L.stats.released.numpy() - L.stats.counts.numpy())
        outside += int((err > L.count_error_bound()).sum())
        checked += err.size
    rows.append(f"| dp_ubev (default) | {L.counter_kind} | pooled, cap 1 | {L.count_error_bound():.4g} | "
                f"{checked:,} | {outside / checked:.2g} (beta = {L.beta:g}) |")
    return rows


def _mean_std(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd


def _at(r, t):
    """Cumulative regret of run r after t episodes (t a multiple of its round size)."""
    return r["curve"][r["rounds"].index(t)]


def report(args) -> None:
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(args.out, "riverswim_h*_T*.json")))]
    lines = [BEGIN, "", "## DP-UBEV (Gaussian continual counters) beside UBEV and PUCB, RiverSwim",
             "", "Produced by `python scripts/reproduce_dp_tabular.py` (see docs/tabular.md): delta = 1e-5, eps from "
             "the zCDP accountant, seeded noise (`privacy.secure_rng=false`). `E` = the count-error bound the learner "
             "uses at the last episode (exact release std x union quantile over the 4 S A T released quantities its "
             "plans read; PUCB: the reference's E_eps). Ratio = regret / UBEV's regret at the same T and seeds "
             "(UBEV per step, the paper's).", ""]
    bounds = os.path.join(args.out, "bounds.md")
    if os.path.exists(bounds):
        lines += ["### Count-error bounds (`--bound-check`)", "", open(bounds).read().strip(), ""]
    groups = sorted({(r["H"], r["T"]) for r in runs})
    for H, T in groups:
        sel = [r for r in runs if r["H"] == H and r["T"] == T]
        base = [r for r in sel if r["algo"] == "ubev"]
        lines += [f"### RiverSwim H = {H}, T = {T:,} episodes", "",
                  "| algo | eps | seeds | regret (mean +- std) | / UBEV | E at T | open gates at T | ep/s |",
                  "|---|---|---|---|---|---|---|---|"]
        for tag in sorted({_tag(r) for r in sel}, key=lambda t: (t != "ubev", t)):
            rs = [r for r in sel if _tag(r) == tag]
            seeds = [r["seed"] for r in rs]
            m, sd = _mean_std([r["cumulative_regret"] for r in rs])
            b = [r["cumulative_regret"] for r in base if r["seed"] in seeds]
            ratio = "-" if tag == "ubev" or len(b) != len(rs) else f"{m / _mean_std(b)[0]:.2f}"
            gate = rs[0]["gate_open_fraction"][-1]
            gate = "-" if gate is None else f"{sum(r['gate_open_fraction'][-1] for r in rs) / len(rs):.2f}"
            E = "-" if tag == "ubev" else f"{rs[0]['final_E']:.4g}"
            speed = sum(r["episodes_per_s"] for r in rs) / len(rs)
            eps = "-" if rs[0]["eps"] is None else f"{rs[0]['eps']:g}"
            lines.append(f"| {tag} | {eps} | {','.join(map(str, seeds))} | {m:,.1f} +- {sd:,.1f} | {ratio} | {E} | "
                         f"{gate} | {speed:,.0f} |")
        lines.append("")
    # ratio against t from the longest runs at each H
    curve_rows = []
    for H in sorted({r["H"] for r in runs}):
        T = max(r["T"] for r in runs if r["H"] == H)
        sel = [r for r in runs if r["H"] == H and r["T"] == T]
        base = [r for r in sel if r["algo"] == "ubev"]
        if not base:
            continue
        points = [t for t in (1000, 2000, 5000, 10 ** 4, 2 * 10 ** 4, 5 * 10 ** 4, 10 ** 5, 2 * 10 ** 5, 5 * 10 ** 5, 10 ** 6)
                  if t <= T]
        lines += [f"### Regret ratio to UBEV against t (runs of T = {T:,}, RiverSwim H = {H})", "",
                  "| algo | seeds | " + " | ".join(f"t={t:,}" for t in points) + " | crossover t (ratio <= 1.5 from t on) |",
                  "|---|---|" + "---|" * (len(points) + 1)]
        for tag in sorted({_tag(r) for r in sel if r["algo"] != "ubev"}):
            rs = [r for r in sel if _tag(r) == tag]
            seeds = [r["seed"] for r in rs]
            b = [r for r in base if r["seed"] in seeds]
            if len(b) != len(rs):
                continue
            ratio = lambda t: sum(_at(r, t) for r in rs) / max(1e-12, sum(_at(r, t) for r in b))
            ts = rs[0]["rounds"]                        # crossover: the ratio stays <= 1.5 from there on
            above = [t for t in ts if ratio(t) > 1.5]
            cross = ts[0] if not above else next((t for t in ts if t > above[-1]), None)
            cells = [f"{ratio(t):.2f}" for t in points]
            lines.append(f"| {tag} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " | "
                         + (f"{cross:,}" if cross else f"> {T:,}") + " |")
            curve_rows.append((H, tag, rs, b))
        lines.append("")
    lines += ["![DP-UBEV vs UBEV](tabular_dp.png)", "", END]
    text = open(args.md).read() if os.path.exists(args.md) else ""
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + text[text.index(END) + len(END):].lstrip("\n")
    with open(args.md, "w") as f:
        f.write(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
    _plot(curve_rows, args.png)
    print("\n".join(lines))


def _plot(curve_rows, png) -> None:
    if not curve_rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for H, tag, rs, b in curve_rows:
        t = rs[0]["rounds"]
        ratio = [sum(_at(r, x) for r in rs) / sum(_at(r, x) for r in b) for x in t]
        ax1.semilogx(t, ratio, label=f"{tag}, H={H} ({len(rs)} seeds)")
        if rs[0]["gate_open_fraction"][0] is not None:
            gate = [sum(r["gate_open_fraction"][i] for r in rs) / len(rs) for i in range(len(t))]
            ax2.semilogx(t, gate, label=f"{tag}, H={H}")
    ax1.axhline(1.5, color="k", ls=":", lw=0.8)
    ax1.set_xlabel("episodes t")
    ax1.set_ylabel("cumulative regret / UBEV's")
    ax1.set_title("regret ratio to UBEV")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("episodes t")
    ax2.set_ylabel("share of (s, a) with n~ > E")
    ax2.set_title("gate-open fraction (from released counts)")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def _eps(text: str):
    return None if text.lower() in ("none", "null") else float(text)


def main() -> None:
    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--H", type=int, default=20)
    p.add_argument("--T", type=int, nargs="+", default=[100000])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--eps", type=_eps, nargs="*", default=[1.0, 5.0], help="dp_ubev eps values ('none' = exact counts)")
    p.add_argument("--pucb-eps", type=float, nargs="*", default=[], help="PUCB eps values beside it")
    p.add_argument("--counter", default="gaussian")
    p.add_argument("--per-step", action="store_true", help="dp_ubev with per-step (unpooled) statistics")
    p.add_argument("--no-ubev", action="store_true")
    p.add_argument("--out", default="runs/tabular_dp")
    p.add_argument("--md", default="runs/reference/tabular.md")
    p.add_argument("--png", default="runs/reference/tabular_dp.png")
    p.add_argument("--report", action="store_true", help="only write the section and plot from existing runs")
    p.add_argument("--bound-check", action="store_true", help="E of every counter at --H, --T[0], eps=--eps[0], "
                   "and the empirical fraction of releases outside it (written to --out/bounds.md)")
    args = p.parse_args()
    if args.bound_check:
        rows = bound_check(args.H, args.T[0], args.eps[0])
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bounds.md"), "w") as f:
            f.write(f"RiverSwim H = {args.H}, T = {args.T[0]:,}, eps = {args.eps[0]:g}, delta = 1e-5\n\n" + "\n".join(rows) + "\n")
        print("\n".join(rows))
        return
    if not args.report:
        run_grid(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
