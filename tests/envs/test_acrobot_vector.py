"""AcrobotVectorEnv reproduces gymnasium's single Acrobot-v1 step by step (states, rewards, ends)."""
import gymnasium as gym
import numpy as np
import torch

from dppo.envs.rollout import RolloutEngine, resolve_vectorization
from dppo.envs.acrobot_vector import AcrobotVectorEnv
from dppo.envs.gym_env import GymEnvFactory


def test_vector_acrobot_matches_single_envs_step_by_step():
    n, steps = 6, 300
    rng = np.random.default_rng(0)
    singles = [gym.make("Acrobot-v1").unwrapped for _ in range(n)]
    vec = AcrobotVectorEnv(num_envs=n, max_episode_steps=10_000)
    vec.reset(seed=0)
    for i, e in enumerate(singles):
        e.reset(seed=100 + i)
        vec.state[:, i] = e.state
    live = np.ones(n, dtype=bool)
    for _ in range(steps):
        a = rng.integers(0, 3, n)
        obs, rew, term, trunc, _ = vec.step(a)
        for i, e in enumerate(singles):
            if not live[i]:
                continue
            o, r, t, _, _ = e.step(int(a[i]))
            np.testing.assert_allclose(vec.state[:, i], e.state, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(obs[i], o, rtol=1e-6, atol=1e-6)
            assert rew[i] == r and bool(term[i]) == t
            live[i] = not t
        assert not trunc.any()


def test_auto_vectorization_picks_the_native_acrobot_and_episodes_match_sync():
    native = GymEnvFactory("Acrobot-v1", horizon=120)
    sync = GymEnvFactory("Acrobot-v1", horizon=120, vectorization="sync")
    assert resolve_vectorization(native) == "native"
    torch.manual_seed(0)  # a fixed policy (with an arbitrary one, an action whose uniform sits within an ulp of a
    policy = torch.nn.Linear(6, 3)  # CDF step may flip between backends whose sin/cos differ in the last bit)

    class P(torch.nn.Module):
        def logits(self, obs):
            return policy(obs)

    seeds = [3, 5, 8, 13]
    u = torch.rand(4, 120, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = RolloutEngine(native).run(P(), seeds, u, reward_bound=1.0)
    b = RolloutEngine(sync).run(P(), seeds, u, reward_bound=1.0)
    assert torch.equal(a.mask, b.mask) and torch.equal(a.actions, b.actions)
    torch.testing.assert_close(a.obs, b.obs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a.returns, b.returns)
