"""The privacy cost of the tabular learners against their own non-private twins: one JSON per run under --out,
then a section of runs/reference/tabular.md (between markers; the PUCB / UBEV grid above it is
scripts/reproduce_tabular.py's) and runs/reference/tabular_dp.png.

    python scripts/reproduce_dp_tabular.py --jobs 2      # every grid below (resumable), then the report
    python scripts/reproduce_dp_tabular.py --grid riverswim_h10 --jobs 2                # one grid
    python scripts/reproduce_dp_tabular.py --gym FrozenLake-v1:20:20000 Taxi-v4:20:300 --eps 1   # toy-text envs
    python scripts/reproduce_dp_tabular.py --bound-check --H 10 --T 100000 --eps 1       # widths vs the noise
    python scripts/reproduce_dp_tabular.py --report                                      # section + plot only

Twins. A private learner's twin is the same learner with ``eps=null`` (exact counts, everything else equal):
DP-UBEV's is ``algo=dp_ubev eps=null`` with the same counter layout and release schedule, PUCB's is
``algo=pucb eps=null`` (PrivQ on exact counts). The report gives private / own twin, and private / the best
non-private learner of the grid (UBEV, PUCB's twin, and DP-UBEV's twin re-planned after every episode,
``block_growth=null``, which is not private-friendly but may learn faster), with the seeds' own ratios.

Each run is a run like any other, through ``dppo.train`` (``algo=ubev|pucb|dp_ubev env=... episodes=T``): one
fresh user per episode from the one-pass sampler, releases in the ledger, eps from the learner's accountant at
delta = 1e-5, the run's directory under --out (config, journal, checkpoints, progress.csv, summary.json) beside
its JSON. The noise is seeded (``privacy.secure_rng=false``) so that runs reproduce. Every run logs its
count-error bound E and gate-open fraction after every round (1000 episodes; read from its progress.csv) and
keeps every episode's regret (read from its last checkpoint), so one run of length T gives the curve against
t <= T; the report prints how much E at t in a run of length T differs from E at the end of a run of length t
(the counters are calibrated for T).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import QUIET, SEEDED, episode_regret, learner_state, mean_std, parse_eps, progress_rows, run_config  # noqa: E402

from dppo.algos.dp_ubev import DPUBEV  # noqa: E402
from dppo.algos.ucb import PUCB  # noqa: E402
from dppo.api import render  # noqa: E402
from dppo.envs.tabular import random_mdp, riverswim  # noqa: E402
from dppo.privacy import NoiseSource, PrivacyContext  # noqa: E402
from dppo.privacy.accountants import make_accountant  # noqa: E402
from dppo.training.callbacks import Callback  # noqa: E402

BEGIN, END = "<!-- dp_ubev section: scripts/reproduce_dp_tabular.py -->", "<!-- end dp_ubev section -->"
SEEDS = [0, 1, 2, 3, 4]

ENVS = {   # name: (the MDP at horizon H, label, its config at horizon H)
    "riverswim": (lambda H: riverswim(horizon=H), "RiverSwim (S=6, A=2)", lambda H: ["env=riverswim", f"env.horizon={H}"]),
    "random_mdp": (lambda H: random_mdp(S=10, A=3, H=H, seed=0), "random MDP (S=10, A=3, seed 0)",
                   lambda H: ["env=random_mdp", "env.S=10", "env.A=3", f"env.H={H}", "env.seed=0"]),
    "random_mdp_drift": (lambda H: random_mdp(S=10, A=3, H=H, seed=0, drift=1.0),
                         "random MDP with dynamics drifting over h (S=10, A=3, seed 0, drift 1)",
                         lambda H: ["env=random_mdp_drift", "env.S=10", "env.A=3", f"env.H={H}", "env.seed=0",
                                    "env.drift=1.0"]),
}

# learner specs: (algo, eps, kwargs); kwargs of DP-UBEV beyond its defaults
EVERY_EPISODE = {"block_growth": None}
BEST_TWIN = {"block_growth": None, "pool_cap": 3}   # the best non-private DP-UBEV on seeds 100-102 (RiverSwim, T=1e5)
PER_STEP = {"pool_steps": False}
EQUAL_NOISE = {"set_noise": (1.0, 1.0, 1.0)}        # ablation: the same noise on rewards, visits and transitions
DP_CORE = [("ubev", None, {}), ("dp_ubev", None, {}), ("dp_ubev", None, EVERY_EPISODE), ("dp_ubev", None, BEST_TWIN),
           ("dp_ubev", 1.0, {}), ("dp_ubev", 5.0, {})]
GRIDS = {
    "riverswim_h10": dict(env="riverswim", H=10, T=[100000, 1000000], seeds=SEEDS,
                          learners=DP_CORE + [("dp_ubev", 1.0, EQUAL_NOISE), ("dp_ubev", 5.0, EQUAL_NOISE)]),
    "riverswim_h10_pucb": dict(env="riverswim", H=10, T=[100000], seeds=SEEDS,
                               learners=[("pucb", None, {}), ("pucb", 1.0, {}), ("pucb", 5.0, {})]),
    "random_mdp_h10": dict(env="random_mdp", H=10, T=[100000], seeds=SEEDS, learners=DP_CORE),
    "random_mdp_drift_h10": dict(env="random_mdp_drift", H=10, T=[100000], seeds=SEEDS,
                                 learners=DP_CORE + [("dp_ubev", None, PER_STEP), ("dp_ubev", 1.0, PER_STEP),
                                                     ("dp_ubev", 5.0, PER_STEP)]),
}


def tag(algo: str, eps, kw: dict) -> str:
    """Name of a learner spec: ``ubev``, ``pucb_exact``, ``pucb_eps5``, ``dp_ubev_exact``, ``dp_ubev_eps1``, with
    ``_every_episode`` / ``_per_step`` / ``_<key><value>`` for DP-UBEV's non-default keys."""
    if algo == "ubev":
        return "ubev"
    name = f"{algo}_{'exact' if eps is None else f'eps{eps:g}'}"
    for k, v in sorted(kw.items()):
        if (k, v) == ("block_growth", None):
            name += "_every_episode"
        elif (k, v) == ("pool_steps", False):
            name += "_per_step"
        elif k == "set_noise":
            name += "_equal_noise" if tuple(v) == (1.0, 1.0, 1.0) else "_noise" + "-".join(f"{x:g}" for x in v)
        else:
            name += f"_{k}{v}"
    return name


