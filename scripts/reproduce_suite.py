"""The suite: dppo's learners and Stable-Baselines3 side by side on CartPole-v1, Acrobot-v1, Pendulum-v1 and
MountainCar-v0, in one script; its ICU-Sepsis section (``--only icu_sepsis``, part of a full invocation) runs
``scripts/reproduce_icu_sepsis.py``, whose table is ``runs/reference/icu_sepsis.md``.

    python scripts/reproduce_suite.py --jobs 2          # the long tests (pytest -m slow), then run what is
                                                        # missing (cached per run), then report
    python scripts/reproduce_suite.py --report          # table + plots from the runs on disk
    python scripts/reproduce_suite.py --only cartpole   # run one env (or rows: --rows PPO DP-PPO SB3-PPO); the
                                                        # report always shows every run cached on disk

dppo rows: ``python train.py +experiment=<env>_<algo> eps=<eps> seed=<seed>`` where the env has a tuned
``conf/experiment`` file (``<env>_ppo`` / ``<env>_dp_ppo`` for the PPO family, ``<env>_<algo>_eps<eps>`` where one
budget has its own tuning; the NPG/PG families' existing files for CartPole, Acrobot and Pendulum), else the algorithm's defaults with ``env.id=<id>``; each private
learner at eps 5 and eps 1, delta 1e-5, seeded noise (``privacy.secure_rng=false``: the table reproduces).
SB3 rows (``pip install -e ".[bench]"``; imported only here): PPO with rl-baselines3-zoo's published
hyper-parameters and budget for each env, and SAC (zoo) on Pendulum; the SB3 learner's env steps are all
"users' env steps" (it learns from the same kind of episodes, without privacy).

Every learner is evaluated the same way within an env: ``EVAL_EPISODES`` held-out episodes of the final
policy (sampled actions, deterministic on Pendulum, as SB3 reports it), and a curve of the evaluation
return (10 episodes) against the learner's env steps; "env steps to target" (CartPole: 475, Pendulum: -200) is the first
point of that curve at or above the target. Each run lives in ``--out/<env>/<row>_s<seed>/`` and is skipped
when its ``summary.json`` is complete and its saved config is the row's current one, so a rerun only runs
what is missing or stale. Seeds 0-9 by default (the
configs were tuned on seeds 100-102); SB3's 1e6-step runs (Acrobot, MountainCar) take 5-11 min each here,
so those rows use ``SB3_SEEDS`` seeds (named in the table).
Writes ``runs/reference/suite.md``, ``suite.png`` (final return against users' env steps, every learner)
and ``suite_curves.png`` (evaluation return against users' env steps).

A full invocation takes hours on two cores, so the reference grows across invocations: every run the
report sees is also kept as a record (final return, users' env steps, eps, wall time, its curve at
<= ``RECORD_POINTS`` points) in ``runs/reference/suite_runs.json``, keyed by env, row and seed and
stamped with the fingerprint of what defines the run (the composed dppo config without its seed, or the
SB3 spec). A code change under a row is not in its fingerprint: rerun that row (delete its records, or
``--fresh``). The report takes each seed from disk if the run is there, else from a
record whose fingerprint still matches (a changed experiment file or default sets its records aside, kept in
the file but unused until the row is rerun, which the report says, as it does for a run on disk whose saved
config differs from the row's); rows with neither
keep their line from the previous ``suite.md``, marked as carried.
``--fresh`` ignores records and carried lines: the table is then exactly the runs on disk (from an empty
``--out``: a regeneration from scratch).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, worker_init  # noqa: E402

sys.path.insert(0, ROOT)
from dppo.training.rundir import complete, write_report  # noqa: E402

EVAL_EPISODES = 20
CURVE_EPISODES = EVAL_EPISODES   # the dppo runs evaluate with eval_episodes too
ENVS = {
    "cartpole": {"id": "CartPole-v1", "target": 475.0, "greedy": False, "random": 22.0},
    "acrobot": {"id": "Acrobot-v1", "target": None, "greedy": False, "random": -500.0},
    "pendulum": {"id": "Pendulum-v1", "target": -200.0, "greedy": True, "random": -1200.0},
    "mountaincar": {"id": "MountainCar-v0", "target": None, "greedy": False, "random": -200.0},
}
# sections with their own script and table: ``--only icu_sepsis`` runs ``scripts/reproduce_icu_sepsis.py`` (ICU-Sepsis,
# pip install -e ".[icu]": exact survival of the released policy and of the patients treated while learning,
# runs/reference/icu_sepsis.md), with this invocation's seeds and jobs
SECTIONS = {"icu_sepsis": ("reproduce_icu_sepsis.py", "icu_sepsis")}
# (label, algo, eps values, experiment files that exist, eval_every): every private learner at eps 5 and 1
DPPO_ROWS = [
    ("PPO", "ppo", [None], ("cartpole", "acrobot", "pendulum", "mountaincar"), 1),
    ("DP-PPO", "dp_ppo", [5.0, 1.0], ("cartpole", "acrobot", "pendulum", "mountaincar"), 1),
    ("NPG", "npg", [None], ("cartpole", "acrobot", "pendulum", "mountaincar"), 10),
    ("DP-NPG", "dp_npg", [5.0, 1.0], ("cartpole", "acrobot", "pendulum", "mountaincar"), 10),
    ("PG", "pg", [None], ("cartpole", "acrobot", "pendulum"), 10),
    ("DP-PG", "dp_pg", [5.0, 1.0], ("cartpole", "acrobot", "pendulum"), 10),
    # DP-PPO from an actor pretrained on a public simulator (conf/experiment/cartpole_dp_ppo_public_init.yaml)
    ("DP-PPO public-init", "dp_ppo_public_init", [5.0, 1.0], ("cartpole",), 1),

]
# rows that run only where their experiment file exists (no algorithm defaults to fall back to)
FILE_ONLY = {"DP-PPO public-init"}
# rl-baselines3-zoo (hyperparams/ppo.yml, sac.yml; the norm_obs-only VecNormalize of the zoo's published
# Acrobot / MountainCar agents); "lin_x" = linear decay from x to 0, as the zoo's schedules
SB3 = {
    ("cartpole", "PPO"): {"n_timesteps": 100_000, "n_envs": 8, "kwargs": dict(
        n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
        learning_rate="lin_0.001", clip_range="lin_0.2")},
    ("acrobot", "PPO"): {"n_timesteps": 1_000_000, "n_envs": 16, "normalize": True, "kwargs": dict(
        n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0)},
    ("pendulum", "PPO"): {"n_timesteps": 100_000, "n_envs": 4, "kwargs": dict(
        n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3,
        clip_range=0.2, use_sde=True, sde_sample_freq=4)},
    ("pendulum", "SAC"): {"n_timesteps": 20_000, "n_envs": 1, "kwargs": dict(learning_rate=1e-3)},
    ("mountaincar", "PPO"): {"n_timesteps": 1_000_000, "n_envs": 16, "normalize": True, "kwargs": dict(
        n_steps=16, gae_lambda=0.98, gamma=0.99, n_epochs=4, ent_coef=0.0)},
}
SB3_SEEDS = {("acrobot", "PPO"): 3, ("mountaincar", "PPO"): 3}   # the 1e6-step rows (cost, see docstring)
SB3_EVAL_POINTS = 50       # evaluation points along an SB3 run's curve
RECORD_POINTS = 60         # curve points kept per run in the records file
COST = {"sb3_1e6": 60.0, "npg": 4.0, "dp_npg": 4.0, "pg": 3.0, "dp_pg": 3.0}   # rough, for ordering only


# ---- the jobs ------------------------------------------------------------------------------------
def env_rows(env: str) -> list[tuple]:
    """The dppo rows of ``env``: DPPO_ROWS, restricted to the env's ``rows`` and with its ``eps`` lists."""
    spec = ENVS[env]
    return [(label, algo, spec.get("eps", {}).get(label, eps_list), files, every)
            for label, algo, eps_list, files, every in DPPO_ROWS
            if (label not in FILE_ONLY or env in files) and label in spec.get("rows", (label,))]


