"""Action masks: which discrete actions a user may take in its current state, in the conventions users have.

Sources, in the order ``env.action_mask=auto`` tries them on a probe episode (public seed) when the factory is
built:

* ``method``: the env's ``action_masks()`` (sb3-contrib's ``MaskablePPO`` convention, e.g. its ``ActionMasker``
  wrapper; a vector env's returns one row per sub-env);
* ``info``: ``info["action_mask"]`` at reset and at every step (gymnasium's convention, e.g. ``Taxi-v4``);
* ``admissible``: ``info["admissible_actions"]``, a list of action indices (ICU-Sepsis's convention).

``env.action_mask=none`` turns masks off; ``env.action_mask=method|info|admissible`` asks for one source (an env
that does not offer it is refused in one line). A mask is a function of the user's own current observation (and
of the env's public rules): it changes only which of that user's actions are possible and the log-probabilities of
that user's own steps, so it enters no other user's contribution (docs/privacy.md).

``mask_table(env)``: the public [S, A] table of a Discrete env whose admissible sets are part of the env's
published definition (ICU-Sepsis's tables, a gymnasium env's ``action_mask(state)`` such as Taxi's, or an
``admissible`` attribute), for the tabular planners' masked maxima; None when the env publishes none.
"""
from __future__ import annotations

import numpy as np

from dppo.data.streams import PUBLIC_SEED_BASE
from dppo.errors import ConfigError

PROBE_SEED = PUBLIC_SEED_BASE      # the probe episode's reset seed: a public one, never a user's

MASK_SOURCES = ("auto", "none", "method", "info", "admissible")


def _method(env):
    """The env's (or a wrapper's) ``action_masks`` callable, or None."""
    fn = getattr(env, "action_masks", None)
    if callable(fn):
        return fn
    getter = getattr(env, "get_wrapper_attr", None)
    if callable(getter):
        try:
            fn = getter("action_masks")
        except AttributeError:
            return None
        return fn if callable(fn) else None
    return None


def as_mask(value, n_actions: int) -> np.ndarray:
    """A bool mask (n_actions,) from a 0/1 or bool array; refused in one line otherwise."""
    m = np.asarray(value)
    if m.shape[-1:] != (n_actions,):
        raise ConfigError(f"an action mask must have {n_actions} entries (one per action), got shape {m.shape}")
    return m.astype(bool)


def admissible_mask(indices, n_actions: int) -> np.ndarray:
    """A bool mask (n_actions,) from a list of admissible action indices."""
    m = np.zeros(n_actions, dtype=bool)
    m[np.asarray(list(indices), dtype=np.int64)] = True
    return m


def detect(env, info: dict, source: str = "auto") -> str | None:
    """The mask source an env offers (``MASK_SOURCES``), from one instance and the ``info`` of a reset with a
    public seed; None when masks are off or the env offers none (``source=auto``)."""
    if source not in MASK_SOURCES:
        raise ConfigError(f"env.action_mask must be one of {MASK_SOURCES}, got '{source}'")
    if source == "none":
        return None
    offered = [s for s, ok in (("method", _method(env) is not None), ("info", "action_mask" in (info or {})),
                               ("admissible", "admissible_actions" in (info or {}))) if ok]
    if source == "auto":
        return offered[0] if offered else None
    if source not in offered:
        what = {"method": "an action_masks() method", "info": 'info["action_mask"]',
                "admissible": 'info["admissible_actions"]'}[source]
        raise ConfigError(f"env.action_mask={source}: the env offers no {what}; use env.action_mask=auto (what it "
                          f"offers: {offered or 'nothing'}) or none")
    return source


def read_mask(env, info: dict, source: str, n_actions: int) -> np.ndarray:
    """The current mask of a single env instance from its ``source`` (after a reset or a step)."""
    if source == "method":
        m = as_mask(_method(env)(), n_actions)
    elif source == "info":
        m = as_mask(info["action_mask"], n_actions)
    else:
        m = admissible_mask(info["admissible_actions"], n_actions)
    if not m.any():           # a state without admissible actions (e.g. a terminal one): every action
        m[:] = True
    return m


def mask_table(env) -> np.ndarray | None:
    """The env's public admissible sets as an [S, A] bool table (module docstring), or None.

    Accepts a ``TabularMDP`` (its ``admissible`` attribute, if set), a gymnasium env, or a factory with
    ``make()`` (its ``action_mask`` key ``none`` gives None)."""
    if getattr(env, "action_mask", "auto") == "none" and hasattr(env, "make"):
        return None
    table = getattr(env, "admissible", None)
    if table is not None:
        return np.asarray(table, dtype=bool)
    if hasattr(env, "make") and not hasattr(env, "step"):
        from dppo.envs.icu_sepsis_vector import IDS
        if getattr(env, "id", None) in IDS:     # the package's published tables, without another 200 MB instance
            from dppo.envs.icu_sepsis_vector import package_tables
            return np.asarray(package_tables()["admissible"], dtype=bool).copy()
        made = env.make()
        try:
            return mask_table(made)
        finally:
            made.close()
    base = getattr(env, "unwrapped", env)
    table = getattr(base, "admissible", None)
    if table is not None:
        return np.asarray(table, dtype=bool)
    if type(base).__module__.split(".")[0] == "icu_sepsis":   # its arrays become the package's tables (no copy)
        from dppo.envs.icu_sepsis_vector import package_tables
        return np.asarray(package_tables(base)["admissible"], dtype=bool).copy()
    fn = getattr(base, "action_mask", None)
    space, actions = getattr(env, "observation_space", None), getattr(env, "action_space", None)
    if callable(fn) and hasattr(space, "n") and hasattr(actions, "n"):
        rows = np.stack([as_mask(fn(s), int(actions.n)) for s in range(int(space.n))])
        rows[~rows.any(1)] = True
        return rows
    return None
