"""DP-UBEV (Gaussian continual counters) beside UBEV and the paper's PUCB on RiverSwim: one JSON per run
under --out, then a section of runs/reference/tabular.md (between markers; the PUCB / UBEV grid above it
is scripts/reproduce_tabular.py's) and runs/reference/tabular_dp.png.

    python scripts/reproduce_dp_tabular.py --H 20 --T 100000 --seeds 0 1 2 3 4 --eps 1 5        # table rows
    python scripts/reproduce_dp_tabular.py --H 10 --T 1000000 --seeds 0 1 2 3 4 --eps 1 5      # ratio curve
    python scripts/reproduce_dp_tabular.py --gym FrozenLake-v1:20:20000 Taxi-v4:20:300 --eps 1    # toy-text envs
    python scripts/reproduce_dp_tabular.py --report                                              # section + plot

Each run uses the real learners through the Python API (one fresh user per episode from the one-pass
sampler, releases in the ledger, eps from the zCDP accountant at delta = 1e-5). The noise is seeded
(``NoiseSource(seed, secure=False)``, the CLI's ``privacy.secure_rng=false``) so that runs reproduce.
Every run records its cumulative regret, count-error bound E and gate-open fraction after every round
(1000 episodes), so one run of length T gives the curve against t <= T - approximately: DP-UBEV's bound is
not anytime (its counters and union bound are calibrated for T), so the early part is noisier than a run of
that length would be (E at t = T/10 is ~1.14x; the report prints it); UBEV's curve is exact.
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


def run_gym(env_id: str, H: int, algo: str, eps, seed: int, T: int) -> dict:
    """One run on a toy-text gymnasium env through its exact model (``dppo.envs.tabular.from_gym``): the
    final greedy policy's exact expected return beside the optimal and the uniformly random policy's."""
    import gymnasium as gym

    from dppo.envs.tabular import from_gym

    mdp = from_gym(gym.make(env_id), H)
    privacy = PrivacyContext(eps, 1e-5, accountant=make_accountant("basic" if algo == "ubev" else "zcdp"),
                             noise=NoiseSource(seed, secure=False))
    common = dict(privacy=privacy, sampler=OnePassUserSampler(1000, seed=seed), seed=seed, episodes=T,
                  episodes_per_round=min(1000, T))
    learner = UBEV(mdp, **common) if algo == "ubev" else DPUBEV(mdp, **common)
    t0 = time.perf_counter()
    for r in range(learner.num_rounds):
        m = learner.train_round(r)
    wall = time.perf_counter() - t0
    native = lambda v: float(mdp.to_native_return(torch.tensor(v, dtype=torch.float64)))
    greedy = torch.as_tensor(learner.greedy_policy())
    uniform = torch.full((mdp.S, mdp.A), 1.0 / mdp.A, dtype=torch.float64)
    return {"env_id": env_id, "H": H, "algo": algo, "eps": eps, "seed": seed, "T": T, "S": mdp.S, "A": mdp.A,
            "cumulative_regret": float(learner.episode_regret.sum()), "greedy_return": native(mdp.policy_value(greedy)),
            "random_return": native(mdp.policy_value(uniform)), "optimal_return": native(learner.optimal),
            "last_round_return": m["diag/return"], "gate_open_fraction": m.get("counters/gate_open_fraction"),
            "final_E": learner.count_error_bound(), "epsilon_spent": privacy.spent()[0], "wall_s": wall}


def gym_rows(out: str) -> list[str]:
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "gym_*.json")))]
    if not runs:
        return []
    rows = ["### Discrete gymnasium envs (`--gym`, exact model, one seed)", "",
            "Expected H-step return (native units, exact policy evaluation) of the greedy policy after T episodes, "
            "beside the optimal policy's and the uniformly random policy's.", "",
            "| env | H | algo | eps | seed | T | greedy return | random policy | optimal | regret | E at T | "
            "open gates at T | wall (s) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        eps = "-" if r["eps"] is None else f"{r['eps']:g}"
        gate = "-" if r["gate_open_fraction"] is None else f"{r['gate_open_fraction']:.2f}"
        E = "-" if r["algo"] == "ubev" else f"{r['final_E']:.4g}"
        rows.append(f"| {r['env_id']} (S={r['S']}, A={r['A']}) | {r['H']} | {r['algo']} | {eps} | {r['seed']} | "
                    f"{r['T']:,} | {r['greedy_return']:.4g} | {r['random_return']:.4g} | {r['optimal_return']:.4g} | "
                    f"{r['cumulative_regret']:,.0f} | {E} | {gate} | {r['wall_s']:.0f} |")
    return rows + [""]


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


POINTS = (1000, 2000, 5000, 10 ** 4, 2 * 10 ** 4, 5 * 10 ** 4, 10 ** 5, 2 * 10 ** 5, 5 * 10 ** 5, 10 ** 6)


def _crossover(ts: list, ratio) -> str:
    """First t from which the ratio stays <= 1.5; if it is above 1.5 at the end, a log-log extrapolation
    of the ratio's last decade (or '> T' when it is not falling)."""
    above = [t for t in ts if ratio(t) > 1.5]
    if not above:
        return f"{ts[0]:,}"
    if above[-1] != ts[-1]:
        return f"{next(t for t in ts if t > above[-1]):,}"
    t1 = ts[-1]
    t0 = next((t for t in ts if t >= t1 / 10), ts[0])
    r0, r1 = ratio(t0), ratio(t1)
    if t0 == t1 or r1 >= r0:
        return f"> {t1:,} (not falling)"
    slope = math.log(r1 / r0) / math.log(t1 / t0)
    return f"> {t1:,} (extrapolated ~{t1 * (1.5 / r1) ** (1 / slope):,.3g})"