def available(env: str) -> bool:
    """Whether the env's optional package (``requires``) is installed."""
    import importlib.util

    return ENVS[env].get("requires") is None or importlib.util.find_spec(ENVS[env]["requires"]) is not None


def eval_episodes(env: str) -> int:
    return int(ENVS[env].get("eval_episodes", EVAL_EPISODES))


def row_name(label: str, eps) -> str:
    return label if eps is None else f"{label} eps={eps:g}"


def run_dir(out: str, env: str, name: str, seed: int) -> str:
    return os.path.join(out, env, f"{name.replace(' ', '_').replace('=', '')}_s{seed}")


def experiment_file(env: str, algo: str, eps) -> str:
    """The row's experiment file: ``<env>_<algo>_eps<eps>`` where one is tuned for that budget, else ``<env>_<algo>``."""
    name = f"{env}_{algo}"
    if eps is not None and os.path.isfile(os.path.join(ROOT, "conf", "experiment", f"{name}_eps{eps:g}.yaml")):
        return f"{name}_eps{eps:g}"
    return name


def dppo_overrides(env: str, algo: str, eps, files, eval_every: int, seed: int) -> list[str]:
    spec = ENVS[env]
    base = [f"+experiment={experiment_file(env, algo, eps)}"] if env in files else [f"algo={algo}", f"env.id={spec['id']}"]
    if env == "pendulum" and env not in files:
        base += ["env=pendulum", "policy=gaussian", "reward_bound=16.3"]
    extra = [] if eps is None else [f"eps={eps}"]
    return [*base, *extra, f"seed={seed}", f"eval_episodes={eval_episodes(env)}", f"eval_every={eval_every}",
            f"eval.greedy={str(spec['greedy']).lower()}", "progress=false", "logger.tensorboard=false",
            "privacy.secure_rng=false"]


