"""Binary-tree continual counter: node noise scale, error bound coverage, exactness without noise."""
import math

import numpy as np
import pytest
import torch

from dppo.errors import PrivacyError
from dppo.privacy.noise import NoiseSource
from dppo.privacy.tree_counter import TreeCounter, laplace_sum_bound, tree_error_bound, tree_levels


def test_tree_levels_cover_capacity():
    assert [tree_levels(T) for T in (1, 2, 3, 4, 7, 8, 100000)] == [1, 2, 2, 3, 3, 4, 17]


def test_node_noise_scale_is_levels_times_sensitivity_over_eps():
    c = TreeCounter(4, capacity=1000, eps_stream=0.5, sensitivity=1.0, noise=NoiseSource(0))
    assert c.levels == 10
    assert c.scale == pytest.approx(10 * 1.0 / 0.5)


def test_node_noise_is_laplace_with_that_scale():
    """At t = 1 the release is one node: count + Laplace(b); E|Z| = b and Var Z = 2 b^2."""
    n = 200000
    c = TreeCounter(n, capacity=16, eps_stream=1.0, noise=NoiseSource(1), snap=False)
    c.step(torch.arange(n))
    err = c.released - 1.0
    b = c.scale
    assert err.abs().mean().item() == pytest.approx(b, rel=0.02)
    assert err.var().item() == pytest.approx(2 * b * b, rel=0.03)


def test_exact_counts_without_noise():
    g = torch.Generator().manual_seed(0)
    c = TreeCounter(7, capacity=50)
    total = torch.zeros(7, dtype=torch.float64)
    for _ in range(50):
        idx = torch.randperm(7, generator=g)[:3]
        vals = torch.rand(3, generator=g, dtype=torch.float64)
        c.step(idx, vals)
        total[idx] += vals
        assert torch.equal(c.released, total) or torch.allclose(c.released, total, atol=1e-12)


