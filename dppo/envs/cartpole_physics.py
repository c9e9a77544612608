"""CartPole-v1 with its physical constants as arguments: ``dppo/CartPolePhysics-v1``.

A public simulator for public pretraining: the users' env is CartPole-v1, whose constants (gravity 9.8, cart mass
1.0, pole mass 0.1, half pole length 0.5, force 10.0) are fixed in gymnasium's ``CartPoleEnv``; this env runs the
same equations, reward, termination and 500-step limit with other constants, e.g. a pole twice as long::

    python train.py algo=ppo env.id=dppo/CartPolePhysics-v1 '+env.kwargs={length: 1.0}'

With no kwargs it is CartPole-v1 step for step (tests/envs/test_cartpole_physics.py). The derived constants
(total mass, pole mass x length) are recomputed from the given ones. Its native vectorized twin (gymnasium's
``CartPoleVectorEnv`` with the same constants) is the ``vector_entry_point``, so ``env.vectorization=auto`` runs
it as fast as CartPole-v1. Importing this module registers the id.
"""
from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv

ENV_ID = "dppo/CartPolePhysics-v1"
DEFAULTS = {"gravity": 9.8, "masscart": 1.0, "masspole": 0.1, "length": 0.5, "force_mag": 10.0}


def set_physics(env, gravity: float, masscart: float, masspole: float, length: float, force_mag: float) -> None:
    """Set CartPole's constants on ``env`` (single or vector) and the two it derives from them."""
    values = {"gravity": gravity, "masscart": masscart, "masspole": masspole, "length": length,
              "force_mag": force_mag}
    for name, value in values.items():
        if not float(value) > 0:
            raise ValueError(f"{ENV_ID}: {name} must be > 0, got {value}")
        setattr(env, name, float(value))
    env.total_mass = env.masspole + env.masscart
    env.polemass_length = env.masspole * env.length


class CartPolePhysicsEnv(CartPoleEnv):
    """CartPole-v1 with the given constants (module docstring); ``length`` is half the pole's length."""

    def __init__(self, gravity: float = 9.8, masscart: float = 1.0, masspole: float = 0.1, length: float = 0.5,
                 force_mag: float = 10.0, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        set_physics(self, gravity, masscart, masspole, length, force_mag)


class CartPolePhysicsVectorEnv(CartPoleVectorEnv):
    """``num_envs`` CartPolePhysicsEnv sub-envs stepped together (gymnasium's vectorized CartPole)."""

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 500, render_mode: str | None = None,
                 gravity: float = 9.8, masscart: float = 1.0, masspole: float = 0.1, length: float = 0.5,
                 force_mag: float = 10.0):
        super().__init__(num_envs=num_envs, max_episode_steps=max_episode_steps, render_mode=render_mode)
        set_physics(self, gravity, masscart, masspole, length, force_mag)


def register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=f"{__name__}:CartPolePhysicsEnv",
                     vector_entry_point=f"{__name__}:CartPolePhysicsVectorEnv", max_episode_steps=500,
                     reward_threshold=475.0)


register()
