"""The policy group: its weights' source (``policy.init_from``), the policy for the env's spaces, frozen
parameters, its parameter space; and whether a policy learner can act in the env at all."""
from __future__ import annotations

import os

import torch
from hydra.utils import get_object, instantiate
from omegaconf import OmegaConf

from dppo.build.checks import check_target_keys, group_choice_name, unwrap_build_error
from dppo.config import POLICY_KEYS, SPACE_KEYS, to_container
from dppo.errors import ConfigError

# relative policy.init_from: assets/ (dppo/build/policy.py -> the repository root)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_init_source(init_from: str | None) -> tuple[dict | None, dict | None]:
    """``policy.init_from``: a run directory (its newest checkpoint, else its ``policy.pt``), a ``policy.pt``,
    a run's checkpoint file, or a file holding a bare ``state_dict`` (or ``{"policy": state_dict}``); a
    relative path that does not exist from the working directory is read from the repository root.

    Returns (policy state_dict, provenance record: which users the weights' training consumed, or None for
    a bare state_dict, whose provenance is unknown). Every file is read with ``weights_only=True``.
    """
    policy, record, _ = read_init_source(init_from)
    return policy, record


def read_init_source(init_from: str | None) -> tuple[dict | None, dict | None, dict | None]:
    """``load_init_source``'s (policy, provenance record) and the source's critic state_dict (an actor-critic
    run's ``policy.pt`` or checkpoint; None otherwise): the critic's training consumed the same users."""
    from dppo.training import provenance
    from dppo.training.checkpoint import load_latest_checkpoint

    if not init_from:
        return None, None, None
    path = str(init_from)
    if not os.path.exists(path) and not os.path.isabs(path) and os.path.exists(os.path.join(REPO_ROOT, path)):
        path = os.path.join(REPO_ROOT, path)   # the shipped assets/ work from any directory
    if os.path.isdir(path):
        state, _ = load_latest_checkpoint(os.path.join(path, "checkpoints"))
        if state is None and os.path.isfile(os.path.join(path, "policy.pt")):
            state = torch_load_weights(os.path.join(path, "policy.pt"), path)
        if state is None:
            raise ConfigError(f"policy.init_from={path} is a directory without a readable checkpoint or policy.pt")
    elif os.path.isfile(path):
        state = torch_load_weights(path, path)
    else:
        raise ConfigError(f"policy.init_from={path} is neither a run directory nor a file")
    if isinstance(state, dict) and state.get("format") == "dppo-policy-1" and isinstance(state.get("policy"), dict):
        record = state.get("provenance")
        return state["policy"], record if provenance.is_record(record) else None, state.get("critic")
    if isinstance(state, dict) and isinstance(state.get("learner"), dict) and "policy" in state["learner"]:
        record = state.get("provenance")
        if not provenance.is_record(record):   # a checkpoint from before provenance: its sampler's ids
            used = (state.get("sampler") or {}).get("used")
            record = None if used is None else provenance.legacy_record(used)
        return state["learner"]["policy"], record, state["learner"].get("critic")
    if isinstance(state, dict) and isinstance(state.get("policy"), dict):
        state = state["policy"]
    if not (isinstance(state, dict) and state and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                      for k, v in state.items())):
        raise ConfigError(f"policy.init_from={path} holds no policy weights (a policy.pt, a run's checkpoint or a "
                          f"state_dict of tensors)")
    return state, None, None


def torch_load_weights(path: str, shown: str):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - not a torch file, or one that would need to run code
        reason = " ".join(str(err).split())[:120] or type(err).__name__
        raise ConfigError(f"policy.init_from={shown} is not a file torch.load(weights_only=True) can read "
                          f"({type(err).__name__}: {reason})") from None