def test_release_equals_sum_of_dyadic_nodes_of_prefix():
    """Independent check of the tree: c~(t) = c(t) + sum of the noises of the nodes decomposing [1, t],
    each node's noise drawn when it closed (at its end time e, level = trailing zeros of e)."""
    T, n = 45, 3
    c = TreeCounter(n, capacity=T, eps_stream=1.0, noise=NoiseSource(2), snap=False)
    c.reserve(T)
    node_noise, counts = {}, torch.zeros(n, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    for t in range(1, T + 1):
        idx = torch.tensor([int(torch.randint(0, n, (1,), generator=g))])
        c.step(idx)
        counts[idx] += 1
        level = (t & -t).bit_length() - 1
        node_noise[t] = c.level_noise[level].clone()
        ends = [t & ~((1 << j) - 1) for j in range(t.bit_length()) if (t >> j) & 1]
        expected = counts + sum(node_noise[e] for e in ends)
        assert torch.allclose(c.released, expected, atol=1e-9), t


def test_error_bound_holds_at_least_one_minus_beta_of_the_time():
    T, n, beta = 64, 3000, 0.1
    c = TreeCounter(n, capacity=T, eps_stream=1.0, noise=NoiseSource(4))
    c.reserve(T)
    bound = c.error_bound(beta, uniform=False)
    g = torch.Generator().manual_seed(5)
    ok = total = 0
    for _ in range(T):
        idx = torch.randperm(n, generator=g)[: n // 2]
        c.step(idx)
        ok += int(((c.released - c.counts).abs() <= bound).sum())
        total += n
    assert ok / total >= 1 - beta
    # the bound is not vacuous: a large share of errors is more than a quarter of it
    assert ((c.released - c.counts).abs() > bound / 4).float().mean() > 0.05


def test_uniform_error_bound_covers_all_streams_and_steps():
    T, n, beta = 32, 500, 0.2
    failures = 0
    for seed in range(10):
        c = TreeCounter(n, capacity=T, eps_stream=2.0, noise=NoiseSource(seed))
        c.reserve(T)
        bound = c.error_bound(beta, uniform=True)
        worst = 0.0
        for _ in range(T):
            c.step([0])
            worst = max(worst, (c.released - c.counts).abs().max().item())
        failures += worst > bound
    assert failures <= 4  # P(failure) <= 0.2 per run; 5+ failures of 10 has probability < 0.04


def test_laplace_sum_bound_matches_exact_tail_for_one_term():
    # one Laplace: P(|Z| > lam) = exp(-lam / b) -> exact lam = b ln(1/beta); Chernoff is valid and close
    b, beta = 3.0, 1e-4
    lam = laplace_sum_bound(1, b, beta)
    assert b * math.log(1 / beta) <= lam <= 1.3 * b * math.log(2 / beta)


def test_uniform_bound_is_union_over_streams_and_steps():
    assert tree_error_bound(1.0, 100, 0.1, streams=10) == pytest.approx(
        laplace_sum_bound(tree_levels(100), tree_levels(100) / 1.0, 0.1 / 1000))


def test_increments_are_clipped_to_sensitivity():
    c = TreeCounter(2, capacity=4)
    c.step([0, 1], [5.0, -2.0])
    assert c.released.tolist() == [1.0, 0.0]


def test_more_steps_than_capacity_is_a_privacy_error():
    c = TreeCounter(1, capacity=2, eps_stream=1.0, noise=NoiseSource(0))
    c.step([0])
    c.step([0])
    with pytest.raises(PrivacyError):
        c.step([0])


def test_repeated_stream_in_one_step_is_a_privacy_error():
    c = TreeCounter(3, capacity=5)
    with pytest.raises(PrivacyError):
        c.step([1, 1])


def test_state_dict_roundtrip_resumes_identically():
    a = TreeCounter(5, capacity=20, eps_stream=1.0, noise=NoiseSource(7))
    for _ in range(6):
        a.step([1, 3])
    state = {k: v.clone() for k, v in a.state_dict().items()}
    noise_state = a.noise.state_dict()
    b = TreeCounter(5, capacity=20, eps_stream=1.0, noise=NoiseSource(0))
    b.load_state_dict(state)
    b.noise.load_state_dict(noise_state)
    a.reserve(5), b.reserve(5)
    for _ in range(5):
        a.step([2]), b.step([2])
    assert torch.equal(a.released, b.released)


def test_released_counts_are_snapped_to_a_power_of_two_grid_and_clamped():
    """Floating-point defence (Mironov 2012): releases are multiples of Lambda = 2^ceil(log2 b) >= b,
    within Lambda/2 of the exact noisy value, clamped to [-T Delta, T Delta]."""
    n, T = 5000, 8
    c = TreeCounter(n, capacity=T, eps_stream=0.7, noise=NoiseSource(9))
    grid = 2.0 ** math.ceil(math.log2(c.scale))
    assert c.snap_grid == grid and grid >= c.scale and c.snap_error == grid / 2
    for _ in range(T):
        c.step(torch.arange(0, n, 2))
        r = c.released
        assert torch.equal(torch.remainder(r, grid), torch.zeros_like(r))
        assert ((r - c.noisy_counts).abs() <= grid / 2).all() or (r.abs() == T).any()
        assert (r.abs() <= T * 1.0).all()
    assert c.error_bound(0.1, uniform=False) == pytest.approx(laplace_sum_bound(c.levels, c.scale, 0.1) + grid / 2)


def test_snapped_release_has_no_low_order_bits_to_leak():
    """Neighbouring counts (0 vs 1) give released values from the same lattice: the float-bit
    distinguisher that separates raw outputs finds nothing (every output is k * Lambda)."""
    outs = []
    for start in (0.0, 1.0):
        c = TreeCounter(20000, capacity=4, eps_stream=1.0, noise=NoiseSource(3))
        c.step(torch.arange(20000), torch.full((20000,), start)) if start else c.step([])
        outs.append(c.released)
    frac = [torch.frac(o / c.snap_grid).abs().max().item() for o in outs]
    assert frac == [0.0, 0.0]


def test_a_step_of_several_users_clips_each_and_is_one_tree_step():
    """add / close_step on the Laplace tree: each user's increment clipped to [0, Delta] on its own, the
    step releases their sum with one step's node noise (as step() with that sum)."""
    from dppo.privacy.noise import NoiseSource

    def make():
        return TreeCounter(3, 4, 1.0, sensitivity=1.0, noise=NoiseSource(2))

    a, b = make(), make()
    a.add([0, 1], [5.0, 0.5])
    a.add([1], [-2.0])
    a.close_step()
    assert a.counts.tolist() == [1.0, 0.5, 0.0] and a.steps_done == 1
    b._advance(b._numpy_views(), 1, [0, 1], np.array([1.0, 0.5]))
    assert torch.equal(a.released, b.released)
    with pytest.raises(PrivacyError):
        a.add([2])
        a.step([2])
