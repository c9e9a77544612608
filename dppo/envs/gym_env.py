"""Gymnasium adapter: an env factory whose episodes are users with their own reset seeds.

Any env gymnasium can make is named as gymnasium names it:

* ``env.id=CartPole-v1``: a registered id;
* ``env.id=icu_sepsis:Sepsis/ICU-Sepsis-v2``: gymnasium's ``module:EnvId`` form (the module is imported
  first, and registers the id);
* ``env.imports=[my_pkg, other_pkg]``: modules imported before the env is made (rl-zoo's ``--gym-packages``),
  e.g. a module on ``PYTHONPATH`` that calls ``gymnasium.register``;
* ``env.wrappers=[gymnasium.wrappers.TimeAwareObservation, {_target_: my_pkg.Wrap, scale: 2}]``: wrappers by
  import path (a string, or a mapping with ``_target_`` and keyword arguments), applied in order to every
  instance.
"""
from __future__ import annotations

import importlib

import gymnasium as gym

import dppo.envs.acrobot_vector  # noqa: F401 - registers Acrobot-v1's native vectorized implementation
import dppo.envs.cartpole_physics  # noqa: F401 - registers dppo/CartPolePhysics-v1 (CartPole-v1's constants as kwargs)
from dppo.envs import icu_sepsis_vector, masks

from dppo.envs.memory import measured
from dppo.envs.reward_ranges import check_reward_range, declared_reward_range
from dppo.envs.rollout import VECTORIZATION
from dppo.errors import ConfigError


def import_modules(names, key: str = "env.imports") -> None:
    """Import every module of ``names`` (what registers a user's envs); one line naming the module on failure."""
    for name in names or ():
        try:
            if str(name).split(".")[0] == "icu_sepsis":
                icu_sepsis_vector.import_package(str(name))   # without the legacy gym's stderr banner
            else:
                importlib.import_module(str(name))
        except Exception as err:  # noqa: BLE001 - any import failure is the user's module or install
            raise ConfigError(f"{key}: cannot import '{name}' ({type(err).__name__}: {err}); install it or put "
                              f"its folder on PYTHONPATH") from None


def split_module(env_id: str) -> tuple[str | None, str]:
    """``module:EnvId`` -> (module, EnvId); a plain id -> (None, id)."""
    module, sep, name = str(env_id).partition(":")
    return (module, name) if sep else (None, str(env_id))


def resolve_wrappers(specs) -> list:
    """``env.wrappers`` as (class, kwargs) pairs: each entry a dotted import path or ``{_target_: path, **kwargs}``."""
    out = []
    for spec in specs or ():
        if isinstance(spec, str):
            path, kwargs = spec, {}
        elif hasattr(spec, "get") and spec.get("_target_"):
            kwargs = {k: v for k, v in dict(spec).items() if k != "_target_"}
            path = spec["_target_"]
        else:
            raise ConfigError(f"env.wrappers: each entry is an import path or {{_target_: path, ...}}, got {spec!r}")
        module, _, attr = str(path).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr) if module else None
        except Exception:  # noqa: BLE001
            cls = None
        if not callable(cls):
            raise ConfigError(f"env.wrappers: cannot import '{path}' (e.g. gymnasium.wrappers.FlattenObservation "
                              f"or my_pkg.MyWrapper)")
        out.append((cls, kwargs))
    return out