def build_policy(cfg, env, init_state: dict | None = None):
    """Instantiate cfg.policy for the env's spaces; load ``init_state`` (from ``policy.init_from``: fine-tuning);
    ``policy.freeze`` lists parameter-name prefixes that are not trained (requires_grad=False)."""
    spec = dict(to_container(cfg.policy) or {})
    if "_target_" not in spec:
        return None
    init_from = spec.pop("init_from", None)
    for k in ("init_users_offset", "init_provenance", "init_data_disjoint"):
        spec.pop(k, None)   # read by the builder (provenance), not by the policy
    freeze = spec.pop("freeze", None) or []
    for k in SPACE_KEYS:
        spec.pop(k, None)
    check_target_keys(spec, "policy", extra=POLICY_KEYS + SPACE_KEYS + ("observation_space", "action_space"),
                      cfg=cfg)
    try:
        policy = instantiate(spec, observation_space=env.observation_space, action_space=env.action_space,
                             _convert_="all")
    except Exception as err:  # noqa: BLE001
        raise unwrap_build_error(err, "policy") from None
    # frozen first: an LM run's checkpoint holds the tensors it trained (``trainable()``: the adapter, or without
    # LoRA every weight not in ``policy.freeze``), which the policy's trainable set matches only once frozen
    names = [n for n, _ in policy.named_parameters()]
    for prefix in freeze:
        hit = [n for n in names if n == prefix or n.startswith(f"{prefix}.")]
        if not hit:
            raise ConfigError(f"policy.freeze: no parameter named {prefix!r} (parameters: {names})")
        for n, p in policy.named_parameters():
            if n in hit:
                p.requires_grad_(False)
    if init_state is None and init_from:
        init_state, _ = load_init_source(init_from)
    adapter = getattr(policy, "trainable", None)
    if init_state is not None and callable(adapter) and set(init_state) == {n for n, _ in adapter()}:
        policy.load_adapter_state(init_state)   # a checkpoint of an LM run holds only its adapter's tensors
    elif init_state is not None:
        try:
            policy.load_state_dict(init_state)
        except (RuntimeError, TypeError) as err:
            raise ConfigError(f"policy.init_from does not fit this policy: {str(err).splitlines()[0]}") from None
    return policy


def build_space(cfg, policy, defaults: dict | None = None):
    """The policy's parameter space (``policy.subspace``, ``policy.dim``; ``dppo.policies.spaces.make_space``);
    ``defaults``: the learner's own choice where the config names none (``space_defaults``, e.g. PPO's full space)."""
    from dppo.policies.spaces import make_space

    spec = to_container(cfg.policy) or {}
    return make_space(policy, seed=cfg.seed, **{**(defaults or {}), **{k: spec[k] for k in SPACE_KEYS if k in spec}})


def check_policy_fits_env(cfg, env) -> None:
    """Refuse, before anything is instantiated, a policy learner on an env it cannot act in: a tabular MDP (no
    observation or action space) or text prompts with a non-language-model policy."""
    name = group_choice_name(cfg)
    if getattr(env, "kind", None) == "prompts":
        target = OmegaConf.select(cfg, "policy._target_", default=None)
        try:
            pcls = get_object(target) if target else None  # a class, or a factory such as policy=auto's
        except Exception:  # noqa: BLE001 - reported by build_policy with the real reason
            return
        missing = [m for m in ("encode", "sample", "token_log_probs") if not callable(getattr(pcls, m, None))]
        if pcls is None or missing:
            from dppo.policies.check import LM_PROTOCOL

            shown = target.rsplit(".", 1)[-1] if target else "none"
            raise ConfigError(f"env=prompts has text prompts as observations, and the policy {shown} cannot act on "
                              f"them; use policy=lm ({LM_PROTOCOL})")
        return
    if getattr(env, "observation_space", None) is None or getattr(env, "action_space", None) is None:
        raise ConfigError(f"algo={name} trains a neural policy and needs an env with observation and action spaces "
                          f"(a gymnasium env.id, env=pendulum, env=bandit, or env=prompts with policy=lm); "
                          f"{getattr(env, 'id', type(env).__name__)} is a tabular MDP: use algo=ubev, pucb, dp_ubev, "
                          f"gfa or gfa_outcome")