def _anytime_note(H: int, T: int, eps_values: list, runs: list) -> list[str]:
    """E at t inside a run planned for T beside E of a run planned for t: the bound is not anytime."""
    rows = ["| eps | t | E at t in the T = {:,} run | E at the end of a run of T = t | ratio |".format(T),
            "|---|---|---|---|---|"]
    mdp = riverswim(horizon=H)
    for eps in eps_values:
        rs = [r for r in runs if r["algo"] == "dp_ubev" and r["eps"] == eps and r["T"] == T]
        if not rs:
            continue
        for t in (10 ** 4, 10 ** 5):
            if t >= T or t not in rs[0]["rounds"]:
                continue
            inside = rs[0]["E"][rs[0]["rounds"].index(t)]
            ctx = PrivacyContext(eps, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(0, secure=False))
            alone = DPUBEV(mdp, privacy=ctx, seed=0, episodes=t, counter=rs[0]["counter"],
                           pool_steps=rs[0]["pool"]).final_count_error_bound()
            rows.append(f"| {eps:g} | {t:,} | {inside:.4g} | {alone:.4g} | {inside / alone:.2f} |")
    return rows


def _old_subsections(md: str, keep: set) -> dict:
    """Subsections (``### ...`` blocks) of the current section whose (H, T) has no run JSON in --out: kept
    as they are (labelled) so that regenerating one part does not drop the others."""
    if not os.path.exists(md):
        return {}
    text = open(md).read()
    if BEGIN not in text:
        return {}
    sec = text[text.index(BEGIN):text.index(END)]
    out = {}
    for block in sec.split("\n### ")[1:]:
        title = block.split("\n", 1)[0]
        for key in keep:
            if key in title:
                body = block.split("\n![DP-UBEV")[0]
                body = "\n".join(l for l in body.splitlines() if not l.startswith("(carried over"))
                out[title] = "### " + body.rstrip()
    return out


