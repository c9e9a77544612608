"""Action masks, in the conventions users have (gymnasium's ``info["action_mask"]``, sb3-contrib's
``action_masks()``, ICU-Sepsis's ``info["admissible_actions"]``): a masked policy never takes a masked-out action,
its distribution is the softmax over the admissible actions only (checked against an independent computation), its
per-user gradients are the masked log-probability's, and the stored mask columns are read by nothing else (the
critic, the state dict)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from dppo.envs.gym_env import GymEnvFactory
from dppo.envs.masks import detect, mask_table
from dppo.envs.rollout import RolloutEngine
from dppo.errors import ConfigError
from dppo.policies.critic import ValueMLP
from dppo.policies.masked import MASKED_LOGIT, MaskedPolicy, wrap_for_env
from dppo.policies.mlp import MLPPolicy
from dppo.policies.per_user_grads import per_user_gradients

N_STATES, N_ACTIONS = 5, 4


def allowed(state: int) -> np.ndarray:
    """State s admits actions s % 4 and (s + 1) % 4 (two of four)."""
    m = np.zeros(N_ACTIONS, dtype=np.int8)
    m[[state % N_ACTIONS, (state + 1) % N_ACTIONS]] = 1
    return m


class Ring(gym.Env):
    """A ring of 5 states; an admissible action moves one step on, an inadmissible one would crash the env."""

    observation_space = gym.spaces.Discrete(N_STATES)
    action_space = gym.spaces.Discrete(N_ACTIONS)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.s = int(self.np_random.integers(N_STATES))
        return self.s, {"action_mask": allowed(self.s)}

    def step(self, action):
        if not allowed(self.s)[int(action)]:
            raise RuntimeError(f"inadmissible action {action} in state {self.s}")
        self.s = (self.s + 1 + int(self.np_random.integers(2))) % N_STATES
        return self.s, float(int(action) == 0), False, False, {"action_mask": allowed(self.s)}


class RingMethod(Ring):
    """The same rules, offered through sb3-contrib's ``action_masks()`` method and no info key."""

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, {}

    def step(self, action):
        obs, r, te, tr, _ = super().step(action)
        return obs, r, te, tr, {}

    def action_masks(self):
        return allowed(self.s).astype(bool)


class RingAdmissible(Ring):
    """The same rules as ICU-Sepsis offers them: ``info["admissible_actions"]``, a list of indices."""

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, {"admissible_actions": list(np.flatnonzero(allowed(obs)))}

    def step(self, action):
        obs, r, te, tr, _ = super().step(action)
        return obs, r, te, tr, {"admissible_actions": list(np.flatnonzero(allowed(obs)))}


for _name, _cls in (("MaskRingInfo-v0", Ring), ("MaskRingMethod-v0", RingMethod),
                    ("MaskRingAdmissible-v0", RingAdmissible)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=_cls, max_episode_steps=12)


def masked_policy(factory, seed: int = 0) -> MaskedPolicy:
    torch.manual_seed(seed)
    policy = MLPPolicy(factory.observation_space, factory.action_space, hidden_sizes=(8,))
    with torch.no_grad():
        policy.head.weight.normal_(0, 3.0)     # far from uniform: a masked-out action would be likely
    return wrap_for_env(policy, factory)


@pytest.mark.parametrize("env_id,source", [("MaskRingInfo-v0", "info"), ("MaskRingMethod-v0", "method"),
                                           ("MaskRingAdmissible-v0", "admissible")])
def test_every_convention_is_found_and_no_masked_action_is_ever_taken(env_id, source):
    factory = GymEnvFactory(env_id, vectorization="sync")
    assert factory.mask_source == source
    policy = masked_policy(factory)
    assert isinstance(policy, MaskedPolicy)
    n, H = 64, 12
    batch = RolloutEngine(factory).run(policy, list(range(n)), torch.rand(n, H, dtype=torch.float64),
                                       reward_bound=1.0)
    states = batch.obs[..., 0][batch.mask].long().numpy()
    masks = batch.obs[..., 1:][batch.mask].numpy()
    actions = batch.actions[batch.mask].numpy()
    np.testing.assert_array_equal(masks, np.stack([allowed(s) for s in states]))   # the state's own mask, stored
    assert all(allowed(s)[a] for s, a in zip(states, actions))                     # the env would have raised