def twin_tag(r: dict) -> str | None:
    """Tag of the run's non-private twin (the same learner and keys with eps=null); None for a non-private run."""
    if r["eps"] is None:
        return None
    return tag(r["algo"], None, {k: v for k, v in r["kw"].items() if k != "set_noise"})   # no noise, no multipliers


def overrides(env: str, H: int, algo: str, eps, seed: int, T: int, kw: dict) -> list[str]:
    """One run's config: the learner with its keys ``kw``, T episodes of one user each, 1000 a round."""
    return [f"algo={algo}", *ENVS[env][2](H), f"eps={'null' if eps is None else eps}", "delta=1e-5",
            f"seed={seed}", f"episodes={T}", f"algo.episodes_per_round={min(1000, T)}",
            *(f"algo.{k}={render(v)}" for k, v in kw.items()), "eval_every=null", *QUIET, *SEEDED]


class RegretLine(Callback):
    """A console line every 200 rounds of a long run, from the released ``regret/cumulative``."""

    def __init__(self, label: str):
        self.label, self.t0 = label, time.perf_counter()

    def on_round_end(self, trainer, round_idx, metrics):
        if round_idx % 200 == 199:
            print(f"  {self.label}: {round_idx + 1} rounds, regret "
                  f"{metrics['regret/cumulative']:,.0f}, {time.perf_counter() - self.t0:.0f} s", flush=True)
        return True