def jobs(args) -> list[tuple]:
    out = []
    for env in args.envs:
        if not available(env):
            print(f"{env}: skipped ({ENVS[env]['requires']} is not installed: pip install -e \".[icu]\")")
            continue
        for label, algo, eps_list, files, every in env_rows(env):
            for eps in eps_list:
                name = row_name(label, eps)
                if args.rows and name not in args.rows and label not in args.rows:
                    continue
                for s in args.seeds:
                    out.append(("dppo", env, name, s, dppo_overrides(env, algo, eps, files, every, s),
                                COST.get(algo, 1.0)))
        for (e, algo), spec in SB3.items():
            name = f"SB3-{algo}"
            if e != env or (args.rows and name not in args.rows):
                continue
            n = SB3_SEEDS.get((e, algo), len(args.seeds)) if not args.all_sb3_seeds else len(args.seeds)
            for s in args.seeds[:n]:
                out.append(("sb3", env, name, s, spec, spec["n_timesteps"] / 1e6 * COST["sb3_1e6"]))
    return out


def run_job(kind: str, env: str, name: str, seed: int, spec, path: str) -> tuple[str, int, float]:
    import contextlib
    import shutil

    t0 = time.perf_counter()
    if os.path.isdir(path):
        shutil.rmtree(path)   # an incomplete earlier attempt: start afresh
    os.makedirs(path, exist_ok=True)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            if kind == "dppo":
                run_dppo(spec, path)
            else:
                run_sb3(env, name, seed, spec, path)
        rc = 0
    except Exception as err:  # noqa: BLE001 - one failed run is reported, the suite goes on
        print(f"FAILED {env}/{os.path.basename(path)}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        rc = 1
    return path, rc, time.perf_counter() - t0


def run_dppo(overrides: list[str], path: str) -> None:
    """One dppo run through the Python API (the same config and outputs as ``train.py``)."""
    from omegaconf import OmegaConf

    import dppo

    cfg = dppo.make_config(overrides)
    os.makedirs(os.path.join(path, ".hydra"), exist_ok=True)
    OmegaConf.save(cfg, os.path.join(path, ".hydra", "config.yaml"))
    dppo.train(cfg, run_dir=path)


def _schedule(value):
    if isinstance(value, str) and value.startswith("lin_"):
        v0 = float(value[4:])
        return lambda progress_remaining: progress_remaining * v0
    return value


def run_sb3(env: str, name: str, seed: int, spec: dict, path: str) -> None:
    """One SB3 run (zoo hyper-parameters), evaluated like the dppo runs; writes summary.json and curve.csv."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env_id, greedy = ENVS[env]["id"], ENVS[env]["greedy"]
    t0 = time.perf_counter()
    venv = make_vec_env(env_id, n_envs=spec["n_envs"], seed=seed)
    if spec.get("normalize"):
        venv = VecNormalize(venv, norm_obs=True, norm_reward=False)
    kwargs = {k: _schedule(v) for k, v in spec["kwargs"].items()}
    from stable_baselines3 import DQN

    cls = {"SB3-PPO": PPO, "SB3-SAC": SAC, "SB3-DQN": DQN}[name]
    model = cls("MlpPolicy", venv, seed=seed, verbose=0, device="cpu", **kwargs)
    eval_env = gym.make(env_id)

    def evaluate(episodes: int, offset: int) -> float:
        obs_rms = venv.obs_rms if isinstance(venv, VecNormalize) else None
        total = 0.0
        for i in range(episodes):
            obs, _ = eval_env.reset(seed=10_000_000 + offset + i)   # held-out seeds, never a training reset's
            done, ret = False, 0.0
            while not done:
                x = obs if obs_rms is None else np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + venv.epsilon),
                                                        -venv.clip_obs, venv.clip_obs)
                action, _ = model.predict(x, deterministic=greedy)
                obs, r, term, trunc, _ = eval_env.step(action)
                ret += float(r)
                done = term or trunc
            total += ret
        return total / episodes

    every = max(spec["n_timesteps"] // SB3_EVAL_POINTS, 1)
    curve = []

    class Curve(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next = every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next:
                curve.append((self.num_timesteps, evaluate(int(ENVS[env].get("curve_episodes", CURVE_EPISODES)), 0)))
                self.next += every
            return True

    model.learn(total_timesteps=spec["n_timesteps"], callback=Curve())
    final = evaluate(eval_episodes(env), 1000)
    with open(os.path.join(path, "curve.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["env_steps", "eval_return"])
        w.writerows(curve)
    summary = {"learner": name, "env_id": env_id, "seed": seed, "final_return": final,
               "env_steps": {"users": int(model.num_timesteps), "public": None},
               "hyperparameters": {**spec["kwargs"], "n_envs": spec["n_envs"], "normalize": spec.get("normalize", False),
                                   "n_timesteps": spec["n_timesteps"]},
               "wall_time_s": round(time.perf_counter() - t0, 3), "complete": True}
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def up_to_date(out: str, env: str, name: str, seed: int, fps: dict) -> bool:
    """A complete run on disk made with the row's current config (``fps`` caches the rows' fingerprints)."""
    path = run_dir(out, env, name, seed)
    if not complete(path):
        return False
    if (env, name) not in fps:
        fps[env, name] = fingerprint(env, name)
    return run_fingerprint(path, name) in (None, fps[env, name])


def run_all(args) -> float:
    fps: dict = {}
    todo = [j for j in jobs(args) if not up_to_date(args.out, j[1], j[2], j[3], fps)]
    todo.sort(key=lambda j: -j[5])   # longest first, so the pool drains evenly
    if not todo:
        return 0.0
    from tqdm import tqdm

    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=worker_init) as pool, \
            tqdm(total=len(todo), desc="suite runs", unit="run") as bar:
        futures = [pool.submit(run_job, kind, env, name, s, spec, run_dir(args.out, env, name, s))
                   for kind, env, name, s, spec, _ in todo]
        for fut in as_completed(futures):
            path, rc, wall = fut.result()
            bar.set_postfix_str(f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)} "
                                f"{wall:.0f}s rc={rc}")
            bar.update(1)
    return time.perf_counter() - t0


# ---- the report ----------------------------------------------------------------------------------
def load(path: str) -> dict:
    """A run's summary plus its evaluation curve [(users' env steps, eval return)]."""
    with open(os.path.join(path, "summary.json")) as f:
        s = json.load(f)
    curve = []
    if os.path.isfile(os.path.join(path, "curve.csv")):
        with open(os.path.join(path, "curve.csv")) as f:
            curve = [(float(r["env_steps"]), float(r["eval_return"])) for r in csv.DictReader(f)]
    elif os.path.isfile(os.path.join(path, "progress.csv")):
        with open(os.path.join(path, "progress.csv")) as f:
            curve = [(float(r["global_step"]), float(r["eval/return"])) for r in csv.DictReader(f)
                     if r.get("eval/return") not in (None, "")]
    s["curve"] = curve
    s["users_env_steps"] = (s.get("env_steps") or {}).get("users")
    return s


def cached_seeds(out: str, env: str, name: str) -> list[int]:
    """The seeds of ``name`` on ``env`` whose run is complete on disk (the report shows every one of them)."""
    stem = os.path.basename(run_dir(out, env, name, 0))[:-len("_s0")]
    folder = os.path.join(out, env)
    seeds = [int(d[len(stem) + 2:]) for d in (os.listdir(folder) if os.path.isdir(folder) else [])
             if d.startswith(stem + "_s") and d[len(stem) + 2:].isdigit()]
    return sorted(s for s in seeds if complete(run_dir(out, env, name, s)))


def _seed_list(seeds: list[int]) -> str:
    """'10 (0-9)', '3 (0-2)', '2 (0, 5)'."""
    seeds = sorted(int(s) for s in seeds)
    span = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2 else \
        ", ".join(map(str, seeds))
    return f"{len(seeds)} ({span})"


def steps_to(curve, target: float):
    return next((x for x, y in curve if y >= target), None)


def _fmt(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"


# ---- records: the runs of earlier invocations -------------------------------------------------------
def _hash(obj) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _sb3_hyperparameters(spec: dict) -> dict:
    """What an SB3 run's summary.json records of its spec (zoo hyper-parameters, envs, normalization, budget)."""
    return {**spec["kwargs"], "n_envs": spec["n_envs"], "normalize": spec.get("normalize", False),
            "n_timesteps": spec["n_timesteps"]}