def report(args) -> None:
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(args.out, "riverswim_h*_T*.json")))]
    groups = sorted({(r["H"], r["T"]) for r in runs})
    # (H, T) groups of the previous section that have no JSON here are carried over (their titles)
    old_keys = {f"RiverSwim H = {H}, T = {T:,} episodes" for H, T in ((20, 10 ** 5), (10, 10 ** 6))
                if (H, T) not in groups}
    old_keys |= {f"(runs of T = {T:,}, RiverSwim H = {H})" for H, T in ((20, 10 ** 5), (10, 10 ** 6))
                 if (H, T) not in groups}
    bounds = os.path.join(args.out, "bounds.md")
    if not os.path.exists(bounds):
        old_keys.add("Count-error bounds")
    carried = _old_subsections(args.md, old_keys)
    lines = [BEGIN, "", "## DP-UBEV (Gaussian continual counters) beside UBEV and PUCB, RiverSwim",
             "", "Produced by `python scripts/reproduce_dp_tabular.py` (see docs/tabular.md): delta = 1e-5, eps from "
             "the zCDP accountant, seeded noise (`privacy.secure_rng=false`). `E` = the count-error bound the learner "
             "uses at the last episode (exact release std x union quantile over the 4 S A T released quantities its "
             "plans read; PUCB: the reference's E_eps). Ratio = regret / UBEV's regret at the same T and seeds "
             "(UBEV per step, the paper's); the per-seed column gives the range of the seeds' own ratios.", ""]
    if os.path.exists(bounds):
        lines += ["### Count-error bounds (`--bound-check`)", "", open(bounds).read().strip(), ""]
    for title, block in carried.items():
        if "Regret ratio" not in title:
            lines += [block, "", "(carried over from the previous regeneration: its run records / bounds are not in "
                      f"`{args.out}` this time)", ""]
    separate = []                                   # (H, tag, T, ratio) of every paired row: the plot's markers
    for H, T in groups:
        sel = [r for r in runs if r["H"] == H and r["T"] == T]
        base = [r for r in sel if r["algo"] == "ubev"]
        lines += [f"### RiverSwim H = {H}, T = {T:,} episodes", "",
                  "| algo | eps | seeds | regret (mean +- std) | / UBEV | per-seed ratio (min-max) | E at T | "
                  "open gates at T | ep/s |", "|---|---|---|---|---|---|---|---|---|"]
        for tag in sorted({_tag(r) for r in sel}, key=lambda t: (t != "ubev", t)):
            rs = [r for r in sel if _tag(r) == tag]
            seeds = [r["seed"] for r in rs]
            m, sd = _mean_std([r["cumulative_regret"] for r in rs])
            bmap = {r["seed"]: r["cumulative_regret"] for r in base}
            paired = tag != "ubev" and all(s in bmap for s in seeds)
            ratio = f"{m / _mean_std([bmap[s] for s in seeds])[0]:.2f}" if paired else "-"
            per = [r["cumulative_regret"] / bmap[r["seed"]] for r in rs] if paired else []
            per = f"{min(per):.2f}-{max(per):.2f}" if per else "-"
            gate = rs[0]["gate_open_fraction"][-1]
            gate = "-" if gate is None else f"{sum(r['gate_open_fraction'][-1] for r in rs) / len(rs):.2f}"
            E = "-" if tag == "ubev" else f"{rs[0]['final_E']:.4g}"
            speed = sum(r["episodes_per_s"] for r in rs) / len(rs)
            eps = "-" if rs[0]["eps"] is None else f"{rs[0]['eps']:g}"
            if paired:
                separate.append((H, tag, T, float(ratio)))
            lines.append(f"| {tag} | {eps} | {','.join(map(str, seeds))} | {m:,.1f} +- {sd:,.1f} | {ratio} | {per} | "
                         f"{E} | {gate} | {speed:,.0f} |")
        lines.append("")
    # ratio against t from the longest runs at each H
    curve_rows = []
    for H in sorted({r["H"] for r in runs}):
        T = max(r["T"] for r in runs if r["H"] == H)
        sel = [r for r in runs if r["H"] == H and r["T"] == T]
        base = [r for r in sel if r["algo"] == "ubev"]
        if not base:
            continue
        points = [t for t in POINTS if t <= T]
        head = "| algo | seeds | " + " | ".join(f"t={t:,}" for t in points)
        ratio_lines = [f"### Regret ratio to UBEV against t (runs of T = {T:,}, RiverSwim H = {H})", "",
                       head + " | crossover t (ratio <= 1.5 from t on) |", "|---|---|" + "---|" * (len(points) + 1)]
        gate_lines = [f"### Gate-open fraction and E against t (runs of T = {T:,}, RiverSwim H = {H})", "",
                      "Share of pooled (s, a) with `n~ > E` after t episodes (mean over the seeds; from released counts "
                      "only), and the count-error bound E the learner used at t.", "",
                      "| algo | quantity | " + " | ".join(f"t={t:,}" for t in points) + " |",
                      "|---|---|" + "---|" * len(points)]
        for tag in sorted({_tag(r) for r in sel if r["algo"] != "ubev"}):
            rs = [r for r in sel if _tag(r) == tag]
            bmap = {r["seed"]: r for r in base}
            rs = [r for r in rs if r["seed"] in bmap]
            if not rs:
                continue
            seeds = [r["seed"] for r in rs]
            b = [bmap[s] for s in seeds]
            ratio = lambda t, rs=rs, b=b: sum(_at(r, t) for r in rs) / max(1e-12, sum(_at(r, t) for r in b))
            ts = rs[0]["rounds"]
            cells = [f"{ratio(t):.2f}" for t in points]
            ratio_lines.append(f"| {tag} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " | "
                               + _crossover(ts, ratio) + " |")
            if rs[0]["gate_open_fraction"][0] is not None:
                idx = [ts.index(t) for t in points]
                gate_lines.append(f"| {tag} | open gates | " + " | ".join(
                    f"{sum(r['gate_open_fraction'][i] for r in rs) / len(rs):.2f}" for i in idx) + " |")
                gate_lines.append(f"| {tag} | E | " + " | ".join(f"{rs[0]['E'][i]:.4g}" for i in idx) + " |")
            curve_rows.append((H, tag, rs, b))
        lines += ratio_lines + [""] + gate_lines + [""]
        eps_values = sorted({r["eps"] for r in sel if r["algo"] == "dp_ubev" and r["eps"] is not None})
        note = _anytime_note(H, T, eps_values, sel) if T > 10 ** 4 else []
        if len(note) > 2:
            lines += [f"Not anytime: E at t in a run planned for T = {T:,} is larger than in a run planned for t "
                      "(the union quantile z covers 4 S A T releases and the square-root counter's sensitivity "
                      "kappa grows with T), so the curve above is the regret of the T-calibrated learner at t, an "
                      "upper estimate for a separate run of length t:", ""] + note + [""]
    for title, block in carried.items():
        if "Regret ratio" in title:
            lines += [block, "", "(carried over from the previous regeneration)", ""]
    lines += gym_rows(args.out)
    lines += ["![DP-UBEV vs UBEV](tabular_dp.png)", "", END]
    text = open(args.md).read() if os.path.exists(args.md) else ""
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + text[text.index(END) + len(END):].lstrip("\n")
    with open(args.md, "w") as f:
        f.write(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
    _plot(curve_rows, args.png, separate)
    print("\n".join(lines))


def _plot(curve_rows, png, separate=()) -> None:
    if not curve_rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for H, tag, rs, b in curve_rows:
        t = rs[0]["rounds"]
        ratio = [sum(_at(r, x) for r in rs) / sum(_at(r, x) for r in b) for x in t]
        line, = ax1.semilogx(t, ratio, label=f"{tag}, H={H} ({len(rs)} seeds)")
        pts = [(T, q) for h, g, T, q in separate if h == H and g == tag]
        if pts:
            ax1.semilogx(*zip(*pts), "o", color=line.get_color(), label=f"{tag}, H={H}: separate runs of length T")
        if rs[0]["gate_open_fraction"][0] is not None:
            gate = [sum(r["gate_open_fraction"][i] for r in rs) / len(rs) for i in range(len(t))]
            ax2.semilogx(t, gate, label=f"{tag}, H={H}")
    ax1.axhline(1.5, color="k", ls=":", lw=0.8)
    ax1.set_xlabel("episodes t")
    ax1.set_ylabel("cumulative regret / UBEV's")
    ax1.set_title("regret ratio to UBEV")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=7, loc="upper right")
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
    p.add_argument("--gym", nargs="*", default=None, metavar="ENV_ID:H:T",
                   help="runs on toy-text gymnasium envs (UBEV and dp_ubev at each --eps, seed --seeds[0]), "
                        "e.g. FrozenLake-v1:20:20000")
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
    if args.gym is not None:
        os.makedirs(args.out, exist_ok=True)
        for spec in args.gym:
            env_id, H, T = spec.split(":")
            for algo, eps in [("ubev", None)] * (not args.no_ubev) + [("dp_ubev", e) for e in args.eps]:
                path = os.path.join(args.out, f"gym_{env_id}_h{H}_{algo}_{'exact' if eps is None else f'eps{eps:g}'}"
                                    f"_s{args.seeds[0]}_T{T}.json")
                if os.path.exists(path):
                    continue
                res = run_gym(env_id, int(H), algo, eps, args.seeds[0], int(T))
                with open(path, "w") as f:
                    json.dump(res, f)
                print(json.dumps(res), flush=True)
        return
    if not args.report:
        run_grid(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
