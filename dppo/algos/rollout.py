"""Per-user episode collection (one user = one episode with its own reset seed) and returns-to-go."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from dppo.errors import DataError


@dataclass
class UserEpisodes:
    """Padded episodes of m users: ``obs[m, T, ...]``, ``actions[m, T]`` (long; ``[m, T, d]`` float for Box
    actions: the policy's pre-squash samples), ``rewards[m, T]`` (clipped),
    ``mask[m, T]`` (True on real steps), ``returns[m]`` (sum of clipped rewards), ``reward_clip_fraction``."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    mask: torch.Tensor
    returns: torch.Tensor
    reward_clip_fraction: float

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(1)


def clip_rewards(rewards: np.ndarray, bound: float | None) -> tuple[np.ndarray, int]:
    """Clip rewards to [-bound, bound] (enforces the range the sensitivity assumes); NaN/inf is an error."""
    if not np.all(np.isfinite(rewards)):
        raise DataError("the environment returned a NaN/inf reward; this round's data is discarded and not released")
    if bound is None:
        return rewards, 0
    clipped = np.clip(rewards, -bound, bound)
    return clipped, int(np.count_nonzero(clipped != rewards))


def collect_episodes(policy, env_factory, reset_seeds: list[int], *, reward_bound: float | None,
                     generator: torch.Generator | None = None, greedy: bool = False, envs=None) -> UserEpisodes:
    """Run one episode per reset seed, stepping all users in lockstep with batched policy calls.

    Rewards are clipped to [-reward_bound, reward_bound] as they arrive, before anything else sees them.
    Raises ``DataError`` on NaN/inf observations or rewards, or if the env raises mid-episode.
    """
    m, horizon = len(reset_seeds), env_factory.horizon
    envs = envs or [env_factory.make() for _ in range(m)]
    obs_list, act_list, rew_list = [[] for _ in range(m)], [[] for _ in range(m)], [[] for _ in range(m)]
    n_clipped = 0
    try:
        cur = [np.asarray(e.reset(seed=int(s))[0], dtype=np.float32) for e, s in zip(envs, reset_seeds)]
        active = list(range(m))
        for _ in range(horizon):
            if not active:
                break
            batch = np.stack([cur[i] for i in active]).reshape(len(active), -1)
            if not np.all(np.isfinite(batch)):
                raise DataError("the environment returned a NaN/inf observation; this round's data is discarded")
            actions, _ = policy.sample(torch.as_tensor(batch), greedy=greedy, generator=generator)
            env_actions = _env_actions(policy, actions)
            still = []
            for j, i in enumerate(active):
                a = env_actions[j]
                nxt, r, term, trunc, _ = envs[i].step(a)
                obs_list[i].append(cur[i]); act_list[i].append(_stored(actions[j])); rew_list[i].append(float(r))
                cur[i] = np.asarray(nxt, dtype=np.float32)
                if not (term or trunc):
                    still.append(i)
            active = still
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - any env failure aborts the round without releasing it
        raise DataError(f"the environment raised {type(err).__name__} mid-episode ({err}); the round is not released") from None
    finally:
        for e in envs:
            e.close()
    for i in range(m):  # clipped before anything else sees the rewards
        clipped, c = clip_rewards(np.asarray(rew_list[i], dtype=np.float64), reward_bound)
        rew_list[i] = clipped
        n_clipped += c
    return _pad(obs_list, act_list, rew_list, n_clipped)


def _pad(obs_list, act_list, rew_list, n_clipped) -> UserEpisodes:
    m = len(obs_list)
    T = max(1, max(len(a) for a in act_list))
    obs_shape = np.asarray(obs_list[0][0]).reshape(-1).shape
    obs = torch.zeros((m, T) + obs_shape)
    first = next((a[0] for a in act_list if a), 0)
    if isinstance(first, int):
        actions = torch.zeros(m, T, dtype=torch.long)
    else:  # continuous actions: (m, T, d) float
        actions = torch.zeros((m, T) + tuple(np.shape(first)), dtype=torch.float32)
    rewards = torch.zeros(m, T, dtype=torch.float64)
    mask = torch.zeros(m, T, dtype=torch.bool)
    for i in range(m):
        n = len(act_list[i])
        if n:
            obs[i, :n] = torch.as_tensor(np.stack(obs_list[i])).reshape(n, -1)
            actions[i, :n] = torch.as_tensor(np.stack(act_list[i]) if not isinstance(first, int) else act_list[i])
            rewards[i, :n] = torch.as_tensor(rew_list[i], dtype=torch.float64)
            mask[i, :n] = True
    steps = int(mask.sum())
    return UserEpisodes(obs, actions, rewards, mask, rewards.sum(1), n_clipped / max(steps, 1))


# ---- continuous actions (Box): minimal support in this rollout, to move into the shared rollout core ----
def _env_actions(policy, actions: torch.Tensor) -> list:
    """What each env receives: ints for Discrete policies; for continuous ones (``policy.env_action``) float32
    vectors squashed or clipped to the Box. The learner keeps the pre-squash samples (``_stored``)."""
    if actions.is_floating_point() and (hasattr(policy, "env_action") or getattr(policy, "continuous", False)):
        if not hasattr(policy, "env_action"):
            return list(actions.detach().cpu().numpy().astype(np.float32))
        return list(policy.env_action(actions).detach().cpu().numpy().astype(np.float32))
    return [int(a) for a in actions]


def _stored(action: torch.Tensor):
    return action.detach().cpu().numpy().astype(np.float32) if action.is_floating_point() else int(action)
# ---- end of continuous-action support -----------------------------------------------------------------


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{k>=t} gamma^(k-t) r_k per user (row), zero on padding."""
    out = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running * mask[:, t]
        out[:, t] = running * mask[:, t]
    return out


def max_return_to_go(reward_bound: float, gamma: float, horizon: int) -> float:
    """Largest |G_t| possible with rewards in [-R, R]: R (1 - gamma^H) / (1 - gamma)."""
    if gamma >= 1.0:
        return reward_bound * horizon
    return reward_bound * (1 - gamma**horizon) / (1 - gamma)


def is_finite(x: float) -> bool:
    return math.isfinite(float(x))
