"""Replace-one sensitivity of the tabular statistics (brute force over all episode pairs), the counter
choice, and the ledger / zCDP accounting of the Gaussian counters."""
import itertools
import math

import numpy as np
import pytest

from dppo.errors import ConfigError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant
from dppo.privacy.gaussian_counter import (DENSE_MAX_STEPS, GaussianTreeCounter, OptimizedFactorizationCounter,
                                           SqrtFactorizationCounter)
from dppo.privacy.tabular_counters import (TabularLayout, build_counter, laplace_stream_eps, record_counter_releases,
                                           release_schedule)
from dppo.privacy.tree_counter import TreeCounter


def _all_increments(layout, S, A, H):
    """The clipped increment vector of every episode (states^(H+1) x actions^H x rewards in {0, 1}^H)."""
    counter = GaussianTreeCounter(layout.num_streams, 4, None, groups=layout.groups, group_mass=layout.group_mass,
                                  stream_max=layout.stream_max)
    rows = []
    for states in itertools.product(range(S), repeat=H + 1):
        for actions in itertools.product(range(A), repeat=H):
            patterns = itertools.product((0.0, 1.0), repeat=H) if H <= 3 else ([0.0] * H, [1.0] * H)
            for rewards in patterns:
                idx, vals = layout.increments(list(states), list(actions), list(rewards))
                x = np.zeros(layout.num_streams)
                clipped = counter.clip_increment(np.asarray(idx), np.asarray(vals))
                assert np.array_equal(clipped, counter.clip_increment(list(idx), list(vals)))   # both paths
                assert np.allclose(clipped, vals)          # the learner's increments already meet the premise
                x[idx] = clipped
                rows.append(x)
    return np.array(rows)


@pytest.mark.parametrize("pooled,cap,H,expect_sq", [(False, None, 3, 6 * 3), (True, None, 3, 6 * 3 * 3),
                                                    (True, 1, 2, 6 * 2), (True, 2, 4, 6 * 2 * 4)])
def test_l2_sensitivity_is_the_largest_change_over_all_pairs_of_episodes(pooled, cap, H, expect_sq):
    """S = A = 2 (S A >= 2 H / cap, so two episodes can use disjoint pairs and the bound is attained)."""
    S, A = 2, 2
    layout = TabularLayout(S, A, H, pooled=pooled, pool_cap=cap)
    X = _all_increments(layout, S, A, H)
    sq = (X * X).sum(1)
    d2 = sq[:, None] + sq[None, :] - 2 * X @ X.T
    worst = float(d2.max())
    assert worst <= layout.l2_sensitivity ** 2 + 1e-9
    assert worst == pytest.approx(layout.l2_sensitivity ** 2)          # tight
    assert layout.l2_sensitivity ** 2 == pytest.approx(expect_sq)
    l1 = max(np.abs(X[i] - X).sum(1).max() for i in range(len(X)))
    assert l1 <= layout.l1_sensitivity + 1e-9


@pytest.mark.parametrize("pooled,H", [(False, 3), (True, 3), (False, 1)])
def test_one_mass_per_stream_group_and_streams_are_grouped_by_set_and_step(pooled, H):
    """``group_mass`` is stated without building the per-stream groups (a layout too large for memory is refused
    before it is built): one entry per group the streams fall in, sets in order l, n, m, h-major."""
    S, A = 3, 2
    layout = TabularLayout(S, A, H, pooled=pooled)
    sizes = [H * S * A, H * S * A, H * S * A * S] if not pooled else [S * A, S * A, S * A * S]
    expect = np.concatenate([i * (1 if pooled else H) + np.arange(k) // (k // (1 if pooled else H))
                             for i, k in enumerate(sizes)])
    np.testing.assert_array_equal(layout.groups, expect)
    assert len(layout.group_mass) == int(expect.max()) + 1


@pytest.mark.parametrize("pooled,cap,H", [(False, None, 2), (True, 1, 2), (True, 2, 3)])
def test_weighted_sensitivity_is_the_largest_change_of_the_noise_scaled_data(pooled, cap, H):
    """Unequal noise per set is the Gaussian mechanism on the data divided by each set's multiplier: the
    brute-force largest L2 change of that scaled vector is ``weighted_l2_sensitivity``."""
    S, A, c = 2, 2, (2.0, 3.0, 0.5)
    layout = TabularLayout(S, A, H, pooled=pooled, pool_cap=cap, set_noise=c)
    X = _all_increments(layout, S, A, H) / layout.stream_noise()
    sq = (X * X).sum(1)
    worst = float((sq[:, None] + sq[None, :] - 2 * X @ X.T).max())
    assert worst == pytest.approx(layout.weighted_l2_sensitivity ** 2)
    assert layout.weighted_l2_sensitivity ** 2 == pytest.approx(layout.set_l2_sensitivity ** 2 * sum(1 / x ** 2 for x in c))
    assert TabularLayout(S, A, H, pooled=pooled, pool_cap=cap).weighted_l2_sensitivity == \
        TabularLayout(S, A, H, pooled=pooled, pool_cap=cap).l2_sensitivity