def fingerprint(env: str, name: str) -> str:
    """What defines a row's runs, hashed: the composed dppo config with its seed removed (the experiment
    file, the algorithm's defaults and the suite's overrides), or the SB3 spec (zoo hyper-parameters, budget)."""
    if name.startswith("SB3-"):
        return _hash(_sb3_hyperparameters(SB3[(env, name[4:])]))
    from omegaconf import OmegaConf

    import dppo

    label, eps = (name.split(" eps=") + [None])[:2]
    algo, files, every = next((a, f, e) for lab, a, _, f, e in DPPO_ROWS if lab == label)
    cfg = OmegaConf.to_container(dppo.make_config(dppo_overrides(env, algo, None if eps is None else float(eps),
                                                                 files, every, 0)), resolve=True)
    return config_hash(cfg)


def config_hash(cfg: dict) -> str:
    """The hash of a composed config that defines a row: without its seed, nor a key added later at the value under
    which runs are what they were before it existed (``NEUTRAL_KEYS``)."""
    cfg = dict(cfg)
    cfg.pop("seed", None)
    for key, neutral in NEUTRAL_KEYS.items():
        group, _, leaf = key.rpartition(".")
        section = cfg.get(group, {}) if group else cfg
        if isinstance(section, dict) and section.get(leaf, object()) == neutral:
            section.pop(leaf)
    return _hash(cfg)


