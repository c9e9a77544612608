"""Peak memory of a round against users per round and against the horizon, ours beside Stable-Baselines3's.

Each row runs in its own process (peak resident memory, ``ru_maxrss``, of that process alone): ``dppo.train``
with ``algo=dp_ppo group_size=1`` for 2 rounds, and SB3's PPO (defaults, ``n_envs`` env instances in a
DummyVecEnv, one rollout of n_steps x n_envs steps and its update), on the same env.

    python scripts/bench_env_memory.py                       # ICU-Sepsis (pip install -e ".[icu]")
    python scripts/bench_env_memory.py --env CartPole-v1
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_child_result, run_child  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_ours(env_id: str, users: int, horizon: int) -> dict:
    sys.path.insert(0, ROOT)
    import dppo

    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        dppo.train([f"env.id={env_id}", "algo=dp_ppo", "group_size=1", "rounds=2", f"users_per_round={users}",
                    f"env.horizon={horizon}", "progress=false", "eval_episodes=10"], run_dir=os.path.join(d, "r"))
    return {"seconds": time.perf_counter() - t}


def child_sb3(env_id: str, n_envs: int, horizon: int) -> dict:
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    module, _, name = env_id.rpartition(":")
    if module:
        __import__(module)
    t = time.perf_counter()
    vec = make_vec_env(lambda: gym.make(name, max_episode_steps=horizon), n_envs=n_envs)
    model = PPO("MlpPolicy", vec, verbose=0, seed=0, device="cpu")
    model.learn(total_timesteps=model.n_steps * n_envs)
    return {"seconds": time.perf_counter() - t}


def run_row(kind: str, env_id: str, size: int, horizon: int) -> dict:
    return run_child(__file__, [kind, "--env", env_id, "--size", str(size), "--horizon", str(horizon)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="icu_sepsis:Sepsis/ICU-Sepsis-v2")
    ap.add_argument("--child", choices=["ours", "sb3"])
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--horizon", type=int, default=500)
    ap.add_argument("--users", type=int, nargs="+", default=[100, 1000, 4000])
    ap.add_argument("--horizons", type=int, nargs="+", default=[50, 500, 5000])
    ap.add_argument("--sb3-envs", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    if args.child:
        fn = child_ours if args.child == "ours" else child_sb3
        print_child_result(fn(args.env, args.size, args.horizon))
        return
    rows = [("ours", u, 500) for u in args.users] + [("ours", 1000, h) for h in args.horizons if h != 500]
    try:
        import stable_baselines3  # noqa: F401

        rows += [("sb3", n, 500) for n in args.sb3_envs]
    except ImportError:
        print("(stable-baselines3 not installed: pip install -e \".[bench]\"; its rows are skipped)")
    print(f"{args.env}: peak resident memory of one process\n")
    print("| run | users per round (ours) / n_envs (SB3) | horizon | peak MiB | s |")
    print("|---|---|---|---|---|")
    for kind, size, horizon in rows:
        r = run_row(kind, args.env, size, horizon)
        name = "dppo dp_ppo, 2 rounds" if kind == "ours" else "SB3 PPO, one rollout + update"
        if "error" in r:
            print(f"| {name} | {size} | {horizon} | failed: {r['error']} | |")
        else:
            print(f"| {name} | {size} | {horizon} | {r['peak_mib']:.0f} | {r['seconds']:.1f} |")


if __name__ == "__main__":
    main()
