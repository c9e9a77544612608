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

A missing optional dependency (``env.id=LunarLander-v3`` without Box2D) is one line naming what to install
(``missing_dependency``). Envs handed to ``dppo.train(env=...)`` as Python objects are registered under
``python/<module>.<name>`` (``register_python_env``) and then built by id, like any other.
"""
from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import inspect
import re

import gymnasium as gym

import dppo.envs.acrobot_vector  # noqa: F401 - registers Acrobot-v1's native vectorized implementation
import dppo.envs.cartpole_physics  # noqa: F401 - registers dppo/CartPolePhysics-v1 (CartPole-v1's constants as kwargs)
from dppo.envs import icu_sepsis_vector, masks

from dppo.envs.memory import measured
from dppo.envs.reward_ranges import check_reward_range, declared_reward_range
from dppo.envs.rollout import VECTORIZATION
from dppo.errors import ConfigError, MissingDependency

# the optional modules gymnasium's envs (and the env packages dppo knows) import, and what installs each
EXTRAS = {
    "Box2D": 'pip install swig && pip install "gymnasium[box2d]"',
    "mujoco": 'pip install "gymnasium[mujoco]"',
    "ale_py": 'pip install "gymnasium[atari]"',
    "minigrid": "pip install minigrid",
    "icu_sepsis": "pip install icu-sepsis",
    "pygame": 'pip install "gymnasium[classic-control]"',
    "highway_env": "pip install highway-env",
}
# env ids a package registers when it is imported: (id prefix, the module that registers it)
PACKAGE_IDS = (("ALE/", "ale_py"), ("MiniGrid-", "minigrid"), ("BabyAI-", "minigrid"), ("Sepsis/", "icu_sepsis"),
               ("highway-", "highway_env"))
PYTHON_NAMESPACE = "python"   # env.id=python/<module>.<name>: an env handed to dppo.train(env=...) as an object


def missing_dependency(err: BaseException, env_id: str, key: str = "env.id") -> MissingDependency | None:
    """The one line for an env that needs a module that is not installed (gymnasium's ``DependencyNotInstalled``,
    or a ``ModuleNotFoundError`` anywhere in ``err``'s chain), naming what to install; None for any other error."""
    e, module, dependency = err, None, None
    while e is not None:
        if isinstance(e, gym.error.DependencyNotInstalled) and dependency is None:
            dependency = " ".join(str(e).split())
        if isinstance(e, ModuleNotFoundError) and getattr(e, "name", None) and module is None:
            module = str(e.name).split(".")[0]
        e = e.__cause__ or e.__context__
    if module is None and dependency is None:
        return None
    if module in EXTRAS:
        fix = f"install it with: {EXTRAS[module]}"
    elif dependency is not None:   # gymnasium's own text names the extra (`pip install "gymnasium[box2d]"`)
        fix = dependency.rstrip(".")
    else:
        fix = f"install the package that provides it (pip install {module.replace('_', '-')}, or its own name)"
    what = f"the Python module '{module}'" if module else "an optional dependency"
    return MissingDependency(f"{key}={env_id} needs {what}, which is not installed: {fix}")


def import_modules(names, key: str = "env.imports") -> None:
    """Import every module of ``names`` (what registers a user's envs); one line naming the module on failure."""
    for name in names or ():
        try:
            if str(name).split(".")[0] == "icu_sepsis":
                icu_sepsis_vector.import_package(str(name))   # without the legacy gym's stderr banner
            else:
                importlib.import_module(str(name))
        except Exception as err:  # noqa: BLE001 - any import failure is the user's module or install
            if isinstance(err, ModuleNotFoundError) and str(getattr(err, "name", "")).split(".")[0] in EXTRAS:
                raise missing_dependency(err, str(name), key=key) from None
            raise ConfigError(f"{key}: cannot import '{name}' ({type(err).__name__}: {err}); install it or put "
                              f"its folder on PYTHONPATH") from None


def unknown_id_line(env_id: str) -> str:
    """The line for an id gymnasium does not know: a package's id names the package (installed or not), an
    id handed in from Python names ``dppo.train(env=...)``."""
    name = split_module(env_id)[1]
    if name.startswith(PYTHON_NAMESPACE + "/"):
        return (f"env.id '{name}' is an env that was handed to dppo.train(env=...) as a Python object, not a "
                f"registered gymnasium id; continue that run from Python with the same env: dppo.train(..., "
                f"env=<it>, resume=True)")
    for prefix, module in PACKAGE_IDS:
        if name.startswith(prefix):
            installed = importlib.util.find_spec(module) is not None
            how = f"env.id={module}:{name} (the module registers it)" if installed else \
                f"install it ({EXTRAS.get(module, 'pip install ' + module)}), then env.id={module}:{name}"
            return f"unknown env.id '{env_id}': {name} is registered by the package {module}: {how}"
    return (f"unknown env.id '{env_id}': not a registered gymnasium environment (e.g. CartPole-v1; an env from a "
            f"package: env.id=pkg:EnvId or env.imports=[pkg])")


def env_option_hint(name: str) -> str | None:
    """For ``env=<name>`` where ``name`` is no option of the env group but a gymnasium id (``env=CartPole-v1``):
    the line naming ``env.id=<name>``; None otherwise."""
    module, env_id = split_module(name)
    if module is None:
        try:
            gym.spec(env_id)
        except Exception:  # noqa: BLE001 - not a registered id
            if not any(env_id.startswith(p) for p, _ in PACKAGE_IDS):
                return None
    return (f"unknown env '{name}': env= picks an option of conf/env/ (cartpole, pendulum, ...), and {name} is a "
            f"gymnasium id: pass it as env.id={name}")


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
        # the arguments as given, config values only: what dppo.train(env=<this factory>) records in the config
        self.args = {"id": str(id), "horizon": horizon, "kwargs": dict(kwargs or {}), "vectorization": vectorization,
                     "imports": list(imports or []), "wrappers": [_plain(w) for w in wrappers or []],
                     "num_envs": num_envs, "reward_range": None if reward_range is None else list(reward_range),
                     "action_mask": action_mask}
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
        except Exception as err:  # noqa: BLE001 - gymnasium raises several error types for unknown ids
            missing = missing_dependency(err, id)   # an id whose registration imports a missing module
            raise (missing or ConfigError(unknown_id_line(id))) from None
        if horizon is not None and int(horizon) < 1:
            raise ConfigError(f"env.horizon must be >= 1 (or null for the env's own limit), got {horizon}")
        self.horizon = int(horizon) if horizon is not None else (spec.max_episode_steps or 1000)
        self.own_horizon = int(spec.max_episode_steps or self.horizon)   # the env's own limit (env.horizon may cut it)
        try:
            probe, self.instance_bytes = measured(self.make)
        except Exception as err:  # noqa: BLE001 - a missing extra is one line naming it; anything else as it is
            missing = missing_dependency(err, id)
            if missing is None:
                raise
            raise missing from None
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


def _plain(value):
    """A config value as plain Python (OmegaConf nodes as dicts and lists)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


# ---- dppo.train(env=...): what each form of a Python env stands for, as env.* config values ----

VEC_KWARGS = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers", "render_mode")  # make_vec's, not the env's
FORMS = ("a registered gymnasium id ('CartPole-v1', 'pkg:EnvId'), a gymnasium.Env (gym.make(...)), a callable or "
         "class returning a fresh env (env=lambda: MyEnv()), a gymnasium vector env, or a "
         "dppo.envs.gym_env.GymEnvFactory")


def is_env_callable(env) -> bool:
    """A class, function, lambda, method or ``functools.partial``: called for every env instance."""
    return (isinstance(env, (type, functools.partial)) or inspect.isfunction(env) or inspect.ismethod(env)
            or inspect.isbuiltin(env))


def python_env_id(target) -> str:
    """``python/<module>.<qualified name>`` of a callable or an env's class (gymnasium's id characters only)."""
    while isinstance(target, functools.partial):
        target = target.func
    module = getattr(target, "__module__", None) or "builtins"
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{PYTHON_NAMESPACE}/" + re.sub(r"[^\w.-]", "_", f"{module}.{name}")


def _horizon_of(env) -> int | None:
    """The episode limit an env instance carries (its spec's, or a TimeLimit wrapper's), None if none."""
    spec = getattr(env, "spec", None)
    if spec is not None and spec.max_episode_steps:
        return int(spec.max_episode_steps)
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return int(env._max_episode_steps)
        env = env.env
    return None


def register_python_env(env_id: str, make, max_episode_steps: int | None) -> None:
    """Register ``make`` as ``env_id`` in this process's gymnasium registry (replacing an earlier entry of the same
    name: the same callable handed in again, e.g. on a resume)."""
    from gymnasium.envs.registration import EnvSpec, registry

    registry[env_id] = EnvSpec(id=env_id, entry_point=make, max_episode_steps=max_episode_steps)


def _made_by(fn, name: str):
    """The entry point of an env made by calling ``fn``: its result must be one gymnasium env."""
    def make(**kwargs):
        env = fn(**kwargs)
        if not isinstance(env, gym.Env):
            raise ConfigError(f"dppo.train(env={name}): calling it returned a {type(env).__name__}, not a "
                              f"gymnasium.Env; env= takes {FORMS}")
        return env
    return make


def _copies_of(template, name: str):
    """The entry point of an env copied from an instance: a deep copy each time (the instance itself, which its
    owner may still use, is never stepped)."""
    def make(**kwargs):
        if kwargs:
            raise ConfigError(f"env.kwargs={kwargs} cannot be applied to the env instance passed as env= (it is "
                              f"copied as it is); pass a callable instead: env=lambda **kw: {name}(**kw)")
        return copy.deepcopy(template)
    return make


def check_seeded_resets(env_id: str, kwargs: dict | None = None) -> None:
    """An env handed in from Python starts each episode from its reset seed alone: a fresh instance and one that
    has already run another episode give the same first observation and the same steps for the same seed and
    actions. Each user's episodes must come from the user's own seed (``dppo.envs.rollout``); one line otherwise."""
    from dppo.envs.masks import PROBE_SEED

    def episode(env, seed, steps=8):
        space = copy.deepcopy(env.action_space)
        space.seed(0)
        obs, _ = env.reset(seed=seed)
        out = [obs]
        for _ in range(steps):
            try:
                obs, reward, terminated, truncated, _ = env.step(space.sample())
            except Exception:  # noqa: BLE001 - an action the env refuses (masks): the comparison so far stands
                break
            out.append((obs, float(reward)))
            if terminated or truncated:
                break
        return out

    first, second = gym.make(env_id, **(kwargs or {})), gym.make(env_id, **(kwargs or {}))
    try:
        a = episode(first, PROBE_SEED)
        episode(second, PROBE_SEED + 1)
        b = episode(second, PROBE_SEED)
        a_again = episode(first, PROBE_SEED)
    finally:
        first.close()
        second.close()
    if not (_same(a, b) and _same(a, a_again)):
        raise ConfigError(f"the env passed as env= ({env_id.split('/', 1)[1]}) does not start its episodes from "
                          f"the reset seed alone (two episodes reset with the same seed and given the same actions "
                          f"differ): each user's episodes must come from that user's own seed; its reset must call "
                          f"super().reset(seed=seed) and draw from self.np_random, with no state kept across resets")


def _same(x, y) -> bool:
    """Equal observations (arrays, numbers, strings, and dicts, tuples and lists of them)."""
    import numpy as np

    if isinstance(x, dict) or isinstance(y, dict):
        return isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys() and \
            all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (tuple, list)) or isinstance(y, (tuple, list)):
        return isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)) and len(x) == len(y) and \
            all(_same(u, v) for u, v in zip(x, y))
    try:
        return bool(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True))
    except TypeError:   # no NaN in a non-numeric array
        return bool(np.array_equal(np.asarray(x), np.asarray(y)))


def _spec_plan(spec, instance_horizon: int | None) -> dict | None:
    """The env.* values that re-make an env from its spec (id, kwargs, wrappers, horizon), or None when its
    spec cannot re-make it here (an unregistered id, a wrapper that does not record its arguments, a keyword
    that is no config value)."""
    from omegaconf import OmegaConf

    try:
        registered = gym.spec(spec.id)
    except Exception:  # noqa: BLE001 - made from an EnvSpec object, or registered elsewhere
        return None
    kwargs = {k: v for k, v in (spec.kwargs or {}).items() if k not in VEC_KWARGS}
    wrappers = []
    for w in spec.additional_wrappers or ():
        if w.kwargs is None or not isinstance(w.entry_point, str):
            return None
        wrappers.append({"_target_": w.entry_point.replace(":", "."), **w.kwargs})
    try:
        OmegaConf.create({"kwargs": kwargs, "wrappers": wrappers})   # config values only
    except Exception:  # noqa: BLE001
        return None
    plan = {"id": spec.id}
    if kwargs:
        plan["kwargs"] = kwargs
    if wrappers:
        plan["wrappers"] = wrappers
    if instance_horizon and instance_horizon != registered.max_episode_steps:
        plan["horizon"] = int(instance_horizon)
    entry = registered.entry_point
    module = (entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")).split(".")[0]
    if module and module not in ("gymnasium", "dppo", "__main__") and importlib.util.find_spec(module):
        plan["imports"] = [module]   # the package that registers the id, for a resume in a fresh process
    return plan


def env_argument(env) -> tuple[dict | None, object | None]:
    """What ``dppo.train(env=...)`` stands for: (the env.* config values to record, the object to build the run
    with: None to build it from the config). ``(None, env)``: an env object of dppo's own (a tabular MDP, the
    bandit), used as it is. Every Python env that has no registered id is registered as ``python/<name>``
    (``register_python_env``) and built by id like any other, so its spaces are checked against the policy as on
    the command line; ``check_seeded_resets`` runs on it first."""
    if isinstance(env, str):
        return {"id": env}, None
    if isinstance(env, GymEnvFactory):
        return dict(env.args), env
    if isinstance(env, gym.vector.VectorEnv):
        return _vector_plan(env), None
    if isinstance(env, gym.Env):
        spec = getattr(env, "spec", None)
        plan = _spec_plan(spec, _horizon_of(env)) if spec is not None else None
        if plan is not None:
            return plan, None
        name = type(env.unwrapped).__name__
        try:
            copy.deepcopy(env)
        except Exception as err:  # noqa: BLE001
            raise ConfigError(f"dppo.train(env=<{name} instance>): the instance cannot be copied for each env slot "
                              f"({type(err).__name__}: {err}); pass a callable that makes a fresh one: "
                              f"env=lambda: {name}(...), or the class env={name}") from None
        env_id = python_env_id(type(env.unwrapped))
        register_python_env(env_id, _copies_of(env, name), _horizon_of(env))
        check_seeded_resets(env_id)
        return {"id": env_id}, None
    if is_env_callable(env) or (callable(env) and not hasattr(env, "observation_space")):
        env_id = python_env_id(env)
        name = env_id.split("/", 1)[1].rsplit(".", 1)[-1]
        probe = _made_by(env, name)()
        horizon = _horizon_of(probe)
        probe.close()
        register_python_env(env_id, _made_by(env, name), horizon)
        check_seeded_resets(env_id)
        return {"id": env_id}, None
    return None, env


def _vector_plan(vec) -> dict:
    """A gymnasium vector env: the single env it steps (by its spec's id, else by its ``env_fns``), with its
    ``num_envs`` and backend. dppo makes its own instances of it (each slot reset with its user's seed); the vector
    env passed in is never stepped."""
    from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

    spec = getattr(vec, "spec", None)
    plan = _spec_plan(spec, spec.max_episode_steps if spec is not None else None) if spec is not None else None
    if plan is None:
        fns = getattr(vec, "env_fns", None)
        if not fns:
            raise ConfigError(f"dppo.train(env=<{type(vec).__name__}>): a vector env without a registered id or "
                              f"env_fns cannot be re-made per user; register it with a vector_entry_point and pass "
                              f"its id (docs/api.md, 'Your vector env'), or pass env=<a callable making one env>")
        plan, _ = env_argument(fns[0])
    plan["num_envs"] = int(vec.num_envs)
    if isinstance(vec, SyncVectorEnv):
        plan["vectorization"] = "sync"
    elif isinstance(vec, AsyncVectorEnv):
        plan["vectorization"] = "async"
    return plan