# config keys added after runs were recorded, with the value under which a run is what it was before the key existed:
# dropped from the fingerprint at that value, so the records stay current (any other value is a new config)
NEUTRAL_KEYS = {"eval.select": "last", "threads": "auto"}


def public_init_note(env: str, name: str) -> str | None:
    """For a row whose actor starts from ``policy.init_from`` (a shipped pretraining): where from, and the public
    env steps that pretraining took (its own training steps, from the ``summary.json`` beside it; not counted
    in the users' env steps column)."""
    if name.startswith("SB3-"):
        return None
    import dppo

    label, eps = (name.split(" eps=") + [None])[:2]
    algo, files, every = next((a, f, e) for lab, a, _, f, e in DPPO_ROWS if lab == label)
    cfg = dppo.make_config(dppo_overrides(env, algo, None if eps is None else float(eps), files, every, 0))
    init = cfg.policy.get("init_from")
    if not init:
        return None
    import torch

    with open(os.path.join(ROOT, os.path.dirname(str(init)), "summary.json")) as f:
        pre = json.load(f)
    parts = "actor and critic start" if "critic" in torch.load(os.path.join(ROOT, str(init)), weights_only=True) \
        else "actor starts"
    return (f"{label}: the {parts} from `{init}` ({pre['algo']} on the public simulator {pre['env_id']}, "
            f"{pre['env_steps']['users']:,} public env steps of its training, not in the users' env steps column); "
            f"`conf/experiment/{experiment_file(env, algo, None if eps is None else float(eps))}.yaml`.")


def run_fingerprint(path: str, name: str) -> str | None:
    """The fingerprint of the run on disk at ``path``, from what it saved (its composed config, or the SB3
    hyper-parameters in its summary.json); None if it saved neither."""
    if name.startswith("SB3-"):
        with open(os.path.join(path, "summary.json")) as f:
            hp = json.load(f).get("hyperparameters")
        return None if hp is None else _hash(hp)
    saved = os.path.join(path, ".hydra", "config.yaml")
    if not os.path.isfile(saved):
        return None
    from omegaconf import OmegaConf

    return config_hash(OmegaConf.to_container(OmegaConf.load(saved), resolve=True))


