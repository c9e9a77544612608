"""A native vectorized Acrobot-v1: gymnasium's ``AcrobotEnv`` dynamics on arrays of sub-envs.

gymnasium ships a vectorized CartPole (``CartPoleVectorEnv``) but not Acrobot, whose single-env step
integrates the book dynamics with RK4 in ~100 scalar numpy operations (~0.2 ms a step): a round of
80 users' rollouts of up to 500 steps took seconds. ``AcrobotVectorEnv`` runs the same equations
(``AcrobotEnv._dsdt``, one RK4 step of dt = 0.2, angles wrapped to [-pi, pi], velocities bounded,
reward -1 until the tip rises above the bar) on a (4, n) state array, so one step of n sub-envs
costs about one single-env step. ``tests/envs/test_acrobot_vector.py`` checks it against
``gym.make("Acrobot-v1")`` step by step.

Importing this module registers it as Acrobot-v1's ``vector_entry_point`` (only if gymnasium has
none), which makes ``env.vectorization=auto`` pick it, as it picks CartPole's. The rollout engine's
``native`` backend seeds each sub-env's start state from a single env reset with the user's seed,
so the episodes are the single env's episodes.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.acrobot import AcrobotEnv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

ENTRY_POINT = "dppo.envs.acrobot_vector:AcrobotVectorEnv"


class AcrobotVectorEnv(VectorEnv):
    """``num_envs`` Acrobot-v1 sub-envs stepped together (book dynamics, no torque noise).

    ``state`` is (4, num_envs) float64: theta1, theta2, dtheta1, dtheta2 (what the single env calls
    ``state``). Autoreset: next step (as ``CartPoleVectorEnv``).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 500, render_mode: str | None = None):
        if render_mode is not None:
            raise ValueError("AcrobotVectorEnv does not render")
        self.num_envs, self.max_episode_steps, self.render_mode = int(num_envs), int(max_episode_steps), None
        self.state = None
        self.steps = np.zeros(self.num_envs, dtype=np.int32)
        self.prev_done = np.zeros(self.num_envs, dtype=np.bool_)
        high = np.array([1.0, 1.0, 1.0, 1.0, AcrobotEnv.MAX_VEL_1, AcrobotEnv.MAX_VEL_2], dtype=np.float32)
        self.single_observation_space = spaces.Box(low=-high, high=high, dtype=np.float32)
        self.single_action_space = spaces.Discrete(3)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.torque = np.asarray(AcrobotEnv.AVAIL_TORQUE, dtype=np.float64)

    # ---- dynamics (AcrobotEnv._dsdt, "book" form, elementwise) ---------------------------------------
    @staticmethod
    def _dsdt(s: np.ndarray, a: np.ndarray) -> np.ndarray:
        m1, m2 = AcrobotEnv.LINK_MASS_1, AcrobotEnv.LINK_MASS_2
        l1, lc1, lc2 = AcrobotEnv.LINK_LENGTH_1, AcrobotEnv.LINK_COM_POS_1, AcrobotEnv.LINK_COM_POS_2
        I1 = I2 = AcrobotEnv.LINK_MOI
        g, pi = 9.8, np.pi
        theta1, theta2, dtheta1, dtheta2 = s
        cos2, sin2 = np.cos(theta2), np.sin(theta2)  # the same values the single env computes twice
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos2) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos2) + I2
        phi2 = m2 * lc2 * g * np.cos(theta1 + theta2 - pi / 2.0)
        phi1 = (-m2 * l1 * lc2 * dtheta2**2 * sin2
                - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin2
                + (m1 * lc1 + m2 * l1) * g * np.cos(theta1 - pi / 2)
                + phi2)
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * sin2 - phi2) / (
            m2 * lc2**2 + I2 - d2**2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return np.stack((dtheta1, dtheta2, ddtheta1, ddtheta2))

    def _rk4(self, s: np.ndarray, a: np.ndarray) -> np.ndarray:
        """One RK4 step of length dt (gymnasium's ``rk4`` with t = [0, dt]; the torque is held constant)."""
        dt = AcrobotEnv.dt
        dt2 = dt / 2.0
        k1 = self._dsdt(s, a)
        k2 = self._dsdt(s + dt2 * k1, a)
        k3 = self._dsdt(s + dt2 * k2, a)
        k4 = self._dsdt(s + dt * k3, a)
        return s + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)

    @staticmethod
    def _wrap(x: np.ndarray, m: float, M: float) -> np.ndarray:
        diff = M - m
        x = x.copy()
        while (x > M).any():
            x = np.where(x > M, x - diff, x)
        while (x < m).any():
            x = np.where(x < m, x + diff, x)
        return x

    def _obs(self) -> np.ndarray:
        s = self.state
        return np.stack((np.cos(s[0]), np.sin(s[0]), np.cos(s[1]), np.sin(s[1]), s[2], s[3]), axis=1).astype(np.float32)

    def step(self, action):
        a = self.torque[np.asarray(action, dtype=np.int64)]
        ns = self._rk4(self.state, a)
        ns[0] = self._wrap(ns[0], -np.pi, np.pi)
        ns[1] = self._wrap(ns[1], -np.pi, np.pi)
        ns[2] = np.minimum(np.maximum(ns[2], -AcrobotEnv.MAX_VEL_1), AcrobotEnv.MAX_VEL_1)
        ns[3] = np.minimum(np.maximum(ns[3], -AcrobotEnv.MAX_VEL_2), AcrobotEnv.MAX_VEL_2)
        self.state = ns
        terminated = -np.cos(ns[0]) - np.cos(ns[1] + ns[0]) > 1.0
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        reward = np.where(terminated, 0.0, -1.0)
        if self.prev_done.any():  # sub-envs that ended on the last step start a new episode instead
            k = int(self.prev_done.sum())
            self.state[:, self.prev_done] = self.np_random.uniform(low=-0.1, high=0.1, size=(4, k)).astype(np.float32)
            self.steps[self.prev_done] = 0
            reward[self.prev_done] = 0.0
            terminated[self.prev_done] = False
            truncated[self.prev_done] = False
        self.prev_done = np.logical_or(terminated, truncated)
        return self._obs(), reward, terminated, truncated, {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.state = self.np_random.uniform(low=-0.1, high=0.1, size=(4, self.num_envs)).astype(np.float32).astype(np.float64)
        self.steps = np.zeros(self.num_envs, dtype=np.int32)
        self.prev_done = np.zeros(self.num_envs, dtype=np.bool_)
        return self._obs(), {}


def register() -> None:
    """Make this Acrobot-v1's vector entry point (a no-op if gymnasium already has one)."""
    spec = gym.registry.get("Acrobot-v1")
    if spec is not None and spec.vector_entry_point is None:
        spec.vector_entry_point = ENTRY_POINT


register()
