"""Pre-flight check of a policy (built or passed in) against the policy protocol and the env's spaces.

Run by the builder before any user is drawn, so a module that cannot act in the environment fails with one
line naming the policy, not after a round's users were marked used with an error blaming the environment.
The probe acts once on a fixed observation of the space with its own generator (no global RNG is touched).
"""
from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import torch

from dppo.errors import ConfigError

PROTOCOL = ("a dppo policy provides sample(obs, greedy, generator) -> (actions, log_probs) and a differentiable "
            "log_prob(obs, actions): subclass dppo.policies.base.Policy and implement logits(obs) (Discrete "
            "actions), or use dppo.policies.gaussian.GaussianMLPPolicy (Box actions)")


def check_env(env) -> None:
    """An env factory for the policy learners: spaces, a horizon and ``make()`` (a prompts env has no spaces: its
    protocol is text, checked with the policy by ``check_policy``)."""
    if getattr(env, "kind", None) == "prompts":
        return
    missing = [a for a in ("observation_space", "action_space", "horizon") if not hasattr(env, a)]
    if missing or not (callable(getattr(env, "make", None)) or hasattr(env, "reset_seeds")):
        raise ConfigError(f"the env passed in ({type(env).__name__}) is not an env factory: it needs "
                          f"observation_space, action_space, horizon and make() (see dppo.envs.gym_env."
                          f"GymEnvFactory); missing {missing or ['make']}")


def probe_observation(space: gym.Space) -> torch.Tensor:
    """One public observation of ``space`` as a policy reads it (``dppo.policies.observations``), batch of 1."""
    if not isinstance(space, gym.spaces.Box):
        from dppo.policies.observations import ObservationLayout

        layout = ObservationLayout(space)   # a one-line error for a space the policies cannot read
        probe = copy.deepcopy(space)
        probe.seed(0)
        return torch.as_tensor(layout.encode(probe.sample()))[None]
    low = np.nan_to_num(np.asarray(space.low, np.float64), neginf=-1.0)
    high = np.nan_to_num(np.asarray(space.high, np.float64), posinf=1.0)
    return torch.as_tensor(np.clip(np.zeros(space.shape), low, high), dtype=torch.float32)[None]


LM_PROTOCOL = ("a language-model policy provides encode(prompts) -> (ids, mask), sample(prompt_ids, prompt_mask, "
               "...) and token_log_probs(prompt_ids, prompt_mask, completion_ids, ...): use policy=lm "
               "(dppo.policies.lm.LMPolicy)")


def check_lm_policy(policy) -> None:
    """The prompts env's protocol (completions of text prompts), checked without generating anything."""
    name = type(policy).__name__
    missing = [m for m in ("encode", "sample", "token_log_probs") if not callable(getattr(policy, m, None))]
    if not isinstance(policy, torch.nn.Module) or missing:
        raise ConfigError(f"the policy ({name}) cannot act on env=prompts (missing {missing or ['nn.Module']}); "
                          f"{LM_PROTOCOL}")


def check_policy(policy, env) -> None:
    """Raise ``ConfigError`` (one line) unless ``policy`` follows the protocol and acts in ``env``'s spaces."""
    name = type(policy).__name__
    if getattr(env, "kind", None) == "prompts":  # prompts are text: the language-model protocol applies
        return check_lm_policy(policy)
    if not isinstance(policy, torch.nn.Module):
        raise ConfigError(f"the policy ({name}) is not a torch.nn.Module; {PROTOCOL}")
    if not (callable(getattr(policy, "sample", None)) and callable(getattr(policy, "log_prob", None))):
        raise ConfigError(f"the policy ({name}) does not implement the policy protocol; {PROTOCOL}")
    obs_space, act_space = env.observation_space, env.action_space
    obs = probe_observation(obs_space)
    try:
        actions, _ = policy.sample(obs, greedy=False, generator=torch.Generator().manual_seed(0))
        logp = policy.log_prob(obs, actions)
    except Exception as err:  # noqa: BLE001 - the user's module raised: say so, in one line
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"the policy ({name}) fails on an observation of {obs_space}: "
                          f"{type(err).__name__}: {msg}; {PROTOCOL}") from None
    if not (torch.is_tensor(logp) and logp.shape == (1,) and bool(torch.isfinite(logp).all())):
        raise ConfigError(f"the policy ({name}).log_prob must return one finite value per observation, got "
                          f"{getattr(logp, 'shape', logp)}")
    if isinstance(act_space, gym.spaces.Discrete):
        if not torch.is_tensor(actions) or actions.is_floating_point() or actions.shape != (1,) \
                or not 0 <= int(actions[0]) < int(act_space.n):
            raise ConfigError(f"the policy ({name}) must sample integer actions in 0..{int(act_space.n) - 1} for "
                              f"the env's {act_space}, got {actions!r}")
    elif isinstance(act_space, gym.spaces.Box):
        if not hasattr(policy, "env_action"):
            raise ConfigError(f"the env has a Box action space ({act_space}) but the policy ({name}) is not a "
                              f"continuous policy (no env_action); use policy=gaussian")
        a = policy.env_action(actions).detach().cpu().numpy()[0]
        if a.shape != act_space.shape or not act_space.contains(a.astype(act_space.dtype)):
            raise ConfigError(f"the policy ({name}) produced the action {a} outside the env's {act_space}")
    elif isinstance(act_space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        a = policy.env_action(actions).detach().cpu().numpy()[0] if hasattr(policy, "env_action") else None
        if a is None or not act_space.contains(np.asarray(a).astype(act_space.dtype)):
            raise ConfigError(f"the policy ({name}) must produce actions in the env's {act_space} (env_action), got "
                              f"{a}; use policy=multi_discrete")
    else:
        raise ConfigError(f"action space {type(act_space).__name__} is not supported by the policy learners "
                          f"(Discrete, MultiDiscrete, MultiBinary or 1-d Box); flatten it with a wrapper "
                          f"(env.wrappers=[...])")
