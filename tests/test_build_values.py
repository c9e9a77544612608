"""Bad numeric values are refused before anything runs, for every key of every group: a non-integer for an
integer key, a NaN or infinite number for a float key, of any learner, env, policy (and its parameter space)
or oracle, and of the schema's top-level and privacy/logger keys; ``device=cuda`` where CUDA is missing or
for a policy that cannot use it. The keys are enumerated from the signatures the group files name (every
keyword, not a list), and each one's expected type is read independently of ``dppo.build.parameter_kind``:
from its default's type, else from its annotation's text."""
from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
from hydra.utils import get_object
from omegaconf import OmegaConf, open_dict

import dppo
from dppo.build import INJECTABLE, POLICY_KEYS, SPACE_KEYS, accepted_keys, check_config_values
from dppo.config import schema_floats, validate
from dppo.errors import ConfigError
from tests.cli_helpers import run_cli

CONF = Path(__file__).resolve().parent.parent / "conf"


def _signature_params(target):
    """name -> inspect.Parameter over the target's own signature and the base ``__init__``s ``**kwargs`` reach."""
    out = {}
    classes = [c for c in target.__mro__ if "__init__" in vars(c) and c is not object] if inspect.isclass(target) \
        else [target]
    for c in classes:
        params = inspect.signature(c.__init__ if inspect.isclass(c) else c).parameters
        for n, p in params.items():
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "self":
                out.setdefault(n, p)
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break
    return out


def _expected_kind(p) -> str | None:
    """int / float from the default's type, else from the annotation's text ("int | None", "Optional[float]")."""
    d = p.default
    if isinstance(d, bool):
        return None
    if isinstance(d, int):
        return "int"
    if isinstance(d, float):
        return "float"
    text = str(p.annotation).replace("typing.", "").replace("Optional[", "").replace("]", "")
    names = {t.strip() for t in text.split("|")} - {"None"}
    return {"int": "int", "float": "float", "<class 'int'>": "int", "<class 'float'>": "float"}.get(
        next(iter(names))) if len(names) == 1 else None


def _group_configs():
    """(group, choice, overrides composing it) for every group file (an oracle with a learner that takes one)."""
    out = []
    for group in ("algo", "env", "policy", "oracle"):
        for f in sorted((CONF / group).glob("*.yaml")):
            ov = [f"{group}={f.stem}"]
            if group == "oracle":
                ov = ["algo=dp_npg", *ov]
            if group == "policy" and f.stem == "lm":
                ov = ["env=prompts", *ov]
            out.append((group, f.stem, ov))
    return out


def _numeric_keys(group, cfg):
    node = cfg[group]
    if node is None or "_target_" not in node:
        return []
    target = get_object(str(node["_target_"]))
    params = _signature_params(target)
    skip = set(INJECTABLE) | {"observation_space", "action_space"} if group == "algo" else \
        {"observation_space", "action_space"}
    keys = [(k, _expected_kind(p)) for k, p in params.items() if k not in skip]
    if group == "policy":
        from dppo.policies.spaces import make_space
        keys += [(k, _expected_kind(p)) for k, p in _signature_params(make_space).items() if k in SPACE_KEYS]
    assert accepted_keys(target) is None or {k for k, _ in keys} - set(SPACE_KEYS) <= accepted_keys(target)
    return [(k, kind) for k, kind in keys if kind is not None]


@pytest.mark.parametrize("group,choice,overrides", _group_configs(), ids=[f"{g}={c}" for g, c, _ in _group_configs()])
def test_every_numeric_key_of_every_group_refuses_a_bad_value(group, choice, overrides):
    cfg = dppo.make_config(overrides)
    keys = _numeric_keys(group, cfg)
    if choice not in ("none",):
        assert keys, f"{group}={choice}: no numeric key found (the enumeration is broken)"
    check_config_values(cfg)                         # the shipped values pass
    for key, kind in keys:
        bad_values = [2.5, "3"] if kind == "int" else [math.nan, math.inf, -math.inf]
        for bad in bad_values:
            c = cfg.copy()
            with open_dict(c):
                c[group][key] = bad
            with pytest.raises(ConfigError) as err:
                check_config_values(c)
            msg = str(err.value)
            expected = "an integer" if kind == "int" else "a finite number"
            assert "\n" not in msg and msg.startswith(f"{group}.{key} must be {expected}"), msg


def test_every_schema_float_refuses_nan_and_inf():
    keys = schema_floats()
    assert {"eps", "delta", "max_grad_norm", "reward_bound", "privacy.max_epsilon"} <= set(keys)
    for key in keys:
        for bad in (math.nan, math.inf):
            cfg = dppo.make_config([])
            OmegaConf.update(cfg, key, bad)
            with pytest.raises(ConfigError, match=rf"^{key} must be"):
                validate(cfg)


@pytest.mark.parametrize("args,says", [
    (["algo=dp_ppo", "algo.epochs=2.5"], "algo.epochs must be an integer, got 2.5"),
    (["algo=dp_ppo", "algo.ent_coef=nan"], "algo.ent_coef must be a finite number, got nan"),
    (["rounds=2.5"], "rounds must be an int"),
    (["reward_bound=inf"], "reward_bound must be a finite number"),
    (["device=cuda"], "device=cuda applies to a policy that takes a device"),
])
def test_bad_values_exit_2_with_one_line_before_round_0(tmp_path, args, says):
    run = tmp_path / "run"
    r = run_cli([*args, "progress=false", f"hydra.run.dir={run}"])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and says in lines[0], r.stderr
    assert not (run / "progress.csv").exists()


def test_device_cuda_needs_cuda_and_a_policy_that_takes_a_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lm = dppo.make_config(["env=prompts", "policy=lm", "device=cuda"])
    with pytest.raises(ConfigError, match="no CUDA device"):
        check_config_values(lm)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_config_values(lm)                          # an LM on a CUDA machine: accepted
    for args in (["device=cuda"], ["device=cuda:0", "env=bandit", "policy=loglinear"],
                 ["device=cuda", "algo=dp_ubev", "env=riverswim"]):
        with pytest.raises(ConfigError, match="runs on the CPU"):
            check_config_values(dppo.make_config(args))
    check_config_values(dppo.make_config(["device=auto"]))   # auto: the gym MLP stays on the CPU