def test_masked_distribution_is_the_softmax_over_admissible_actions():
    factory = GymEnvFactory("MaskRingInfo-v0", vectorization="sync")
    policy = masked_policy(factory)
    states = torch.arange(N_STATES, dtype=torch.float32)[:, None]
    rows = torch.cat([states, torch.as_tensor(np.stack([allowed(s) for s in range(N_STATES)]), dtype=torch.float32)], 1)
    logp = torch.log_softmax(policy.logits(rows).double(), -1)
    raw = policy.policy.logits(states).double()
    for s in range(N_STATES):                    # independent: softmax over the two admissible logits
        ok = np.flatnonzero(allowed(s))
        expect = torch.log_softmax(raw[s, ok], -1)
        torch.testing.assert_close(logp[s, ok], expect, rtol=0, atol=1e-6)
        assert torch.all(logp[s, [a for a in range(N_ACTIONS) if a not in ok]] < MASKED_LOGIT / 2)
    greedy = policy.predict(np.arange(N_STATES), deterministic=True,
                            action_masks=np.stack([allowed(s) for s in range(N_STATES)]))
    assert all(allowed(s)[a] for s, a in zip(range(N_STATES), greedy))


def test_per_user_gradients_are_those_of_the_masked_log_probability():
    factory = GymEnvFactory("MaskRingInfo-v0", vectorization="sync")
    policy = masked_policy(factory, seed=3)
    states = torch.tensor([[1.0], [2.0], [4.0]])
    masks = torch.as_tensor(np.stack([allowed(int(s)) for s in states[:, 0]]), dtype=torch.float32)
    actions = torch.tensor([2, 3, 0])
    rows = torch.cat([states, masks], 1)
    got = per_user_gradients(policy, (rows[:, None], actions[:, None]), torch.ones(3, 1)).double()
    inner = policy.policy
    for u in range(3):                           # independent: autograd of log softmax over the admissible logits
        inner.zero_grad()
        ok = torch.as_tensor(np.flatnonzero(masks[u].numpy()))
        z = inner.logits(states[u:u + 1])[0]
        lp = torch.log_softmax(z[ok], -1)[int((ok == actions[u]).nonzero())]
        lp.backward()
        expect = torch.cat([p.grad.reshape(-1) for p in inner.parameters()]).double()
        torch.testing.assert_close(got[u], expect, rtol=1e-4, atol=1e-6)


def test_mask_columns_are_invisible_to_the_state_dict_and_the_critic():
    factory = GymEnvFactory("MaskRingInfo-v0", vectorization="sync")
    policy = masked_policy(factory)
    assert list(policy.state_dict()) == list(policy.policy.state_dict())
    critic = ValueMLP(factory.observation_space, (8,))
    with torch.no_grad():
        critic.head.weight.normal_()
    states = torch.arange(N_STATES, dtype=torch.float32)[:, None]
    rows = torch.cat([states, torch.ones(N_STATES, N_ACTIONS)], 1)
    torch.testing.assert_close(critic.value(rows), critic.value(states), rtol=0, atol=0)


def test_masks_can_be_turned_off_or_asked_for_by_name():
    assert GymEnvFactory("MaskRingInfo-v0", action_mask="none").mask_source is None
    assert GymEnvFactory("MaskRingMethod-v0", action_mask="method").mask_source == "method"
    with pytest.raises(ConfigError, match="offers no"):
        GymEnvFactory("MaskRingMethod-v0", action_mask="info")
    with pytest.raises(ConfigError, match="must be one of"):
        detect(Ring(), {}, "sometimes")
    unmasked = GymEnvFactory("MaskRingInfo-v0", action_mask="none")
    assert not isinstance(wrap_for_env(MLPPolicy(unmasked.observation_space, unmasked.action_space), unmasked),
                          MaskedPolicy)


def test_icu_sepsis_admissible_sets_on_the_native_and_the_single_env_backends():
    pytest.importorskip("icu_sepsis")
    table = mask_table(GymEnvFactory("icu_sepsis:Sepsis/ICU-Sepsis-v2"))
    assert table.shape == (716, 25) and 1 <= table.sum(1).min() and table.sum(1).mean() < 4
    for mode in ("native", "sync"):
        factory = GymEnvFactory("icu_sepsis:Sepsis/ICU-Sepsis-v2", vectorization=mode, num_envs=8)
        assert factory.mask_source == "admissible"
        policy = masked_policy(factory)
        n = 40
        batch = RolloutEngine(factory).run(policy, list(range(n)), torch.rand(n, 500, dtype=torch.float64),
                                           reward_bound=1.0)
        states = batch.obs[..., 0][batch.mask].long().numpy()
        np.testing.assert_array_equal(batch.obs[..., 1:][batch.mask].numpy().astype(bool), table[states])
        assert table[states, batch.actions[batch.mask].numpy()].all()