def record_of(run: dict, fp: str) -> dict:
    curve = run["curve"]
    keep = curve[:: max(1, math.ceil(len(curve) / RECORD_POINTS))]
    if curve and keep[-1] != curve[-1]:
        keep.append(curve[-1])
    return {"fingerprint": fp, "final_return": run["final_return"], "users_env_steps": run["users_env_steps"],
            "epsilon_spent": run.get("epsilon_spent"), "wall_time_s": run.get("wall_time_s", 0.0),
            "curve": [[float(x), float(y)] for x, y in keep]}


def load_records(path: str | None) -> dict:
    if not path or not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def previous_lines(md: str) -> dict:
    """{(env id, learner): table line} of the previous report, for rows with no run on disk or on record."""
    out, env_id = {}, None
    if not os.path.isfile(md):
        return out
    with open(md) as f:
        for line in f:
            if line.startswith("## "):
                env_id = line[3:].strip()
            elif line.startswith("| ") and env_id and "(not run)" not in line:
                name = line.split("|")[1].strip().rstrip(" †")
                if name not in ("learner", "---"):
                    out[(env_id, name)] = line.rstrip("\n").replace(f"| {name} †|", f"| {name} |")
    return out


def report(args, wall: float | None) -> None:
    fresh = getattr(args, "fresh", False)
    records_path = None if fresh else getattr(args, "records", None)
    records, kept = load_records(records_path), {}
    carried = {} if fresh else previous_lines(args.md)
    stale, n_carried, carried_points = [], 0, {}
    rows_by_env, lines = {}, ["# The suite: dppo's learners and SB3 side by side", ""]
    lines += [f"Final return: {EVAL_EPISODES} held-out episodes of the final policy (sampled actions; deterministic "
              f"on Pendulum-v1), mean and min over seeds. Users' env steps: the environment steps of the episodes "
              f"the learner trained on (for SB3: its training steps), mean over seeds. Env steps to target: the "
              f"first point of the evaluation curve ({CURVE_EPISODES} held-out episodes) at or above the target, "
              f"mean and max over seeds (k/n: seeds that reached it). delta = 1e-5, seeded noise (`privacy.secure_rng=false`). Configs: "
              f"`conf/experiment/<env>_<algo>_eps<eps>.yaml` or `<env>_<algo>.yaml` where one exists, else the algorithm's defaults; SB3: "
              f"rl-baselines3-zoo's hyper-parameters and budgets. Command: `python scripts/reproduce_suite.py "
              f"--jobs 2`.", ""]
    for env in ENVS:   # every env and row cached on disk, whatever subset this invocation ran
        spec = ENVS[env]
        env_start = len(lines)
        lines += [f"## {spec['id']}", "",
                  "| learner | seeds | users' env steps | final return (mean) | min | env steps to target | "
                  "eps spent | wall s/run |", "|---|---|---|---|---|---|---|---|"]
        names = [row_name(l, e) for l, _, eps_list, _, _ in env_rows(env) for e in eps_list] + \
                [f"SB3-{a}" for (e, a) in SB3 if e == env]
        not_run = 0
        for name in names:
            seeds = cached_seeds(args.out, env, name)
            prefix = f"{env}|{name}|"
            old = {int(k[len(prefix):]): r for k, r in records.items() if k.startswith(prefix)}
            fp = fingerprint(env, name) if seeds or old else None
            for s_ in list(seeds):   # a run on disk made with another config than the row's current one
                got = run_fingerprint(run_dir(args.out, env, name, s_), name)
                if got is not None and got != fp:
                    seeds.remove(s_)
                    stale.append((f"{env}/{name} (on disk)", s_))
            runs = [load(run_dir(args.out, env, name, s)) for s in seeds]
            for s_, r in sorted(old.items()):
                if s_ in seeds:
                    continue
                if r["fingerprint"] != fp:   # kept aside (unused) until the row is rerun: no record is lost
                    stale.append((f"{env}/{name}", s_))
                    kept[f"{prefix}{s_}"] = r
                    continue
                seeds.append(s_)
                runs.append({**r, "curve": [tuple(p) for p in r["curve"]]})
            for s_, r in zip(seeds, runs):
                kept[f"{prefix}{s_}"] = record_of(r, fp)
            if not runs:
                line = carried.get((spec["id"], name))
                if line is not None:
                    n_carried += 1
                    lines.append(line.replace(f"| {name} |", f"| {name} †|", 1))
                    point = _carried_point(line)
                    if point is not None:
                        carried_points.setdefault(env, {})[name] = point
                else:
                    lines.append(f"| {name} | 0 | (not run) | | | | | |")
                    not_run += 1
                continue
            seeds, runs = zip(*sorted(zip(seeds, runs), key=lambda p: p[0]))
            rows_by_env.setdefault(env, {})[name] = runs
            finals = [r["final_return"] for r in runs]
            steps = [r["users_env_steps"] for r in runs if r["users_env_steps"] is not None]
            hit = "-"
            if spec["target"] is not None:
                hits = [steps_to(r["curve"], spec["target"]) for r in runs]
                got = [h for h in hits if h is not None]
                hit = (f"{sum(got) / len(got):,.0f} (max {max(got):,.0f}; {len(got)}/{len(runs)})" if got
                       else f"never (0/{len(runs)})")
            eps = max((r.get("epsilon_spent") or 0.0) for r in runs)
            wall_s = sum(r.get("wall_time_s", 0.0) for r in runs) / len(runs)
            lines.append(f"| {name} | {_seed_list(seeds)} | {_fmt(sum(steps) / len(steps) if steps else None, 0)} | "
                         f"{sum(finals) / len(finals):.1f} | {min(finals):.1f} | {hit} | "
                         f"{'-' if not eps else f'{eps:.3g}'} | {wall_s:.0f} |")
        if not_run == len(names):
            del lines[env_start:]   # nothing measured on this env (never run here): no section of empty rows
            continue
        lines.append("")
        notes = sorted({n for name in rows_by_env.get(env, {}) if (n := public_init_note(env, name))})
        lines += [*notes, ""] if notes else []
    if wall:
        lines += [f"Wall time of this invocation: {wall / 60:.1f} min ({args.jobs} runs at a time, one thread each)."]
    total = sum(r.get("wall_time_s", 0.0) for env_rows in rows_by_env.values() for runs in env_rows.values()
                for r in runs)
    lines += [f"Sum of the runs' own wall times: {total / 3600:.2f} h.", ""]
    if n_carried:
        lines += [f"† {n_carried} rows have no run on disk or on record: each keeps its line from the previous "
                  f"report (an earlier invocation, older code or config possible; hollow squares in suite.png, not in the curves). "
                  f"`--fresh` drops them.", ""]
    if stale:
        by_row = {}
        for row, s_ in stale:
            by_row.setdefault(row, []).append(s_)
        lines += [f"Left out: {len(stale)} runs made with another config than their row's current one (records set "
                  f"aside: kept in the records file, unused): " + "; ".join(f"{row} seeds {_seed_list(s_)}" for row, s_ in by_row.items())
                  + ".", ""]
    write_report(args.md, "\n".join(lines))
    if records_path:
        with open(records_path, "w") as f:
            json.dump(dict(sorted(kept.items())), f, indent=None, separators=(",", ":"))
            f.write("\n")
    plot(rows_by_env, args, carried_points)