def run_one(env: str, H: int, algo: str, eps, seed: int, T: int, kw: dict, path: str) -> dict:
    """One run in ``path``; its regret after every round, E and gate-open fraction per round, and its facts
    (the counters' released time steps, ``releases``, from the learner's state in the last checkpoint)."""
    label = f"{env} H={H} {tag(algo, eps, kw)} seed={seed}"
    summary = run_config(overrides(env, H, algo, eps, seed, T, kw), path, callbacks=[RegretLine(label)])
    log = progress_rows(path)
    value = lambda r, key: float(r[key]) if r.get(key) not in (None, "") else None   # noqa: E731
    rounds, done = [], 0
    for r in log:
        done += int(float(r["rollout/episodes"]))
        rounds.append(done)
    wall = summary["wall_time_s"]
    cum = torch.cumsum(episode_regret(path), 0)
    return {"env": env, "H": H, "algo": algo, "eps": eps, "kw": kw, "tag": tag(algo, eps, kw), "seed": seed, "T": T,
            "cumulative_regret": float(cum[-1]), "rounds": rounds, "curve": [float(cum[t - 1]) for t in rounds],
            "gate_open_fraction": [value(r, "counters/gate_open_fraction") for r in log],
            "E": [value(r, "counters/error_bound") for r in log], "final_E": summary["count_error_bound"],
            "releases": int(learner_state(path)["stats.t"]), "epsilon_spent": summary["epsilon_spent"],
            "delta": summary["delta_spent"], "wall_s": wall, "episodes_per_s": T / max(wall, 1e-3),
            "noise_std": summary.get("noise_std") if algo == "dp_ubev" else None}


def _path(out: str, spec: tuple) -> str:
    env, H, algo, eps, seed, T, kw = spec
    return os.path.join(out, f"{env}_h{H}_{tag(algo, eps, kw)}_s{seed}_T{T}.json")


