"""dppo/CartPolePhysics-v1: CartPole-v1 step for step with its default constants, the book's Euler step with
other constants, and a native vector twin that matches the single env."""
import math

import gymnasium as gym
import numpy as np
import pytest

from dppo.envs.cartpole_physics import ENV_ID, CartPolePhysicsVectorEnv
from dppo.envs.gym_env import GymEnvFactory
from dppo.envs.rollout import resolve_vectorization


def rollout(env, seed: int, actions) -> list:
    obs, _ = env.reset(seed=seed)
    out = [obs]
    for a in actions:
        obs, r, term, trunc, _ = env.step(int(a))
        out.append((obs, r, term, trunc))
        if term or trunc:
            break
    return out


def test_default_constants_reproduce_cartpole_v1_exactly():
    actions = np.random.default_rng(0).integers(0, 2, 600)
    for seed in range(5):
        a, b = rollout(gym.make("CartPole-v1"), seed, actions), rollout(gym.make(ENV_ID), seed, actions)
        assert len(a) == len(b)
        for x, y in zip(a[1:], b[1:]):
            np.testing.assert_array_equal(x[0], y[0])
            assert x[1:] == y[1:]


def euler_step(state, action, g, mc, mp, half_len, force_mag, tau=0.02):
    """The CartPole equations (Barto, Sutton & Anderson 1983, as gymnasium writes them), computed here."""
    x, x_dot, th, th_dot = state
    force = force_mag if action == 1 else -force_mag
    total, pml = mc + mp, mp * half_len
    temp = (force + pml * th_dot ** 2 * math.sin(th)) / total
    th_acc = (g * math.sin(th) - math.cos(th) * temp) / (half_len * (4.0 / 3.0 - mp * math.cos(th) ** 2 / total))
    x_acc = temp - pml * th_acc * math.cos(th) / total
    return np.array([x + tau * x_dot, x_dot + tau * x_acc, th + tau * th_dot, th_dot + tau * th_acc])


def test_other_constants_follow_the_equations_of_motion():
    physics = {"gravity": 12.0, "masscart": 2.0, "masspole": 0.3, "length": 1.0, "force_mag": 7.0}
    env = gym.make(ENV_ID, **physics).unwrapped
    env.reset(seed=3)
    state = np.array(env.state, dtype=np.float64)
    for t in range(20):
        action = t % 2
        expected = euler_step(state, action, physics["gravity"], physics["masscart"], physics["masspole"],
                              physics["length"], physics["force_mag"])
        env.step(action)
        np.testing.assert_allclose(np.array(env.state, dtype=np.float64), expected, rtol=1e-10, atol=1e-12)
        state = expected
    with pytest.raises(ValueError, match="length must be > 0"):
        gym.make(ENV_ID, length=0.0)


def test_vector_twin_matches_the_single_env_and_auto_picks_it():
    physics = {"length": 1.0, "masspole": 0.2}
    n = 4
    singles = [gym.make(ENV_ID, **physics).unwrapped for _ in range(n)]
    vec = CartPolePhysicsVectorEnv(num_envs=n, max_episode_steps=10_000, **physics)
    vec.reset(seed=0)
    for i, e in enumerate(singles):
        e.reset(seed=50 + i)
        vec.state[:, i] = e.state
    rng = np.random.default_rng(1)
    live = np.ones(n, dtype=bool)
    for _ in range(100):
        a = rng.integers(0, 2, n)
        vec.step(a)
        for i, e in enumerate(singles):
            if live[i]:
                _, _, term, _, _ = e.step(int(a[i]))
                np.testing.assert_allclose(vec.state[:, i], e.state, rtol=1e-6, atol=1e-7)
                live[i] = not term
        if not live.any():
            break
    factory = GymEnvFactory(ENV_ID, kwargs=physics)
    assert resolve_vectorization(factory) == "native" and factory.horizon == 500
    assert factory.make().unwrapped.polemass_length == pytest.approx(0.2)
