"""Throughput, side by side in one run: env steps/s of a batched simulator (the limit), the env alone, dppo's
collection of a round's users, dppo's whole rounds (PPO, DP-PPO, DP-NPG) and, where installed, SB3's PPO; each
as a ratio to the limit measured in this run.

    python scripts/bench_throughput.py [--only icu cartpole] [--rounds 4] [--sb3-steps 20000]

The limit steps N sub-envs at once on plain arrays (ICU-Sepsis: the package's tables, inverse-CDF draws over
cumulative rows computed once; CartPole: its equations on (4, N) arrays), random actions, finished sub-envs
restarted. "env alone" steps the vector env dppo runs (``ICUSepsisVectorEnv``, gymnasium's
``CartPoleVectorEnv``) the same way. "collection" is ``EpisodeCollector.users`` for one round of users of the
experiment file's size at the initial policy. A whole round is ``train_round`` (collection, the update, the
releases) of ``+experiment=<env>_<algo>``, its rounds after the first timed, env steps = the users' steps; SB3
PPO runs its defaults (one env, ``MlpPolicy``; ICU-Sepsis observations one-hot, as SB3 reads Discrete). One
torch thread (``OMP_NUM_THREADS=1``): the ratios are what one core gives.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYTHONWARNINGS", "ignore")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

N_LIMIT = 1000


def timed(fn, min_s: float = 1.0) -> float:
    """Steps per second of ``fn() -> steps``, repeated for at least ``min_s`` seconds (after one warm-up call)."""
    fn()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_s:
        steps += fn()
    return steps / (time.perf_counter() - t0)


# ---- the limits -------------------------------------------------------------------------------------------
def icu_limit(n: int = N_LIMIT) -> float:
    from dppo.envs.icu_sepsis_vector import package_tables

    t = package_tables()
    P = np.asarray(t["P"], dtype=np.float64)
    S, A = P.shape[:2]
    cdf = np.cumsum(P, axis=-1)
    cdf /= cdf[..., -1:]
    d0 = np.cumsum(np.asarray(t["d0"], dtype=np.float64))
    d0 /= d0[-1]
    terminal = np.zeros(S, dtype=bool)
    terminal[list(t["terminal"])] = True
    rng = np.random.default_rng(0)
    state = np.searchsorted(d0, rng.random(n), side="right")

    def run(steps: int = 50) -> int:
        nonlocal state
        for _ in range(steps):
            a = rng.integers(0, A, n)
            rows = cdf[state, a]
            state = (rows <= rng.random(n)[:, None]).sum(1)
            done = terminal[state]
            if done.any():
                state[done] = np.searchsorted(d0, rng.random(int(done.sum())), side="right")
        return steps * n

    return timed(run)


def cartpole_limit(n: int = N_LIMIT) -> float:
    g, mc, mp, l, f, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    rng = np.random.default_rng(0)
    s = rng.uniform(-0.05, 0.05, (4, n))

    def run(steps: int = 200) -> int:
        nonlocal s
        for _ in range(steps):
            x, xd, th, thd = s
            force = np.where(rng.integers(0, 2, n) == 1, f, -f)
            c, si = np.cos(th), np.sin(th)
            temp = (force + mp * l * thd ** 2 * si) / (mc + mp)
            tha = (g * si - c * temp) / (l * (4.0 / 3.0 - mp * c ** 2 / (mc + mp)))
            xa = temp - mp * l * tha * c / (mc + mp)
            s = np.stack([x + tau * xd, xd + tau * xa, th + tau * thd, thd + tau * tha])
            done = (np.abs(s[0]) > 2.4) | (np.abs(s[2]) > 0.2095)
            if done.any():
                s[:, done] = rng.uniform(-0.05, 0.05, (4, int(done.sum())))
        return steps * n

    return timed(run)


# ---- the env alone, collection, whole rounds ------------------------------------------------------------
def env_alone(env_id: str, n: int = N_LIMIT) -> float:
    import gymnasium as gym

    from dppo.envs.gym_env import GymEnvFactory

    factory = GymEnvFactory(env_id)
    vec = gym.make_vec(factory.id, num_envs=n, vectorization_mode="vector_entry_point", **factory.kwargs)
    vec.reset(seed=0)
    A = vec.single_action_space.n
    rng = np.random.default_rng(0)

    def run(steps: int = 50) -> int:
        for _ in range(steps):
            vec.step(rng.integers(0, A, n))
        return steps * n

    return timed(run)


def experiment_overrides(env: str, algo: str, rounds: int) -> list[str]:
    return [f"+experiment={env}_{algo}", f"rounds={rounds}", "progress=false", "eval_every=null",
            "logger.tensorboard=false", "logger.csv=false", "seed=100"]


def collection(env: str) -> float:
    from dppo.api import make_config
    from dppo.build import build

    cfg = make_config(experiment_overrides(env, "dp_ppo", 1))
    learner = build(cfg).learner
    collector, m = learner.collector, int(cfg.users_per_round)
    r = iter(range(10 ** 6))   # the DP-PPO file's round size (the PPO files of CartPole run 2 users a round)

    def run() -> int:
        batch, _ = collector.users(learner.policy, list(range(m)), next(r), 1, None)
        return batch.env_steps

    return timed(run, min_s=2.0)


class _Meter:
    """A callback timing every round after the first, and the users' env steps the collector hands it."""

    def __init__(self):
        self.t, self.steps, self.wall, self.round_steps = None, 0, 0.0, 0

    def on_train_start(self, trainer): ...
    def on_checkpoint(self, trainer, path): ...
    def on_train_end(self, trainer): ...

    def on_round_start(self, trainer, r):
        self.t, self.round_steps = time.perf_counter(), 0

    def on_round_end(self, trainer, r, metrics):
        if r > 0:
            self.wall += time.perf_counter() - self.t
            self.steps += self.round_steps
        return True


