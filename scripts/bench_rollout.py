"""Collection speed, side by side in one run: env steps/s of the former lockstep collector, the
RolloutEngine on each vectorization backend, and (if installed) Stable-Baselines3's DummyVecEnv.

    python scripts/bench_rollout.py [--env CartPole-v1] [--users 10] [--group 8] [--repeats 5]

Every collector runs the same policies on users x group episodes (one "round"): an untrained 2x64 MLP
(short episodes, as in the first rounds) and, on CartPole, a stochastic balancing controller (long
episodes, as in the late rounds of a run that learns). The printed ratio is each collector's
steps/s over the lockstep collector's, measured in this run.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dppo.data import streams  # noqa: E402
from dppo.envs.rollout import Episodes, RolloutEngine, clip_rewards  # noqa: E402
from dppo.envs.gym_env import GymEnvFactory  # noqa: E402
from dppo.policies.mlp import MLPPolicy  # noqa: E402


def collect_episodes(policy, env_factory, reset_seeds: list[int], *, reward_bound: float | None,
                     generator: torch.Generator | None = None) -> Episodes:
    """The former lockstep collector (the reference row): one episode per reset seed, all users stepped in
    lockstep with batched policy calls, envs built per call and actions drawn from one shared generator."""
    m, horizon = len(reset_seeds), env_factory.horizon
    envs = [env_factory.make() for _ in range(m)]
    obs_list, act_list, rew_list = [[] for _ in range(m)], [[] for _ in range(m)], [[] for _ in range(m)]
    cur = [np.asarray(e.reset(seed=int(s))[0], dtype=np.float32) for e, s in zip(envs, reset_seeds)]
    active = list(range(m))
    for _ in range(horizon):
        if not active:
            break
        batch = np.stack([cur[i] for i in active]).reshape(len(active), -1)
        actions, _ = policy.sample(torch.as_tensor(batch), generator=generator)
        still = []
        for j, i in enumerate(active):
            a = int(actions[j])
            nxt, r, term, trunc, _ = envs[i].step(a)
            obs_list[i].append(cur[i]), act_list[i].append(a), rew_list[i].append(float(r))
            cur[i] = np.asarray(nxt, dtype=np.float32)
            if not (term or trunc):
                still.append(i)
        active = still
    for e in envs:
        e.close()
    T = max(1, max(len(a) for a in act_list))
    obs = torch.zeros((m, T) + np.asarray(obs_list[0][0]).reshape(-1).shape)
    actions = torch.zeros(m, T, dtype=torch.long)
    rewards = torch.zeros(m, T, dtype=torch.float64)
    mask = torch.zeros(m, T, dtype=torch.bool)
    for i in range(m):
        n = len(act_list[i])
        obs[i, :n] = torch.as_tensor(np.stack(obs_list[i])).reshape(n, -1)
        actions[i, :n] = torch.as_tensor(act_list[i])
        rewards[i, :n] = torch.as_tensor(clip_rewards(np.asarray(rew_list[i]), reward_bound)[0])
        mask[i, :n] = True
    return Episodes(obs, actions, rewards, mask, rewards.sum(1), torch.zeros(m))


def timed(fn, repeats: int) -> float:
    """Best-of-``repeats`` env steps per second of ``fn() -> steps``."""
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        steps = fn()
        best = max(best, steps / (time.perf_counter() - t0))
    return best


def balancing_policy(factory):
    """CartPole: pi(right | s) = sigmoid(20 theta + 5 theta_dot), a log-linear policy that keeps the pole up."""
    from dppo.policies.loglinear import LogLinearPolicy

    policy = LogLinearPolicy(factory.observation_space, factory.action_space)
    with torch.no_grad():
        policy.theta[5:] = torch.tensor([0.0, 0.0, 20.0, 5.0, 0.0])
    return policy


def bench(args, policy, label: str) -> None:
    n = args.users * args.group
    base = GymEnvFactory(args.env)
    seeds = [s for u in range(args.users) for s in streams.user_reset_seeds(0, u, args.group)]
    H = base.horizon
    uniforms = torch.cat([torch.rand(args.group, H, generator=streams.user_generator(0, u, 0), dtype=torch.float64)
                          for u in range(args.users)])
    rows = []
    gen = torch.Generator().manual_seed(0)
    rows.append(("lockstep (former collector)",
                 timed(lambda: int(collect_episodes(policy, base, seeds, reward_bound=1.0, generator=gen).mask.sum()),
                       args.repeats)))
    for mode in ("native", "sync", "async", "none"):
        try:
            engine = RolloutEngine(GymEnvFactory(args.env, vectorization=mode))
            engine.run(policy, seeds, uniforms, reward_bound=1.0)  # builds the envs once, as a run does
        except Exception as err:  # noqa: BLE001 - e.g. no native implementation for this env
            print(f"  {mode}: skipped ({str(err).splitlines()[0]})")
            continue
        rows.append((f"RolloutEngine, vectorization={mode}",
                     timed(lambda: engine.run(policy, seeds, uniforms, reward_bound=1.0).env_steps, args.repeats)))
        engine.close()
    try:
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError:
        print("  stable-baselines3 not installed (pip install -e '.[bench]'): SB3 row skipped")
    else:
        venv = make_vec_env(args.env, n_envs=8, seed=0)

        def sb3_steps(total=n * 60):
            obs = venv.reset()
            for _ in range(total // 8):
                with torch.no_grad():
                    a = policy.sample(torch.as_tensor(obs, dtype=torch.float32), generator=gen)[0].numpy()
                obs, _, _, _ = venv.step(a)
            return (total // 8) * 8

        rows.append(("SB3 DummyVecEnv, 8 envs", timed(sb3_steps, args.repeats)))
    ref = rows[0][1]
    lengths = engine_lengths(base, policy, seeds, uniforms)
    print(f"{args.env}, {args.users} users x {args.group} rollouts, {label} (mean episode length {lengths:.0f}), "
          f"best of {args.repeats}")
    print(f"{'collector':<38} {'env steps/s':>12} {'vs lockstep':>12}")
    for name, sps in rows:
        print(f"{name:<38} {sps:>12,.0f} {sps / ref:>11.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = GymEnvFactory(args.env)
    bench(args, MLPPolicy(base.observation_space, base.action_space), "untrained 2x64 MLP")
    if args.env.startswith("CartPole"):
        bench(args, balancing_policy(base), "balancing controller")



def engine_lengths(factory, policy, seeds, uniforms) -> float:
    return float(RolloutEngine(factory).run(policy, seeds, uniforms, reward_bound=1.0).lengths.double().mean())


if __name__ == "__main__":
    main()
