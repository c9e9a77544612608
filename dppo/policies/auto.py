"""``policy=auto`` (the default): the policy the env's action space calls for, as Stable-Baselines3's
``MlpPolicy`` picks its distribution from the action space.

* ``Discrete(K)`` actions: a softmax MLP (``MLPPolicy``, ``policy=mlp``);
* a 1-d ``Box`` of actions: a Gaussian MLP (``GaussianMLPPolicy``, ``policy=gaussian``), tanh-squashed
  into the Box by default;
* ``MultiDiscrete`` / ``MultiBinary`` actions: one softmax per component (``MultiDiscreteMLPPolicy``,
  ``policy=multi_discrete``);
* anything else (Dict or Tuple actions, Box actions of rank > 1): a one-line error naming the choices.

Observations of every kind SB3 reads (Box, Discrete one-hot, MultiDiscrete, MultiBinary, Tuple/Dict of these) go
through ``dppo.policies.observations``.
"""
from __future__ import annotations

import gymnasium as gym

from dppo.errors import ConfigError
from dppo.policies.gaussian import GaussianMLPPolicy
from dppo.policies.mlp import MLPPolicy
from dppo.policies.multi_discrete import MultiDiscreteMLPPolicy, action_components


def auto_policy(observation_space: gym.Space, action_space: gym.Space, hidden_sizes=(64, 64),
                activation: str = "tanh", normalize_obs: bool = False, log_std: str | None = None,
                log_std_init: float | None = None, log_std_min: float | None = None, log_std_max: float | None = None,
                squash: str | None = None):
    """The MLP policy for ``action_space`` (module docstring). Its signature is the list of keys ``policy=auto``
    takes (the builder checks a config's keys and types against it).

    Args:
        observation_space, action_space: the env's spaces (passed by the builder).
        hidden_sizes, activation: the MLP body of either policy.
        normalize_obs: the softmax MLP's observation scaling onto [-1, 1] from the observation bounds.
        log_std, log_std_init, log_std_min, log_std_max, squash: options of the Gaussian policy, for Box actions
            only (null: ``GaussianMLPPolicy``'s default).
    """
    given = {"log_std": log_std, "log_std_init": log_std_init, "log_std_min": log_std_min,
             "log_std_max": log_std_max, "squash": squash}
    box_options = {k: v for k, v in given.items() if v is not None}
    if isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        if box_options:
            raise ConfigError(f"policy.{sorted(box_options)[0]} applies to Box (continuous) actions; the env's "
                              f"actions are {action_space}: remove it (policy=auto is a softmax MLP here)")
        cls = MultiDiscreteMLPPolicy if action_components(action_space) is not None else MLPPolicy
        return cls(observation_space, action_space, hidden_sizes=hidden_sizes, activation=activation,
                   normalize_obs=normalize_obs)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        if normalize_obs:
            raise ConfigError("policy.normalize_obs applies to the softmax MLPs (Discrete actions): remove it")
        return GaussianMLPPolicy(observation_space, action_space, hidden_sizes=hidden_sizes, activation=activation,
                                 **box_options)
    raise ConfigError(f"policy=auto has no policy for the action space {action_space}: it builds a softmax MLP for "
                      f"Discrete actions (policy=mlp), one softmax per component for MultiDiscrete/MultiBinary "
                      f"(policy=multi_discrete) and a Gaussian MLP for 1-d Box actions (policy=gaussian); flatten "
                      f"the actions with a wrapper (env.wrappers=[...]) or pass your own policy "
                      f"(dppo.train(cfg, policy=...))")
