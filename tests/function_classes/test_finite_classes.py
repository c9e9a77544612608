"""Finite classes: explicit tables, the realizable ContextBits class, the linear epsilon-net."""
import pytest
import torch

from dppo.envs.context_bits import ContextBitsMDP
from dppo.errors import ConfigError
from dppo.function_classes import ContextBitsClass, LinearGridClass, TensorClass


def test_tensor_class_gathers_values_and_clips_to_the_declared_range():
    table = torch.tensor([[0.5, 2.0, -1.0], [0.1, 0.2, 0.3]])
    fc = TensorClass(table, value_max=1.0)
    got = fc.values(torch.tensor([[2, 1], [0, 0]]))
    assert got.shape == (2, 2, 2)
    assert torch.allclose(got[0], torch.tensor([[0.0, 1.0], [0.5, 0.5]]))
    assert torch.allclose(fc.values(torch.tensor([1]), torch.tensor([1])), torch.tensor([[0.2]]))


@pytest.mark.parametrize("variant", ["easy", "hard"])
def test_context_bits_class_contains_q_star(variant):
    env = ContextBitsMDP(variant)
    fc = ContextBitsClass(env, size=243)
    assert fc.size == 243
    assert torch.allclose(fc.member_table(fc.q_star_index).double(), env.q_star(), atol=1e-6)


@pytest.mark.parametrize("variant", ["easy", "hard"])
def test_every_member_is_the_scaled_q_star_of_the_mdp_with_its_masks(variant):
    """Independent check: build the MDP a member describes and compare its Q* (times the scale)."""
    env = ContextBitsMDP(variant)
    fc = ContextBitsClass(env, size=50, seed=3)
    for i in [0, 7, 19, 49]:
        other = ContextBitsMDP(variant, masks=fc.masks[i].tolist())
        want = other.q_star() * float(fc.scales[i])
        assert torch.allclose(fc.member_table(i).double(), want, atol=1e-6)


def test_context_bits_class_members_are_distinct_and_size_reaches_1e5():
    env = ContextBitsMDP("hard")
    fc = ContextBitsClass(env, size=100_000, seed=1)
    assert fc.size == 100_000
    assert len(torch.unique(fc.codes)) == 100_000
    assert fc.values(torch.tensor([5, 100])).shape == (100_000, 2)


def test_context_bits_class_rejects_scales_without_one():
    with pytest.raises(ConfigError):
        ContextBitsClass(ContextBitsMDP("easy"), size=10, scales=(0.5, 2.0))


def test_linear_grid_is_an_epsilon_net_with_the_documented_radius():
    g = torch.Generator().manual_seed(0)
    phi = torch.rand(30, 3, generator=g)
    fc = LinearGridClass(phi, torch.linspace(-1, 1, 5), value_max=10.0)
    assert fc.size == 125
    assert fc.covering_radius() == pytest.approx(0.25 * float(phi.abs().sum(1).max()), rel=1e-6)
    for _ in range(20):
        w = torch.rand(3, generator=g) * 2 - 1
        target = (phi @ w).clamp(0, 10)
        dist, _ = fc.distance_to(target)
        assert dist <= fc.covering_radius() + 1e-6


def test_linear_grid_rejects_a_non_uniform_grid():
    with pytest.raises(ConfigError):
        LinearGridClass(torch.ones(4, 2), [0.0, 0.1, 0.5])
