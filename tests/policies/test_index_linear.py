"""Discrete observations read by index (``IndexLinear``): the layer equals the Linear layer of the one-hot input,
and its per-user gradients (the materialised rule and the fused clipped sum) equal one ordinary backward per user;
users of scattered lengths laid out by length class give the same norms and sum as the definition."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from dppo.policies.mlp import MLPPolicy
from dppo.policies.observations import IndexLinear, ObservationEncoder, ObservationLayout
from dppo.policies.per_user_grads import clipped_gradient_sum, per_user_gradients
from dppo.policies.per_user_grads.layout import MANY_BUCKETS, by_length_class, length_class
from dppo.privacy.release import clip_scale
from tests.policies.test_clipped_sum import brute_force_flat, reference

SPACES = {"discrete": gym.spaces.Discrete(9, start=-2),
          "multidiscrete": gym.spaces.MultiDiscrete([3, 5]),
          "tuple": gym.spaces.Tuple((gym.spaces.Discrete(4), gym.spaces.MultiDiscrete([2, 3])))}


def stored(space, n, seed=0):
    layout = ObservationLayout(space)
    space.seed(seed)
    return torch.from_numpy(np.stack([layout.encode(space.sample()) for _ in range(n)]))


@pytest.mark.parametrize("name", sorted(SPACES))
def test_index_linear_equals_the_linear_layer_of_the_one_hot_input(name):
    space = SPACES[name]
    torch.manual_seed(0)
    policy = MLPPolicy(space, gym.spaces.Discrete(3), hidden_sizes=(8,))
    first = policy.body[1]
    assert isinstance(first, IndexLinear)
    obs = stored(space, 64)
    obs[0, 0] = 99.0      # outside the part's range: its one-hot row is all zeros
    obs[1, 0] = 0.5       # not an index: all zeros too
    one_hot = ObservationEncoder(ObservationLayout(space))(obs)
    expect = torch.nn.functional.linear(one_hot, first.weight, first.bias)
    torch.testing.assert_close(first(policy.body[0](obs)), expect, rtol=0, atol=1e-6)
    assert set(policy.state_dict()) == {"body.1.weight", "body.1.bias", "head.weight", "head.bias"}


def test_a_box_observation_keeps_the_dense_first_layer():
    policy = MLPPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), hidden_sizes=(8,))
    assert not any(isinstance(m, IndexLinear) for m in policy.modules())


def rows(space, m, seed):
    """Flat rows of m users with scattered lengths (one user without rows), sorted by user."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (m,), generator=g)
    lengths[3] = 0
    user = torch.arange(m).repeat_interleave(lengths)
    obs = stored(space, len(user), seed)
    actions = torch.randint(0, 3, (len(user),), generator=g)
    w = torch.randn(len(user), generator=g, dtype=torch.float64).float()
    return obs, actions, w, user


@pytest.mark.parametrize("name", sorted(SPACES))
def test_per_user_gradients_and_the_fused_sum_equal_one_backward_per_user(name):
    space = SPACES[name]
    torch.manual_seed(1)
    policy = MLPPolicy(space, gym.spaces.Discrete(3), hidden_sizes=(16, 16))
    m = 3 * MANY_BUCKETS   # enough runs of unequal lengths for the length-class layout
    obs, actions, w, user = rows(space, m, seed=2)
    expect = brute_force_flat(policy, (obs, actions), w, user, m)
    got = per_user_gradients(policy, (obs, actions), w, user, num_users=m).double()
    assert float((got - expect).norm()) <= 1e-5 * float(expect.norm())
    scale = lambda n: clip_scale(n, 0.05)
    s, n = clipped_gradient_sum(policy, (obs, actions), w, scale, user, num_users=m)
    s_ref, n_ref = reference(expect, scale)
    assert float((s - s_ref).norm()) <= 1e-5 * float(s_ref.norm())
    assert bool(((n - n_ref).abs() <= 1e-5 * n_ref.clamp_min(1e-12)).all())
    assert float(n[3]) == 0.0


def test_length_classes_are_a_function_of_a_users_own_count_and_at_most_one_and_a_half_times_it():
    counts = np.arange(1, 2000)
    cls = length_class(counts)
    assert (cls >= counts).all() and (cls <= np.maximum(1.5 * counts, counts + 1)).all()
    assert len(np.unique(cls)) <= 2 * int(np.log2(2000)) + 2
    user = torch.arange(40).repeat_interleave(torch.arange(1, 41))   # 40 distinct lengths: 40 runs
    relabel = by_length_class(user, None, 40)
    assert relabel is not None
    new_user, new_of_old = relabel
    assert sorted(new_of_old.tolist()) == list(range(40))
    assert torch.equal(new_user, new_of_old[user])
    assert by_length_class(torch.arange(40).repeat_interleave(3), None, 40) is None   # one run: unchanged


def test_a_users_norm_does_not_depend_on_the_rest_of_the_batch_under_length_classes():
    space = SPACES["discrete"]
    torch.manual_seed(3)
    policy = MLPPolicy(space, gym.spaces.Discrete(3), hidden_sizes=(16,))
    m = 3 * MANY_BUCKETS
    obs, actions, w, user = rows(space, m, seed=4)
    scale = lambda n: clip_scale(n, 1.0)
    _, n_all = clipped_gradient_sum(policy, (obs, actions), w, scale, user, num_users=m)
    keep = user < 5           # the first five users alone (few runs: the plain layout)
    _, n_few = clipped_gradient_sum(policy, (obs[keep], actions[keep]), w[keep], scale, user[keep], num_users=5)
    assert bool(((n_all[:5] - n_few).abs() <= 1e-6 * n_few.clamp_min(1e-12)).all())
