"""One home per default: no value in a group file (conf/algo, env, policy, oracle) repeats the default of the
object its ``_target_`` names, and no ``@package _global_`` group file repeats a top-level key's schema default.

Independent of the builder: each file is read as text by OmegaConf (nothing composed, nothing instantiated), its
target imported and its signature read with ``inspect`` (following ``**kwargs`` into the base classes, as a
keyword reaches them), and every value compared with the parameter's default. An interpolation (``${seed}``)
is not a repeated value: it names another home.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from dppo.config import TrainConfig

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("algo", "env", "policy", "oracle")


def signature_defaults(target) -> dict:
    """Every keyword parameter's default along the chain ``target`` passes its ``**kwargs`` down."""
    out, chain = {}, [target]
    if inspect.isclass(target):
        chain = [c for c in target.__mro__ if "__init__" in vars(c) and c is not object]
    for obj in chain:
        params = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters
        for name, p in params.items():
            if p.default is not p.empty:
                out.setdefault(name, p.default)
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break
    return out


def same(value, default) -> bool:
    """A config value equal to a Python default, type for type (``true`` is not ``1``; ``[2.0, 1.0]`` is
    ``(2.0, 1.0)``; ``1`` is ``1.0``, as the config would pass either)."""
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return len(value) == len(default) and all(same(v, d) for v, d in zip(value, default))
    if isinstance(value, bool) or isinstance(default, bool):
        return isinstance(value, bool) and isinstance(default, bool) and value == default
    if value is None or default is None:
        return value is None and default is None
    if isinstance(value, (int, float)) and isinstance(default, (int, float)):
        return float(value) == float(default)
    return type(value) is type(default) and value == default


def group_files() -> list[Path]:
    return sorted(p for g in GROUPS for p in (CONF / g).glob("*.yaml"))


def repeats(path: Path) -> list[str]:
    """The keys of one group file whose value is its target's (or the schema's) default."""
    text = path.read_text()
    raw = OmegaConf.load(path)
    group = path.parent.name
    found = []
    is_global = "# @package _global_" in text
    node = raw.get(group) if is_global else raw
    if is_global:   # the top-level keys a global group file sets, against the schema
        schema = {f.name: f for f in dataclasses.fields(TrainConfig)}
        for key in raw:
            if key in ("defaults", group) or key not in schema or OmegaConf.is_interpolation(raw, key):
                continue
            f = schema[key]
            default = f.default if f.default is not dataclasses.MISSING else None
            if not isinstance(raw[key], (DictConfig, ListConfig)) and same(raw[key], default):
                found.append(key)
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return found
    module, _, attr = str(node["_target_"]).rpartition(".")
    defaults = signature_defaults(getattr(importlib.import_module(module), attr))
    for key in node:
        if key == "_target_" or key not in defaults or OmegaConf.is_interpolation(node, key):
            continue
        value = node[key]
        value = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
        if same(value, defaults[key]):
            found.append(f"{group}.{key}")
    return found


def test_the_check_sees_a_repeat():
    """Not blind: a file repeating DPUBEV's counter default, and a global one repeating eps's, are caught."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        algo = Path(d) / "algo"
        algo.mkdir()
        (algo / "x.yaml").write_text("_target_: dppo.algos.dp_ubev.DPUBEV\ncounter: gaussian\nset_noise: [2, 2, 1]\n"
                                     "pool_steps: 1\n")
        assert repeats(algo / "x.yaml") == ["algo.counter", "algo.set_noise"]   # pool_steps: 1 is not true
        (algo / "y.yaml").write_text("# @package _global_\nalgo:\n  _target_: dppo.algos.pg.PolicyGradient\n"
                                     "eps: 5.0\ndelta: 1e-6\n")
        assert repeats(algo / "y.yaml") == ["eps"]


@pytest.mark.parametrize("path", group_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_group_value_repeats_its_targets_default(path):
    assert repeats(path) == [], f"{path.relative_to(CONF)} repeats defaults (remove them): {repeats(path)}"