def _run_and_save(args) -> str:
    out, spec = args
    path = _path(out, spec)
    res = run_one(*spec, path.removesuffix(".json"))
    with open(path + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(path + ".tmp", path)
    return (f"{os.path.basename(path)}: regret {res['cumulative_regret']:.1f} eps {res['epsilon_spent']:.3g} "
            f"E {res['final_E']:.4g} {res['episodes_per_s']:.0f} ep/s")


def run_grids(names: list, out: str, jobs: int, seeds=None) -> None:
    os.makedirs(out, exist_ok=True)
    specs = []
    for name in names:
        g = GRIDS[name]
        for T in g["T"]:
            for seed in seeds or g["seeds"]:
                for algo, eps, kw in g["learners"]:
                    spec = (g["env"], g["H"], algo, eps, seed, T, kw)
                    if not os.path.exists(_path(out, spec)):
                        specs.append(spec)
    specs.sort(key=lambda s: -s[5] * (2 if s[6].get("block_growth", 1) is None or s[2] != "dp_ubev" else 1))  # long first
    print(f"{len(specs)} runs to do", flush=True)
    if jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(jobs, initializer=torch.set_num_threads, initargs=(1,)) as pool:
            for line in pool.imap_unordered(_run_and_save, [(out, s) for s in specs]):
                print(line, flush=True)
    else:
        for s in specs:
            print(_run_and_save((out, s)), flush=True)


# ---- toy-text gymnasium envs ---------------------------------------------------------------------
class GreedyValues(Callback):
    """At the end of a run on a toy-text env: the exact expected returns (native units) of the final greedy
    policy, of the uniformly random policy and of the optimal one, from the env's exact model. The greedy policy
    is planned from the released statistics only (post-processing) and the model is the public simulator's."""

    def on_train_end(self, trainer):
        learner = trainer.learner
        mdp = learner.mdp
        native = lambda v: float(mdp.to_native_return(torch.tensor(v, dtype=torch.float64)))   # noqa: E731
        greedy = torch.as_tensor(learner.greedy_policy())
        uniform = torch.full((mdp.S, mdp.A), 1.0 / mdp.A, dtype=torch.float64)
        self.values = {"S": mdp.S, "A": mdp.A, "greedy_return": native(mdp.policy_value(greedy)),
                       "random_return": native(mdp.policy_value(uniform)), "optimal_return": native(learner.optimal)}


def run_gym(env_id: str, H: int, algo: str, eps, seed: int, T: int, path: str) -> dict:
    """One run in ``path`` on a toy-text gymnasium env (``env.id=<env_id>``, its exact model: ``from_gym``): the
    final greedy policy's exact expected return beside the optimal and the uniformly random policy's."""
    values = GreedyValues()
    summary = run_config([f"algo={algo}", f"env.id={env_id}", f"env.horizon={H}", f"eps={'null' if eps is None else eps}",
                          "delta=1e-5", f"seed={seed}", f"episodes={T}", f"algo.episodes_per_round={min(1000, T)}",
                          "eval_every=null", *QUIET, *SEEDED], path, callbacks=[values])
    last = progress_rows(path)[-1]
    gate = last.get("counters/gate_open_fraction")
    return {"env_id": env_id, "H": H, "algo": algo, "eps": eps, "seed": seed, "T": T, **values.values,
            "cumulative_regret": float(episode_regret(path).sum()), "last_round_return": float(last["diag/return"]),
            "gate_open_fraction": float(gate) if gate not in (None, "") else None,
            "final_E": summary["count_error_bound"], "epsilon_spent": summary["epsilon_spent"],
            "wall_s": summary["wall_time_s"]}


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


# ---- the widths against the noise actually added --------------------------------------------------
def bound_check(H: int, T: int, eps: float, seed: int = 0) -> list[str]:
    """E (and the reward / next-state widths' coefficients) at the last release for every counter / layout /
    schedule, and, for the default learner, the fraction of (pair, release) whose actual noise breaks one of
    the three bounds of ``dppo/algos/dp_ubev.py`` (each holds w.p. >= 1 - beta/3 over all of them) on the
    statistics of uniformly random RiverSwim episodes."""
    import numpy as np

    from dppo.privacy.gaussian_counter import GRID

    mdp = riverswim(horizon=H)
    ctx = lambda: PrivacyContext(eps, 1e-5, accountant=make_accountant(DPUBEV.accountant_name(None)),
                                 noise=NoiseSource(seed, secure=False))
    pucb = PUCB(mdp, privacy=PrivacyContext(eps, accountant=make_accountant("basic"), noise=NoiseSource(seed)),
                episodes=T)
    rows = ["| learner | counter | statistics | releases | E at T | releases checked | fraction outside |",
            "|---|---|---|---|---|---|---|",
            f"| pucb | laplace_tree | per step | {T:,} | {pucb.count_error_bound():.4g} (reference E_eps) | - | - |"]
    for counter in ("laplace_tree", "gaussian_tree", "gaussian_sqrt"):
        for pool in (False, True):
            for growth in (None, 1.05):
                L = DPUBEV(mdp, privacy=ctx(), seed=seed, episodes=T, counter=counter, pool_steps=pool,
                           block_growth=growth)
                rows.append(f"| dp_ubev | {counter} | {f'pooled, cap {L.layout.cap}' if pool else 'per step'} | {L.releases:,} | "
                            f"{L.final_count_error_bound():.4g} | - | - |")
    L = DPUBEV(mdp, privacy=ctx(), seed=seed, episodes=T)
    g = torch.Generator().manual_seed(seed)
    pi = torch.randint(mdp.A, (T, H, mdp.S), generator=g)
    L.stats.reserve(L.releases)
    out_n = out_r = out_t = checked = 0
    k, S = L.layout.sa, mdp.S
    for t in range(T):
        states, actions, rewards = mdp.episode_from_uniforms(pi[t].tolist(), mdp.uniforms(1, g)[0].tolist())
        before = L.stats.steps_done
        L._feed(states, actions, rewards)
        if L.stats.steps_done == before:
            continue
        xi = L.stats.released.numpy() - L.stats.counts.numpy()          # noise + rounding of every entry
        wd = L.widths()
        xl, xn, xm = xi[:k], xi[k:2 * k], xi[2 * k:].reshape(k, S)
        xv = (1 - wd.mix) * xn + wd.mix * xm.sum(1)                      # error of the visits estimate n^
        out_n += int((np.abs(xv) > wd.E).sum())
        out_r += int((np.sqrt(xl ** 2 + xv ** 2 / wd.s2) > wd.r_noise + GRID * 2 * S).sum())
        out_t += int((np.sqrt((xm ** 2).sum(1) + xn ** 2) > wd.t_noise + GRID * S).sum())
        checked += k
    rows.append(f"| dp_ubev (default) | {L.counter_kind} | pooled, cap {L.layout.cap} | {L.releases:,} | {L.count_error_bound():.4g} | "
                f"{checked:,} (pair, release) | visits {out_n / checked:.2g}, (reward, visit) {out_r / checked:.2g}, "
                f"(transitions, visit) {out_t / checked:.2g} (each allowed beta/3 = {L.beta / 3:.3g} for all at once) |")
    return rows


# ---- report ---------------------------------------------------------------------------------------
def _mean_std(xs):
    return mean_std(xs, single=float("nan"))


def _at(r, t):
    """Cumulative regret of run r after t episodes (t a multiple of its round size)."""
    return r["curve"][r["rounds"].index(t)]


POINTS = (1000, 2000, 5000, 10 ** 4, 2 * 10 ** 4, 5 * 10 ** 4, 10 ** 5, 2 * 10 ** 5, 5 * 10 ** 5, 10 ** 6)


def _order(t: str):
    return ({"ubev": 0}.get(t, 1), not t.startswith("pucb"), "exact" not in t, t)


def _ratio_cells(rs: list, base: dict, t: int | None = None):
    """(ratio of means, 'min-max' of the seeds' own ratios) of runs rs against base {seed: run}."""
    val = (lambda r: r["cumulative_regret"]) if t is None else (lambda r: _at(r, t))
    paired = [r for r in rs if r["seed"] in base]
    if not paired or len(paired) != len(rs):
        return None, "-"
    num = sum(val(r) for r in paired)
    den = sum(val(base[r["seed"]]) for r in paired)
    per = [val(r) / max(1e-12, val(base[r["seed"]])) for r in paired]
    return num / max(1e-12, den), f"{min(per):.2f}-{max(per):.2f}"


def _crossover(ts: list, ratio, level: float = 1.5) -> str:
    """First t from which the ratio stays <= level; if it is above at the end, a log-log extrapolation
    of the ratio's last decade (or '> T' when it is not falling)."""
    above = [t for t in ts if ratio(t) > level]
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
    return f"> {t1:,} (extrapolated ~{t1 * (level / r1) ** (1 / slope):,.3g})"


def _anytime_note(env: str, H: int, T: int, runs: list) -> list[str]:
    """E at t inside a run planned for T beside E at the end of a run planned for t (no training needed)."""
    rows = [f"| learner | t | E at t in the T = {T:,} run | E at the end of a run of T = t | ratio |",
            "|---|---|---|---|---|"]
    mdp = ENVS[env][0](H)
    for tg in sorted({r["tag"] for r in runs if r["algo"] == "dp_ubev" and r["eps"] is not None}):
        r0 = next(r for r in runs if r["tag"] == tg)
        for t in (10 ** 4, 10 ** 5):
            if t >= T or t not in r0["rounds"]:
                continue
            inside = r0["E"][r0["rounds"].index(t)]
            ctx = PrivacyContext(r0["eps"], 1e-5, accountant=make_accountant(DPUBEV.accountant_name(None, r0["kw"])),
                                 noise=NoiseSource(0, secure=False))
            alone = DPUBEV(mdp, privacy=ctx, seed=0, episodes=t, **r0["kw"]).final_count_error_bound()
            rows.append(f"| {tg} | {t:,} | {inside:.4g} | {alone:.4g} | {inside / alone:.3f} |")
    return rows


def report(args) -> None:
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(args.out, "*_h*_T*.json")))
            if not os.path.basename(p).startswith("gym_")]
    lines = [BEGIN, "", "## The privacy cost against each learner's own twin", "",
             "Produced by `python scripts/reproduce_dp_tabular.py` (see docs/tabular.md): cumulative expected regret "
             "(exact, from the true model), delta = 1e-5, eps from the accountant, seeded noise "
             "(`privacy.secure_rng=false`). A private learner's **twin** is the same learner with `eps=null` (exact "
             "counts, everything else equal): `dp_ubev_exact` for DP-UBEV, `pucb_exact` for PUCB. `/ twin` = private "
             "regret / its twin's (ratio of the seed means; in brackets the range of the seeds' own ratios). `/ best` "
             "= private regret / the best non-private learner of the table (UBEV, the twins, and DP-UBEV's twin "
             "re-planned after every episode, `dp_ubev_exact_every_episode`, and with up to 3 visits per pair and episode, `..._pool_cap3`, the best twin on the tuning seeds 100-102). `E` = the count-error bound at the "
             "last release, `releases` = counter time steps (DP-UBEV releases after blocks of episodes growing 5%). "
             "DP-UBEV's Gaussian counters are one Gaussian mechanism, calibrated and accounted exactly (analytic "
             "Gaussian, `gdp` accountant); its default puts 2/3 of the budget (of mu^2) on the transitions "
             "(`set_noise: [2, 2, 1]`, picked on seeds 100-102); `..._equal_noise` (where run) is the same learner "
             "with equal noise on the three statistic sets (its E is smaller, its transition noise larger). Tuning "
             "seeds are never reported: every row uses seeds 0-4.",
             ""]
    bounds = os.path.join(args.out, "bounds.md")
    if os.path.exists(bounds):
        lines += ["### The widths against the noise actually added (`--bound-check`)", "", open(bounds).read().strip(), ""]
    curve_groups = []
    for env, H, T in sorted({(r["env"], r["H"], r["T"]) for r in runs}):
        sel = [r for r in runs if (r["env"], r["H"], r["T"]) == (env, H, T)]
        by_tag = {}
        for r in sel:
            by_tag.setdefault(r["tag"], []).append(r)
        nonpriv = {tg: rs for tg, rs in by_tag.items() if rs[0]["eps"] is None}
        best_tag = min(nonpriv, key=lambda tg: _mean_std([r["cumulative_regret"] for r in nonpriv[tg]])[0]) \
            if nonpriv else None
        lines += [f"### {ENVS[env][1]}, H = {H}, T = {T:,} episodes", "",
                  "| learner | eps | seeds | regret (mean +- std) | / twin | / best | E at T | open gates at T | "
                  "releases | ep/s |", "|---|---|---|---|---|---|---|---|---|---|"]
        for tg in sorted(by_tag, key=_order):
            rs = sorted(by_tag[tg], key=lambda r: r["seed"])
            m, sd = _mean_std([r["cumulative_regret"] for r in rs])
            twin = twin_tag(rs[0])
            cells = []
            for base_tag in (twin, best_tag if rs[0]["eps"] is not None else None):
                base = {r["seed"]: r for r in by_tag.get(base_tag, [])} if base_tag else {}
                q, per = _ratio_cells(rs, base) if base else (None, "-")
                cells.append("-" if q is None else f"**{q:.2f}** ({per})" if base_tag == twin else f"{q:.2f} ({per})")
            if rs[0]["eps"] is None and tg == best_tag:
                cells[1] = "(best)"
            gate = rs[0]["gate_open_fraction"][-1]
            gate = "-" if gate is None else f"{sum(r['gate_open_fraction'][-1] for r in rs) / len(rs):.2f}"
            E = "-" if rs[0]["eps"] is None else f"{rs[0]['final_E']:.4g}"
            eps = "-" if rs[0]["eps"] is None else f"{rs[0]['eps']:g}"
            speed = sum(r["episodes_per_s"] for r in rs) / len(rs)
            lines.append(f"| {tg} | {eps} | {','.join(str(r['seed']) for r in rs)} | {m:,.1f} +- {sd:,.1f} | "
                         f"{cells[0]} | {cells[1]} | {E} | {gate} | {rs[0].get('releases', '-'):,} | {speed:,.0f} |")
        lines.append("")
        curve_groups.append((env, H, T, by_tag))
    # ratio to the twin against t, from the longest runs of every (env, H)
    for env, H in sorted({(e, h) for e, h, _, _ in curve_groups}):
        T, by_tag = max(((T, bt) for e, h, T, bt in curve_groups if (e, h) == (env, H)), key=lambda x: x[0])
        points = [t for t in POINTS if t <= T]
        if len(points) < 2:
            continue
        head = "| learner / twin | seeds | " + " | ".join(f"t={t:,}" for t in points)
        ratio_lines = [f"### Ratio to the twin against t ({ENVS[env][1]}, H = {H}, runs of T = {T:,})", "",
                       head + " | ratio <= 1.5 from t on |", "|---|---|" + "---|" * (len(points) + 1)]
        gate_lines = [f"### Gate-open fraction and E against t ({ENVS[env][1]}, H = {H}, runs of T = {T:,})", "",
                      "Share of released (s, a[, h]) with `n~ > E` after t episodes (mean over the seeds; from released "
                      "counts only), and the count-error bound E at t.", "",
                      "| learner | quantity | " + " | ".join(f"t={t:,}" for t in points) + " |",
                      "|---|---|" + "---|" * len(points)]
        for tg in sorted(by_tag, key=_order):
            rs = sorted(by_tag[tg], key=lambda r: r["seed"])
            twin = twin_tag(rs[0])
            if twin not in by_tag:
                continue
            base = {r["seed"]: r for r in by_tag[twin]}
            ratio = lambda t, rs=rs, base=base: _ratio_cells(rs, base, t)[0]
            if ratio(points[-1]) is None:
                continue
            ratio_lines.append(f"| {tg} / {twin} | {','.join(str(r['seed']) for r in rs)} | "
                               + " | ".join(f"{ratio(t):.2f}" for t in points) + " | "
                               + _crossover(rs[0]["rounds"], ratio) + " |")
            if rs[0]["gate_open_fraction"][0] is not None:
                idx = [rs[0]["rounds"].index(t) for t in points]
                gate_lines.append(f"| {tg} | open gates | " + " | ".join(
                    f"{sum(r['gate_open_fraction'][i] for r in rs) / len(rs):.2f}" for i in idx) + " |")
                gate_lines.append(f"| {tg} | E | " + " | ".join(f"{rs[0]['E'][i]:.4g}" for i in idx) + " |")
        lines += ratio_lines + [""] + gate_lines + [""]
        note = _anytime_note(env, H, T, [r for rs in by_tag.values() for r in rs])
        if len(note) > 2:
            lines += [f"E at t inside the runs of T = {T:,} against E at the end of a run of length t (the counters and "
                      "the union bounds are calibrated for T; with blocks the number of releases grows like log T, so "
                      "the curve above is close to what separate runs of length t give):", ""] + note + [""]
    lines += gym_rows(args.out)
    lines += ["![ratio to the twin](tabular_dp.png)", "", END]
    text = open(args.md).read() if os.path.exists(args.md) else ""
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + text[text.index(END) + len(END):].lstrip("\n")
    with open(args.md, "w") as f:
        f.write(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
    _plot(curve_groups, args.png)
    print("\n".join(lines))


def _plot(curve_groups, png) -> None:
    """Left: private / twin against t (longest runs; markers: separate shorter runs); right: gate-open fraction."""
    longest = {}
    for env, H, T, by_tag in curve_groups:
        if T >= longest.get((env, H), (0, None))[0]:
            longest[(env, H)] = (T, by_tag)
    if not longest:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (env, H), (T, by_tag) in sorted(longest.items()):
        for tg in sorted(by_tag, key=_order):
            rs = by_tag[tg]
            twin = twin_tag(rs[0])
            if twin not in by_tag:
                continue
            base = {r["seed"]: r for r in by_tag[twin]}
            t = rs[0]["rounds"]
            ratio = [_ratio_cells(rs, base, x)[0] for x in t]
            if None in ratio:
                continue
            label = f"{env} H={H}: {tg}"
            line, = ax1.semilogx(t, ratio, label=label)
            pts = []
            for e2, h2, T2, bt2 in curve_groups:
                if (e2, h2) == (env, H) and T2 != T and tg in bt2 and twin in bt2:
                    q = _ratio_cells(bt2[tg], {r["seed"]: r for r in bt2[twin]})[0]
                    if q is not None:
                        pts.append((T2, q))
            if pts:
                ax1.semilogx(*zip(*pts), "o", color=line.get_color())
            if rs[0]["gate_open_fraction"][0] is not None:
                gate = [sum(r["gate_open_fraction"][i] for r in rs) / len(rs) for i in range(len(t))]
                ax2.semilogx(t, gate, label=label)
    for level in (1.5, 3.0):
        ax1.axhline(level, color="k", ls=":", lw=0.8)
    ax1.set_xlabel("episodes t")
    ax1.set_ylabel("cumulative regret / the twin's (eps = null)")
    ax1.set_title("privacy cost against the twin (dots: separate runs of length T)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=6, loc="upper right")
    ax2.set_xlabel("episodes t")
    ax2.set_ylabel("share of (s, a) with n~ > E")
    ax2.set_title("gate-open fraction (from released counts)")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", nargs="*", default=None, choices=sorted(GRIDS), help="grids to run (default: all)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the grids' seeds")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (one thread each)")
    p.add_argument("--H", type=int, default=10, help="--bound-check / --gym: horizon")
    p.add_argument("--T", type=int, default=100000, help="--bound-check: episodes")
    p.add_argument("--eps", type=parse_eps, nargs="*", default=[1.0], help="--bound-check / --gym: eps values")
    p.add_argument("--out", default="runs/tabular_dp")
    p.add_argument("--md", default="runs/reference/tabular.md")
    p.add_argument("--png", default="runs/reference/tabular_dp.png")
    p.add_argument("--gym", nargs="*", default=None, metavar="ENV_ID:H:T",
                   help="runs on toy-text gymnasium envs (UBEV and dp_ubev at each --eps, seed --seeds[0]), "
                        "e.g. FrozenLake-v1:20:20000")
    p.add_argument("--report", action="store_true", help="only write the section and plot from existing runs")
    p.add_argument("--bound-check", action="store_true", help="E of every counter at --H, --T, eps=--eps[0], and "
                   "the fraction of (pair, release) outside the widths (written to --out/bounds.md)")
    args = p.parse_args()
    if args.bound_check:
        rows = bound_check(args.H, args.T, args.eps[0])
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bounds.md"), "w") as f:
            f.write(f"RiverSwim H = {args.H}, T = {args.T:,}, eps = {args.eps[0]:g}, delta = 1e-5\n\n" + "\n".join(rows) + "\n")
        print("\n".join(rows))
        return
    if args.gym is not None:
        os.makedirs(args.out, exist_ok=True)
        seed = (args.seeds or [0])[0]
        for spec in args.gym:
            env_id, H, T = spec.split(":")
            for algo, eps in [("ubev", None)] + [("dp_ubev", e) for e in args.eps]:
                path = os.path.join(args.out, f"gym_{env_id}_h{H}_{algo}_{'exact' if eps is None else f'eps{eps:g}'}"
                                    f"_s{seed}_T{T}.json")
                if os.path.exists(path):
                    continue
                res = run_gym(env_id, int(H), algo, eps, seed, int(T), path.removesuffix(".json"))
                with open(path, "w") as f:
                    json.dump(res, f)
                print(json.dumps(res), flush=True)
        return
    if not args.report:
        run_grids(args.grid if args.grid else sorted(GRIDS), args.out, args.jobs, args.seeds)
    report(args)


if __name__ == "__main__":
    main()