class GymEnvFactory:
    """Makes ``gymnasium`` envs by id. A user is one episode reset with its own seed (G episodes with
    ``group_size``).

    Args:
        id: gymnasium env id (``CartPole-v1``), or ``module:EnvId`` (module docstring).
        horizon: maximum episode length; ``None`` uses the env's own ``max_episode_steps``.
        kwargs: extra keyword arguments for ``gym.make``.
        vectorization: how batches of episodes run (``dppo.envs.rollout``): ``auto`` (the env's native
            vectorized implementation if it has one, e.g. CartPole, else ``sync``), ``native``, ``sync``,
            ``async`` (gymnasium's vector envs) or ``none`` (a pool of single envs).
        imports: modules imported before the env is made (module docstring).
        wrappers: wrappers applied to every instance (module docstring).
        num_envs: live env instances at most (``auto``: as many as a batch needs, within
            ``dppo.envs.rollout.INSTANCE_MEMORY`` bytes of instances, measured on one instance, and at most
            ``MAX_INSTANCES``); episodes beyond it run in waves on the same instances.
        reward_range: [low, high] the env's rewards are clipped to (``None``: the range the env declares,
            ``dppo.envs.reward_ranges``; no clipping where it declares none).
        action_mask: where a Discrete-action env's action masks come from (``dppo.envs.masks``): ``auto`` (what the
            env offers: an ``action_masks()`` method, ``info["action_mask"]``, ``info["admissible_actions"]``;
            none: no masks), ``none``, or one of ``method``, ``info``, ``admissible``. ``mask_source`` holds the
            source resolved on a probe episode (public seed); the policies then sample and score among the
            admissible actions only.
    """

    def __init__(self, id: str, horizon: int | None = None, kwargs: dict | None = None,
                 vectorization: str = "auto", imports: list | None = None, wrappers: list | None = None,
                 num_envs: int | str = "auto", reward_range: list | None = None, action_mask: str = "auto"):
        if vectorization not in VECTORIZATION:
            raise ConfigError(f"env.vectorization must be one of {VECTORIZATION}, got '{vectorization}'")
        import_modules(imports)
        module, name = split_module(id)
        if module:
            import_modules([module], key="env.id")
        icu_sepsis_vector.register()   # ICU-Sepsis's native vector env, once the package registered its ids
        self.vectorization = vectorization
        self.id, self.module = name, module
        self.kwargs = dict(kwargs or {})
        self.wrappers = resolve_wrappers(wrappers)
        if self.wrappers and vectorization == "native":
            raise ConfigError("env.wrappers apply to single env instances; env.vectorization=native runs the env's "
                              "own vector implementation: use env.vectorization=auto or sync")
        if num_envs != "auto" and (isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1):
            raise ConfigError(f"env.num_envs must be a positive integer or auto, got {num_envs!r}")
        self.num_envs = num_envs
        try:
            spec = gym.spec(self.id)
        except gym.error.DeprecatedEnv as err:   # e.g. Taxi-v3: gymnasium names the replacement version
            raise ConfigError(f"env.id '{self.id}' is deprecated in gymnasium {gym.__version__}: {err}") from None
        except Exception:  # noqa: BLE001 - gymnasium raises several error types for unknown ids
            raise ConfigError(f"unknown env.id '{id}': not a registered gymnasium environment (e.g. CartPole-v1; "
                              f"an env from a package: env.id=pkg:EnvId or env.imports=[pkg])") from None
        if horizon is not None and int(horizon) < 1:
            raise ConfigError(f"env.horizon must be >= 1 (or null for the env's own limit), got {horizon}")
        self.horizon = int(horizon) if horizon is not None else (spec.max_episode_steps or 1000)
        self.own_horizon = int(spec.max_episode_steps or self.horizon)   # the env's own limit (env.horizon may cut it)
        probe, self.instance_bytes = measured(self.make)
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        declared = declared_reward_range(self.id, probe)
        self.action_mask = action_mask
        self.mask_source = None
        if isinstance(self.action_space, gym.spaces.Discrete):
            _, info = probe.reset(seed=masks.PROBE_SEED)
            self.mask_source = masks.detect(probe, info, action_mask)
        elif action_mask not in ("auto", "none"):
            raise ConfigError(f"env.action_mask={action_mask}: masks apply to Discrete action spaces, and "
                              f"{self.id}'s is {type(self.action_space).__name__}; use env.action_mask=auto or none")
        probe.close()
        self.declared_reward_range = declared
        self.reward_range = (check_reward_range(reward_range, "env.reward_range") if reward_range is not None
                             else declared)

    @property
    def native_ok(self) -> bool:
        """Whether the env's own vector implementation may run it (no per-instance wrappers)."""
        return not self.wrappers

    def make(self) -> gym.Env:
        """A fresh env instance with ``env.wrappers`` applied (the horizon is enforced by the rollout)."""
        env = gym.make(self.id, max_episode_steps=self.horizon, **self.kwargs)
        for cls, kwargs in self.wrappers:
            env = cls(env, **kwargs)
        return env

    def __repr__(self) -> str:
        return f"GymEnvFactory(id={self.id!r}, horizon={self.horizon})"
