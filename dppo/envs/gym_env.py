"""Gymnasium adapter: an env factory whose episodes are users with their own reset seeds."""
from __future__ import annotations

import gymnasium as gym

import dppo.envs.acrobot_vector  # noqa: F401 - registers Acrobot-v1's native vectorized implementation
import dppo.envs.cartpole_physics  # noqa: F401 - registers dppo/CartPolePhysics-v1 (CartPole-v1's constants as kwargs)

from dppo.envs.rollout import VECTORIZATION
from dppo.errors import ConfigError


class GymEnvFactory:
    """Makes ``gymnasium`` envs by id. A user is one episode reset with its own seed.

    Args:
        id: gymnasium env id (e.g. ``CartPole-v1``).
        horizon: maximum episode length; ``None`` uses the env's own ``max_episode_steps``.
        kwargs: extra keyword arguments for ``gym.make``.
        vectorization: how batches of episodes run (``dppo.envs.rollout``): ``auto`` (the env's native
            vectorized implementation if it has one, e.g. CartPole, else ``sync``), ``native``, ``sync``,
            ``async`` (gymnasium's vector envs) or ``none`` (a list of single envs).
    """

    def __init__(self, id: str, horizon: int | None = None, kwargs: dict | None = None,
                 vectorization: str = "auto"):
        if vectorization not in VECTORIZATION:
            raise ConfigError(f"env.vectorization must be one of {VECTORIZATION}, got '{vectorization}'")
        self.vectorization = vectorization
        self.id = str(id)
        self.kwargs = dict(kwargs or {})
        try:
            spec = gym.spec(self.id)
        except gym.error.DeprecatedEnv as err:   # e.g. Taxi-v3: gymnasium names the replacement version
            raise ConfigError(f"env.id '{self.id}' is deprecated in gymnasium {gym.__version__}: {err}") from None
        except Exception:  # noqa: BLE001 - gymnasium raises several error types for unknown ids
            raise ConfigError(f"unknown env.id '{self.id}': not a registered gymnasium environment "
                              f"(e.g. CartPole-v1, Acrobot-v1, FrozenLake-v1)") from None
        if horizon is not None and int(horizon) < 1:
            raise ConfigError(f"env.horizon must be >= 1 (or null for the env's own limit), got {horizon}")
        self.horizon = int(horizon) if horizon is not None else (spec.max_episode_steps or 1000)
        probe = self.make()
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()

    def make(self) -> gym.Env:
        """A fresh env instance (no episode-step limit wrapper: the horizon is enforced by the rollout)."""
        return gym.make(self.id, max_episode_steps=self.horizon, **self.kwargs)

    def __repr__(self) -> str:
        return f"GymEnvFactory(id={self.id!r}, horizon={self.horizon})"