def _carried_point(line: str):
    """(users' env steps, final mean, final min) of a carried table line, or None if it has no steps."""
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    try:
        return float(cells[2].replace(",", "")), float(cells[3]), float(cells[4])
    except (IndexError, ValueError):
        return None


def _legend(fig, axes) -> None:
    """One legend for every learner drawn in any panel."""
    seen = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=6, fontsize=8)


COLORS = {"SB3-PPO": "black", "SB3-SAC": "dimgray", "PPO": "tab:blue", "DP-PPO eps=5": "tab:cyan",
          "DP-PPO eps=1": "lightblue", "NPG": "tab:green", "DP-NPG eps=5": "limegreen", "DP-NPG eps=1": "yellowgreen",
          "PG": "tab:red", "DP-PG eps=5": "salmon", "DP-PG eps=1": "pink", "DP-PPO public-init eps=5": "tab:purple",
          "DP-PPO public-init eps=1": "plum"}


def plot(rows_by_env: dict, args, carried: dict | None = None) -> None:
    """``suite.png``: final return against users' env steps, every row (carried rows: hollow squares, the bar
    down to their min); ``suite_curves.png``: the evaluation curves of the rows with runs or records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    carried = carried or {}
    envs = [e for e in ENVS if e in rows_by_env or e in carried]
    if not envs:
        return
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 4.2), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for name, runs in rows_by_env.get(env, {}).items():
            xs = [r["users_env_steps"] for r in runs if r["users_env_steps"]]
            ys = [r["final_return"] for r in runs]
            if not xs:
                continue
            x, y = sum(xs) / len(xs), sum(ys) / len(ys)
            ax.errorbar([x], [y], yerr=[[y - min(ys)], [max(ys) - y]], fmt="o", color=COLORS.get(name, "gray"),
                        label=name, capsize=3)
        for name, (x, y, low) in carried.get(env, {}).items():
            ax.errorbar([x], [y], yerr=[[y - low], [0.0]], fmt="s", mfc="none", color=COLORS.get(name, "gray"),
                        label=f"{name} †", capsize=3)
        ax.set_xscale("log")
        ax.set_title(ENVS[env]["id"])
        ax.set_xlabel("users' env steps (mean over seeds)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final return (mean; bars: min-max over seeds)")
    axes[0][0].annotate("† carried from an earlier report: bar to the min only", (0.01, 0.01),
                        xycoords="figure fraction", fontsize=7)
    _legend(fig, axes[0])
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(args.png, dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 4.2), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for name, runs in rows_by_env.get(env, {}).items():
            curves = [r["curve"] for r in runs if r["curve"]]
            if not curves:
                continue
            grid = sorted({x for c in curves for x, _ in c})
            grid = grid[:: max(1, len(grid) // 200)]
            mean = []
            for g in grid:   # the mean over seeds of each curve's last point at or before g
                vals = [next((y for x, y in reversed(c) if x <= g), c[0][1]) for c in curves]
                mean.append(sum(vals) / len(vals))
            ax.plot(grid, mean, color=COLORS.get(name, "gray"), label=name)
        ax.set_xscale("log")
        ax.set_title(ENVS[env]["id"])
        ax.set_xlabel("users' env steps")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"evaluation return ({CURVE_EPISODES} episodes; mean over seeds)")
    _legend(fig, axes[0])
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(args.curves_png, dpi=110)
    plt.close(fig)


def slow_tests() -> None:
    """The long tests the default ``pytest`` leaves out (``pytest -m slow``: multi-process runs, SIGKILL resumes, the
    audits' power checks, ...), before any row: a failure stops the suite (its rows would measure broken code)."""
    print("the long tests first: pytest -m slow", flush=True)
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "slow"], cwd=ROOT)
    if code != 0:
        raise SystemExit(f"pytest -m slow failed (exit {code}): fix it, or pass --no-slow-tests to run the rows anyway")


