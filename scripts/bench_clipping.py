"""Cost of one DP-PG update relative to one PG update (CartPole 2x64 MLP, 1024 steps from 10 users).

Measured side by side in one process:
  pg           plain backward of the summed REINFORCE loss (non-private twin)
  dppo (vmap)  our path: torch.func per-user gradients + clip_per_user + Gaussian noise
  opacus hooks Opacus GradSampleModule per-step gradients, grouped by user, clipped, noised
Usage: python scripts/bench_clipping.py [--repeats 30]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dppo.algos.pg import per_user_gradients
from dppo.envs.gym_env import GymEnvFactory
from dppo.policies.mlp import MLPPolicy
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.clipping import GaussianSumPrivatizer


def make_batch(m=10, total=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((m,), total // m)
    lengths[: total - int(lengths.sum())] += 1
    T = int(lengths.max())
    obs = torch.randn(m, T, 4, generator=g)
    actions = torch.randint(0, 2, (m, T), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(m, T, generator=g) * mask
    return obs, actions, adv, mask


def timeit(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    env = GymEnvFactory("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space)
    obs, actions, adv, mask = make_batch()
    privatizer = GaussianSumPrivatizer(PrivacyContext(5.0, 1e-5, noise=NoiseSource(0)), max_grad_norm=1.0)  # seeded: as measured (bench_noise.py times the secure draw)
    flat_obs, flat_act, flat_adv = obs[mask], actions[mask], adv[mask]
    user_of_step = torch.arange(obs.shape[0])[:, None].expand_as(mask)[mask]

    def pg_update():
        policy.zero_grad()
        (-(policy.log_prob(flat_obs, flat_act) * flat_adv).sum() / 10).backward()

    def dppo_update():
        privatizer.release_mean(per_user_gradients(policy, obs, actions, adv), 0)

    from opacus import GradSampleModule

    gsm = GradSampleModule(MLPPolicy(env.observation_space, env.action_space))

    def opacus_update():
        gsm.zero_grad()
        (-(gsm(flat_obs, flat_act) * flat_adv).sum()).backward()
        per_step = torch.cat([p.grad_sample.reshape(len(flat_obs), -1) for p in gsm.parameters()], dim=1)
        per_user = torch.zeros(obs.shape[0], per_step.shape[1]).index_add_(0, user_of_step, per_step)
        privatizer.release_mean(per_user, 0)

    t_pg = timeit(pg_update, args.repeats)
    t_ours = timeit(dppo_update, args.repeats)
    t_opacus = timeit(opacus_update, args.repeats)
    print(f"steps=1024 users=10 params={sum(p.numel() for p in policy.parameters())} repeats={args.repeats}")
    print(f"pg update (non-private)        {t_pg * 1e3:8.2f} ms   1.00x")
    print(f"dp-pg update, dppo torch.func  {t_ours * 1e3:8.2f} ms   {t_ours / t_pg:5.2f}x")
    print(f"dp-pg update, opacus hooks     {t_opacus * 1e3:8.2f} ms   {t_opacus / t_pg:5.2f}x")


if __name__ == "__main__":
    main()