@pytest.mark.parametrize("kind", ["gaussian_tree", "gaussian_sqrt"])
def test_unequal_set_noise_composes_to_the_target_eps_and_scales_each_sets_noise(kind):
    layout = TabularLayout(3, 2, 4, pooled=True, pool_cap=1, set_noise=(2.0, 4.0, 1.0))
    ctx = PrivacyContext(2.0, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(0))
    c = build_counter(kind, layout, 100, ctx)
    record_counter_releases(ctx, c, layout, users=100)
    entries = ctx.ledger.entries
    assert [e["sigma"] for e in entries] == pytest.approx([2 * c.sigma, 4 * c.sigma, c.sigma])
    for e in entries:
        assert e["rho"] == pytest.approx(e["sensitivity"] ** 2 / (2 * e["sigma"] ** 2))
    assert sum(e["rho"] for e in entries) == pytest.approx(c.rho)
    assert ctx.spent() == pytest.approx((2.0, 1e-5))
    with pytest.raises(ConfigError):
        build_counter("laplace_tree", layout, 100, ctx)
    with pytest.raises(ConfigError):
        TabularLayout(3, 2, 4, pooled=True, set_noise=(1.0, 0.0, 1.0))


def test_counter_choice_and_calibration():
    layout = TabularLayout(3, 2, 5, pooled=True, pool_cap=1)
    ctx = PrivacyContext(1.0, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(0))
    assert isinstance(build_counter("laplace_tree", layout, 100, ctx), TreeCounter)
    assert isinstance(build_counter("gaussian_tree", layout, 100, ctx), GaussianTreeCounter)
    g = build_counter("gaussian", layout, 100, ctx)              # few steps: the optimized factorization
    assert isinstance(g, OptimizedFactorizationCounter)
    assert g.sigma == pytest.approx(layout.l2_sensitivity * g.kappa / math.sqrt(2 * g.rho))
    g = build_counter("gaussian", layout, DENSE_MAX_STEPS + 1, ctx)      # many: the square-root factorization
    assert isinstance(g, SqrtFactorizationCounter)
    assert g.sigma == pytest.approx(layout.l2_sensitivity * g.kappa / math.sqrt(2 * g.rho))
    with pytest.raises(ConfigError):
        build_counter("gaussian_opt", layout, DENSE_MAX_STEPS + 1, ctx)
    with pytest.raises(ConfigError):
        build_counter("gaussian_fancy", layout, 100, ctx)


@pytest.mark.parametrize("kind", ["gaussian_tree", "gaussian_sqrt", "gaussian_opt"])
@pytest.mark.parametrize("pooled", [False, True])
def test_ledger_entries_compose_to_the_target_eps_in_zcdp(kind, pooled):
    layout = TabularLayout(3, 2, 4, pooled=pooled, pool_cap=None)
    ctx = PrivacyContext(2.0, 1e-5, accountant=make_accountant("zcdp"), noise=NoiseSource(0))
    steps = 200 if kind == "gaussian_opt" else 1000           # the optimized factorization is for block releases
    c = build_counter(kind, layout, steps, ctx)
    record_counter_releases(ctx, c, layout, users=1000)
    entries = ctx.ledger.entries if hasattr(ctx.ledger, "entries") else ctx.ledger.state_dict()["entries"]
    assert len(entries) == 3
    for e in entries:
        assert e["adjacency"] == "replace_one"
        assert e["noise_multiplier"] == pytest.approx(e["sigma"] / e["sensitivity"])
        assert e["rho"] == pytest.approx(e["sensitivity"] ** 2 / (2 * e["sigma"] ** 2))
        assert e["sigma"] == pytest.approx(c.sigma)
    assert sum(e["rho"] for e in entries) == pytest.approx(c.rho)
    assert ctx.spent() == pytest.approx((2.0, 1e-5))


@pytest.mark.parametrize("T,growth", [(1, 1.05), (50, 1.0), (1000, 1.05), (100000, 1.05), (12345, 1.5)])
def test_release_schedule_blocks_grow_by_the_factor_and_end_at_T(T, growth):
    ends = release_schedule(T, growth)
    assert ends[-1] == T and all(b > a for a, b in zip([0] + ends, ends))
    sizes = [b - a for a, b in zip([0] + ends, ends)]
    for t0, size in zip([0] + ends[:-1], sizes[:-1]):
        assert size == max(1, math.ceil(t0 * growth) - t0)       # one episode, or the growth factor
    if growth == 1.0:
        assert ends == list(range(1, T + 1))
    if (T, growth) == (100000, 1.05):
        assert len(ends) == 187                                   # what docs/tabular.md quotes
    with pytest.raises(ConfigError):
        release_schedule(T, 0.9)
    capped = release_schedule(T, growth, max_block=7)
    assert capped[-1] == T and max(b - a for a, b in zip([0] + capped, capped)) <= 7
    short = next((i for i, size in enumerate(sizes) if size > 7), len(ends))
    assert capped[:short] == ends[:short]                         # the same schedule until blocks reach the cap


def test_laplace_per_stream_budget_is_eps_over_6H_per_step_and_composes_to_eps():
    """PUCB's eps/(6H): each of the three sets has 2H streams changed per user, each eps/(6H)-DP."""
    for H in (1, 4, 20):
        layout = TabularLayout(3, 2, H, pooled=False)
        assert laplace_stream_eps(1.5, layout) == 1.5 / (6 * H)
        assert 3 * layout.streams_changed_per_set * laplace_stream_eps(1.5, layout) == pytest.approx(1.5)
    pooled = TabularLayout(3, 2, 4, pooled=True, pool_cap=2)
    assert 3 * pooled.streams_changed_per_set * laplace_stream_eps(1.5, pooled) == pytest.approx(1.5)