def run_section(name: str, args) -> None:
    """A section with its own script (``SECTIONS``): run it with this invocation's seeds and jobs (``--report``: its
    table only); skipped in one line where its optional package is missing."""
    import importlib.util

    script, requires = SECTIONS[name]
    if importlib.util.find_spec(requires) is None:
        print(f"{name}: skipped ({requires} is not installed: pip install -e \".[icu]\")")
        return
    cmd = [sys.executable, os.path.join(ROOT, "scripts", script)]
    cmd += ["--report"] if args.report else ["--seeds", *map(str, args.seeds), "--jobs", str(args.jobs)]
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one torch thread each")
    ap.add_argument("--only", dest="envs", nargs="+", default=list(ENVS) + list(SECTIONS),
                    choices=list(ENVS) + list(SECTIONS))
    ap.add_argument("--rows", nargs="+", help="only these rows (e.g. PPO 'DP-PPO eps=5' SB3-PPO)")
    ap.add_argument("--all-sb3-seeds", action="store_true", help="every seed for SB3's 1e6-step rows too")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "suite"))
    ap.add_argument("--md", default=os.path.join(ROOT, "runs", "reference", "suite.md"))
    ap.add_argument("--png", default=os.path.join(ROOT, "runs", "reference", "suite.png"))
    ap.add_argument("--curves-png", default=os.path.join(ROOT, "runs", "reference", "suite_curves.png"))
    ap.add_argument("--records", default=os.path.join(ROOT, "runs", "reference", "suite_runs.json"),
                    help="per-run records of earlier invocations (read and updated)")
    ap.add_argument("--fresh", action="store_true",
                    help="ignore the records and the previous report's lines: the table is the runs on disk")
    ap.add_argument("--report", action="store_true", help="only write the table and plots from runs on disk")
    ap.add_argument("--no-slow-tests", action="store_true",
                    help="skip the long tests (pytest -m slow) this script runs before its rows")
    args = ap.parse_args()
    if not (args.report or args.no_slow_tests):
        slow_tests()
    sections = [e for e in args.envs if e in SECTIONS]
    args.envs = [e for e in args.envs if e not in SECTIONS]
    for name in sections:
        run_section(name, args)
    if not args.envs:
        return
    wall = None if args.report else run_all(args)
    report(args, wall)


if __name__ == "__main__":
    main()