def whole_round(env: str, algo: str, rounds: int) -> float:
    from dppo.api import finish, make_config, start
    from dppo.training.callbacks import Callback

    meter = type("Meter", (_Meter, Callback), {})()
    trainer, dist = start(make_config(experiment_overrides(env, algo, rounds)), None, callbacks=[meter])
    collector = trainer.learner.collector
    users = collector.users

    def counted(*args, **kwargs):
        batch, public = users(*args, **kwargs)
        meter.round_steps += batch.env_steps
        return batch, public

    collector.users = counted
    finish(trainer, dist)
    return meter.steps / max(meter.wall, 1e-9)


def sb3_ppo(env_id: str, steps: int) -> float | None:
    try:
        import gymnasium as gym
        from stable_baselines3 import PPO
    except ImportError:
        return None
    from dppo.envs.gym_env import GymEnvFactory

    env = GymEnvFactory(env_id).make()
    model = PPO("MlpPolicy", env, seed=0, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    return model.num_timesteps / (time.perf_counter() - t0)


ENVS = {"icu": ("icu_sepsis", "icu_sepsis:Sepsis/ICU-Sepsis-v2", icu_limit),
        "cartpole": ("cartpole", "CartPole-v1", cartpole_limit)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(ENVS), default=sorted(ENVS))
    ap.add_argument("--rounds", type=int, default=4, help="rounds of each whole-round row (the first not timed)")
    ap.add_argument("--sb3-steps", type=int, default=20_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| env | path | env steps/s | ratio to the limit |")
    print("|---|---|---|---|")
    for key in args.only:
        name, env_id, limit_fn = ENVS[key]
        limit = limit_fn()
        rows = [(f"batched simulator, {N_LIMIT} sub-envs (the limit)", limit),
                (f"the env alone, {N_LIMIT} sub-envs", env_alone(env_id)),
                ("dppo collection, one round of users", collection(name))]
        for algo in ("ppo", "dp_ppo", "dp_npg"):
            rows.append((f"dppo whole round, {algo}", whole_round(name, algo, args.rounds)))
        sb3 = sb3_ppo(env_id, args.sb3_steps)
        rows.append(("SB3 PPO, defaults", sb3))
        for label, rate in rows:
            cell = "not installed" if rate is None else f"{rate:,.0f}"
            ratio = "" if rate is None else f"{rate / limit:.4f}"
            print(f"| {name} | {label} | {cell} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
