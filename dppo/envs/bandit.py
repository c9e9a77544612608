"""Contextual bandit ([PO] Sec. 2, bandit form): users are contexts from a finite seeded population.

User u (u < population) is context x_u, drawn once from the seeded population; an episode is one
step: observe the per-action features phi(x_u, a) (a (K, p) matrix), pick a, receive a bounded
reward. Reset seeds >= population give fresh contexts from the same distribution (held-out
evaluation users), so evaluation never reuses a training user.
"""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from dppo.errors import ConfigError, PrivacyError

VARIANTS = ("linear", "nonlinear")


class ContextualBandit:
    """Factory of one-step bandit episodes (the ``env`` the learners receive).

    Rewards (mean, in [-1, 1] before noise): ``linear``: r(x, a) = theta* . phi(x, a) with
    ||phi|| <= 1 and ||theta*|| = 1 (so |r| <= 1); ``nonlinear``: r(x, a) = sin(pi theta* . phi(x, a)).
    Gaussian noise of std ``noise_std`` is added; the rollout clips rewards to +-reward_bound.

    Args:
        population: number of users (contexts) in the finite population.
        dim: p, feature dimension.
        actions: K.
        variant: "linear" or "nonlinear".
        noise_std: reward noise std.
        seed: seed of the population and of theta*.
    """

    id = "ContextualBandit"
    horizon = 1

    def __init__(self, population: int = 1000, dim: int = 5, actions: int = 4, variant: str = "linear",
                 noise_std: float = 0.1, seed: int = 0):
        if variant not in VARIANTS:
            raise ConfigError(f"env.variant must be one of {VARIANTS}, got '{variant}'")
        if population < 1 or dim < 1 or actions < 2 or noise_std < 0:
            raise ConfigError("env: need population >= 1, dim >= 1, actions >= 2, noise_std >= 0")
        self.population, self.dim, self.actions = int(population), int(dim), int(actions)
        self.variant, self.noise_std, self.seed = variant, float(noise_std), int(seed)
        rng = np.random.default_rng(self.seed)
        theta = rng.normal(size=self.dim)
        self.theta_star = theta / np.linalg.norm(theta)
        self.contexts = np.stack([self._draw(np.random.default_rng([self.seed, u])) for u in range(self.population)])
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(self.actions, self.dim), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.actions)

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        """phi(x, .) for one context: K rows of norm <= 1."""
        phi = rng.normal(size=(self.actions, self.dim))
        return phi / np.maximum(np.linalg.norm(phi, axis=1, keepdims=True), 1.0) * rng.uniform(0.5, 1.0)

    def context(self, index: int) -> np.ndarray:
        """Features of user ``index`` (a population member, or a fresh held-out context if >= population)."""
        if 0 <= index < self.population:
            return self.contexts[index]
        return self._draw(np.random.default_rng([self.seed, 1, int(index)]))

    def mean_reward(self, phi: np.ndarray) -> np.ndarray:
        """E[r(x, a)] for every row of ``phi``."""
        z = phi @ self.theta_star
        return z if self.variant == "linear" else np.sin(math.pi * z)

    def reset_seeds(self, run_seed: int, users) -> list[int]:
        """The reset seed of user u is u itself: user u is context u of the population.

        Raises:
            PrivacyError: a user id outside the population (it would alias a held-out context).
        """
        users = [int(u) for u in users]
        if any(not 0 <= u < self.population for u in users):
            raise PrivacyError(f"user id outside the bandit population of {self.population}; raise env.population "
                               f"or lower rounds * users_per_round")
        return users

    def public_seed(self, seed: int) -> int:
        """Map a public stream seed (``dppo.data.streams``, >= 0) to a held-out context: index >= population,
        so evaluation and public rollouts never show a training user's context."""
        return self.population + int(seed)

    def make(self) -> gym.Env:
        return BanditEpisode(self)

    def __repr__(self) -> str:
        return (f"ContextualBandit(population={self.population}, dim={self.dim}, actions={self.actions}, "
                f"variant={self.variant!r})")


class BanditEpisode(gym.Env):
    """One user's episode: ``reset(seed=u)`` shows context u, ``step(a)`` pays r(x_u, a) and ends."""

    def __init__(self, bandit: ContextualBandit):
        self.bandit = bandit
        self.observation_space, self.action_space = bandit.observation_space, bandit.action_space
        self._phi = None

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        self._phi = self.bandit.context(int(seed) if seed is not None else int(self.np_random.integers(2**31)))
        return self._phi.astype(np.float32), {}

    def step(self, action):
        mean = float(self.bandit.mean_reward(self._phi[int(action)][None])[0])
        reward = mean + self.bandit.noise_std * float(self.np_random.normal())
        best = float(self.bandit.mean_reward(self._phi).max())
        return self._phi.astype(np.float32), reward, True, False, {"regret": best - mean}
