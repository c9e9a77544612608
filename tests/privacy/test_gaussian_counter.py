"""Gaussian continual counters (``dppo.privacy.gaussian_counter``) and the factorizations they run
(``dppo.privacy.counter_factorizations``): exact release variance, float-exact releases, bound coverage, and the
zCDP calibration."""
import math

import numpy as np
import pytest
import torch
from scipy.linalg import solve_triangular

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy.accountants.zcdp import rho_for_target, zcdp_to_dp
from dppo.privacy.counter_factorizations import optimized_factorization, sqrt_coefficients, sqrt_factorization
from dppo.privacy.gaussian_counter import (GRID, GaussianTreeCounter, OptimizedFactorizationCounter,
                                           SqrtFactorizationCounter, chi_union_quantile, gaussian_union_quantile)
from dppo.privacy.noise import NoiseSource


def _toeplitz(col):
    T = len(col)
    M = np.zeros((T, T))
    for k in range(T):
        M[np.arange(k, T), np.arange(0, T - k)] = col[k]
    return M


@pytest.mark.parametrize("T", [1, 2, 7, 64, 300])
def test_sqrt_factorization_is_exact_B_times_C_equals_prefix_sums(T):
    f = sqrt_factorization(T)
    B, C = _toeplitz(f["b"]), _toeplitz(f["c"])
    A = np.tril(np.ones((T, T)))
    assert np.allclose(B @ C, A, atol=1e-10)
    assert np.allclose(solve_triangular(B, A, lower=True), C, atol=1e-10)
    assert f["kappa"] == pytest.approx(np.linalg.norm(C, axis=0).max(), rel=1e-12)
    assert np.allclose(f["var_factor"], np.cumsum(f["b"] ** 2))
    assert np.allclose(np.sqrt((B * B).sum(1)), np.sqrt(f["var_factor"]))


def test_sqrt_decoder_approximates_the_square_root_of_the_prefix_sum_matrix():
    T = 100000
    f = sqrt_factorization(T)
    s = sqrt_coefficients(T)
    assert np.max(np.abs(f["b"] / s - 1)) < 1e-3
    # both factors' norms match the exact A^(1/2) (sum_k s_k^2), far below the tree's L at T = 1e5
    exact = float(np.sum(s * s))
    assert f["kappa"] * math.sqrt(f["var_factor"][-1]) == pytest.approx(exact, rel=1e-3)
    assert exact < 0.3 * T.bit_length()


@pytest.mark.parametrize("cls", [GaussianTreeCounter, SqrtFactorizationCounter, OptimizedFactorizationCounter])
def test_release_noise_is_the_decoder_applied_to_the_drawn_noise(cls):
    """Replays the NoiseSource: releases minus counts equal round_grid(B z) with the factorization's B."""
    n, T, sigma = 5, 37, 3.0
    c = cls(n, T, sigma, noise=NoiseSource(4), groups=np.zeros(n, np.int64), group_mass=np.array([float(n)]))
    c.reserve(T)
    got = []
    for _ in range(T):
        c.step(np.arange(n), np.ones(n))
        got.append((c.released - c.counts).numpy().copy())
        assert torch.equal(c.released, c.counts + torch.round(c.noise_now / GRID) * GRID)
    z = NoiseSource(4).gaussian((T, n), sigma).numpy()
    if cls is SqrtFactorizationCounter:
        expect = _toeplitz(sqrt_factorization(T)["b"]) @ z
    elif cls is OptimizedFactorizationCounter:
        expect = optimized_factorization(T)["B"] @ z
    else:   # tree: the node closing at e holds z_e; the release at t sums the nodes of t's dyadic decomposition
        expect = np.zeros((T, n))
        for t in range(1, T + 1):
            end = 0
            for j in reversed(range(T.bit_length())):
                if (t >> j) & 1:
                    end += 1 << j
                    expect[t - 1] += z[end - 1]
    assert np.allclose(np.array(got), np.round(expect / GRID) * GRID, atol=1e-9)


@pytest.mark.parametrize("cls", [GaussianTreeCounter, SqrtFactorizationCounter, OptimizedFactorizationCounter])
def test_release_error_has_the_exact_variance(cls):
    n, T, sigma = 100000, 13, 2.0
    c = cls(n, T, sigma, noise=NoiseSource(1), groups=np.zeros(n, np.int64), group_mass=np.array([float(n)]))
    c.reserve(T)
    for t in range(1, T + 1):
        c.step(np.arange(n))
        err = (c.released - c.counts).numpy()
        assert err.mean() == pytest.approx(0.0, abs=5 * c.release_std() / math.sqrt(n))
        assert err.var() == pytest.approx(c.release_std() ** 2, rel=0.02)
        assert c.release_std() == pytest.approx(sigma * math.sqrt(c.var_factor(t)))
    if cls is GaussianTreeCounter:
        assert [c.var_factor(t) for t in (1, 3, 7, 8, 13)] == [1, 2, 3, 1, 3]


@pytest.mark.parametrize("cls", [GaussianTreeCounter, SqrtFactorizationCounter, OptimizedFactorizationCounter])
def test_per_stream_noise_multiplier_scales_the_release_error_std(cls):
    """``stream_noise = c``: every stream's release error is exactly ``N(0, (c_i release_std)^2)``."""
    n, T, sigma = 60000, 9, 1.5
    mult = np.repeat([0.5, 1.0, 3.0], n // 3)
    c = cls(n, T, sigma, noise=NoiseSource(2), groups=np.zeros(n, np.int64), group_mass=np.array([float(n)]),
            stream_noise=mult)
    c.reserve(T)
    for t in range(1, T + 1):
        c.step(np.arange(n))
        err = (c.released - c.counts).numpy() / mult
        for part in np.split(err, 3):
            assert part.var() == pytest.approx(c.release_std() ** 2, rel=0.04)
    with pytest.raises(ConfigError):
        cls(3, T, sigma, noise=NoiseSource(2), stream_noise=[1.0, -1.0, 1.0])


@pytest.mark.parametrize("cls", [GaussianTreeCounter, SqrtFactorizationCounter])
def test_fraction_of_releases_outside_the_bound_is_below_beta(cls):
    n, T, sigma, beta = 2000, 200, 1.0, 0.05
    c = cls(n, T, sigma, noise=NoiseSource(2), groups=np.zeros(n, np.int64), group_mass=np.array([float(n)]))
    c.reserve(T)
    g = np.random.default_rng(0)
    out_single = out_union = 0
    for t in range(1, T + 1):
        idx = np.flatnonzero(g.random(n) < 0.3)
        c.step(idx, np.ones(idx.size))
        err = np.abs((c.released - c.counts).numpy())
        out_single += int((err > c.error_bound(beta, releases=1)).sum())
        out_union += int((err > c.error_bound(beta, releases=n * T)).sum())
    frac = out_single / (n * T)
    assert 0.5 * beta < frac < beta * 1.1          # per-release bound: exact variance, so about beta
    assert out_union == 0                          # union bound over every release: none outside


def test_union_quantile_is_the_two_sided_normal_tail():
    from scipy.stats import norm

    z = gaussian_union_quantile(0.05, 1000)
    assert 2 * norm.sf(z) * 1000 == pytest.approx(0.05, rel=1e-9)


def test_rho_calibration_round_trip():
    for eps in (0.5, 1.0, 5.0):
        rho = rho_for_target(eps, 1e-5)
        assert zcdp_to_dp(rho, 1e-5) == pytest.approx(eps, rel=1e-9)


def test_exact_counts_without_noise_and_grid_quantized_rewards():
    c = SqrtFactorizationCounter(3, 10, None, groups=np.zeros(3, np.int64), group_mass=np.array([5.0]))
    c.step([0, 2], [0.3, 1.0])
    assert c.released.tolist() == [math.floor(0.3 / GRID) * GRID, 0.0, 1.0]


def test_increments_are_clipped_to_the_sensitivity_premise():
    c = GaussianTreeCounter(4, 10, None, groups=np.array([0, 0, 1, 1]), group_mass=np.array([1.0, 1.0]))
    c.step([0, 1, 2, 3], [0.8, 0.8, -1.0, 7.0])
    v = c.counts.numpy()
    assert v[0] + v[1] <= 1.0 and v[2] == 0.0 and v[3] == 1.0


def test_capacity_and_repeated_streams_are_privacy_errors():
    c = GaussianTreeCounter(2, 1, 1.0, noise=NoiseSource(0))
    with pytest.raises(PrivacyError):
        c.step([0, 0])
    c.step([0])
    with pytest.raises(PrivacyError):
        c.step([1])


@pytest.mark.parametrize("cls", [GaussianTreeCounter, SqrtFactorizationCounter, OptimizedFactorizationCounter])
def test_state_dict_round_trip_continues_identically(cls):
    def make():
        return cls(6, 20, 1.5, noise=NoiseSource(3), groups=np.zeros(6, np.int64), group_mass=np.array([6.0]))

    a = make()
    for _ in range(7):
        a.step([1, 4])
    b = make()
    b.load_state_dict(a.state_dict())
    b.noise.load_state_dict(a.noise.state_dict())
    for _ in range(5):
        a.step([2])
        b.step([2])
    assert torch.equal(a.released, b.released)


def test_chi_union_quantile_is_the_chi_square_tail_and_the_normal_one_for_one_coordinate():
    from scipy.stats import chi2

    q = chi_union_quantile(0.05, 1000, 7)
    assert chi2.sf(q * q, 7) * 1000 == pytest.approx(0.05, rel=1e-9)
    assert chi_union_quantile(0.05, 1000, 1) == gaussian_union_quantile(0.05, 1000)
    assert chi_union_quantile(0.05, 1000, 2) > gaussian_union_quantile(0.05, 1000)


@pytest.mark.parametrize("cls", [GaussianTreeCounter, SqrtFactorizationCounter, OptimizedFactorizationCounter])
def test_norm_of_a_pairs_release_noise_exceeds_its_quantile_with_the_stated_probability(cls):
    """The per-pair widths of DP-UBEV bound the norm of the noise vector of one pair's release (its visit,
    reward and S transition entries): simulated on the counter's own noise, the fraction of releases whose
    norm exceeds ``chi_union_quantile(p, 1, k) sigma_t`` is at most p (and close to it: the variance is exact),
    and the union quantile over all releases is never exceeded."""
    pairs, k, T, sigma, p = 4000, 4, 50, 2.0, 0.02
    n = pairs * k
    c = cls(n, T, sigma, noise=NoiseSource(6), groups=np.zeros(n, np.int64), group_mass=np.array([float(n)]))
    c.reserve(T)
    q_one, q_all = chi_union_quantile(p, 1, k), chi_union_quantile(p, pairs * T, k)
    outside = outside_all = 0
    for _ in range(T):
        c.step([])
        xi = (c.released - c.counts).numpy().reshape(pairs, k)
        norm = np.sqrt((xi * xi).sum(1))
        std = c.release_std()
        outside += int((norm > q_one * std + GRID * math.sqrt(k)).sum())
        outside_all += int((norm > q_all * std + GRID * math.sqrt(k)).sum())
    frac = outside / (pairs * T)
    assert 0.7 * p < frac < p * 1.15
    assert outside_all == 0


@pytest.mark.parametrize("cls", [GaussianTreeCounter, SqrtFactorizationCounter, OptimizedFactorizationCounter])
def test_a_step_of_several_users_releases_their_summed_clipped_increments(cls):
    """add / close_step: each user is clipped on its own (group mass 1 per user, not per step), the step's
    increment is the sum, the noise is one step of the counter (same as step() with the summed increment)."""
    def make():
        return cls(4, 5, 1.0, noise=NoiseSource(9), groups=np.array([0, 0, 1, 1]), group_mass=np.array([1.0, 1.0]))

    a, b = make(), make()
    a.reserve(1)
    b.reserve(1)
    a.add([0, 1], [0.8, 0.8])                       # group 0 mass 1.6 > 1: scaled to 0.5 + 0.5
    a.add([0, 3], [0.25, 7.0])                      # stream 3 clipped to 1
    assert torch.equal(a.released, torch.zeros(4)) and int(a.pending_users) == 2
    with pytest.raises(PrivacyError):
        a.step([2])                                 # users are waiting in the open step
    a.close_step()
    assert a.counts.tolist() == [0.75, 0.5, 0.0, 1.0] and a.steps_done == 1 and int(a.pending_users) == 0
    assert a.pending.abs().sum() == 0
    b.step([0], [0.5])                              # one user: the same noise for the same step
    assert torch.equal(a.released - a.counts, b.released - b.counts)
    a.add([2], [1.0])
    state = a.state_dict()                          # the open step travels with a checkpoint (between rounds)
    c = make()
    c.load_state_dict(state)
    c.noise.load_state_dict(a.noise.state_dict())
    a.reserve(1)
    c.reserve(1)
    a.close_step()
    c.close_step()
    assert torch.equal(a.released, c.released) and c.counts.tolist() == [0.75, 0.5, 1.0, 1.0]


@pytest.mark.parametrize("T,weights", [(1, None), (9, None), (40, None), (40, "late")])
def test_optimized_factorization_is_exact_and_lowers_the_weighted_error_at_equal_sensitivity(T, weights):
    """The decoder B that runs and the encoder C = B^{-1} A factor the prefix sums; kappa is C's largest column
    norm (recomputed independently, rounded up); the weighted mean release std at that kappa is below the
    exact square-root factorization's (A^(1/2) with its own kappa) - the objective it optimizes."""
    w = None if weights is None else tuple([1e-3] * (T // 2) + [1.0] * (T - T // 2))
    f = optimized_factorization(T, w)
    A = np.tril(np.ones((T, T)))
    B = f["B"]
    assert np.array_equal(B, np.tril(B))                                  # streaming: e(t) uses z_1..z_t only
    C = solve_triangular(B, A, lower=True)
    assert np.allclose(B @ C, A, atol=1e-10) and np.allclose(C, np.tril(C), atol=1e-12)
    kappa = np.linalg.norm(C, axis=0).max()
    assert kappa <= f["kappa"] <= kappa * (1 + 1e-8)
    assert np.allclose(f["var_factor"], (B * B).sum(1))
    ww = np.ones(T) if w is None else np.array(w)
    s = _toeplitz(sqrt_coefficients(T))
    sqrt_obj = np.linalg.norm(s, axis=0).max() * (ww * np.linalg.norm(s, axis=1)).sum() / ww.sum()
    opt_obj = f["kappa"] * (ww * np.sqrt(f["var_factor"])).sum() / ww.sum()
    assert opt_obj <= sqrt_obj * (1 + 1e-9)
    if T >= 40:
        assert opt_obj < 0.97 * sqrt_obj


def test_optimized_counter_sensitivity_by_brute_force_over_users_blocks_and_episodes():
    """Participation of the learner: users = episodes, each in one block (counter step), several per block.
    For every pair of episodes of a small pooled MDP (first visit per pair kept, unequal set noise), every
    block j and either user of a two-user block, the change of the encoded data C (X / c) in Frobenius norm
    is at most kappa times the layout's weighted sensitivity, with equality for some replacement."""
    import itertools

    from dppo.privacy.tabular_counters import TabularLayout

    S, A, H, T = 2, 2, 2, 4
    lay = TabularLayout(S, A, H, pooled=True, pool_cap=1, set_noise=(2.0, 2.0, 1.0))
    f = optimized_factorization(T, (1e-3, 1e-3, 1.0, 1.0))
    C = solve_triangular(f["B"], np.tril(np.ones((T, T))), lower=True)
    scale = 1.0 / lay.stream_noise()
    ctr = OptimizedFactorizationCounter(lay.num_streams, T, None, groups=lay.groups, group_mass=lay.group_mass,
                                        stream_max=lay.stream_max)

    def vec(ep):
        idx, vals = lay.increments(*ep)
        x = np.zeros(lay.num_streams)
        x[idx] = ctr.clip_increment(idx, vals)
        return x * scale

    episodes = []
    for states in itertools.product(range(S), repeat=H + 1):
        for actions in itertools.product(range(A), repeat=H):
            for rewards in itertools.product((0.0, 1.0), repeat=H):
                episodes.append((list(states), list(actions), list(rewards)))
    X = np.array([vec(e) for e in episodes])
    g = np.random.default_rng(0)
    others = X[g.integers(len(X), size=(T, 2))]                          # two users per block
    base = C @ others.sum(1)
    worst = 0.0
    for j in range(T):
        for who in range(2):
            # replacing user `who` of block j by each episode: only row j of the data changes
            for x in X[:: max(1, len(X) // 300)]:
                data = others.copy()
                data[j, who] = x
                worst = max(worst, float(np.linalg.norm(C @ data.sum(1) - base)))
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1).max()             # the largest change of one user
    bound = f["kappa"] * lay.weighted_l2_sensitivity
    assert math.sqrt(d2) == pytest.approx(lay.weighted_l2_sensitivity, rel=1e-12)
    j_star = int(np.argmax(np.linalg.norm(C, axis=0)))
    i, k = np.unravel_index(np.argmax(((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)), (len(X), len(X)))
    data = others.copy()
    data[j_star, 0] = X[i]
    data2 = others.copy()
    data2[j_star, 0] = X[k]
    attained = float(np.linalg.norm(C @ (data.sum(1) - data2.sum(1))))
    assert worst <= bound and attained == pytest.approx(bound, rel=1e-8)


def test_optimized_counter_error_matches_its_covariance_in_simulation():
    """The noise the counter adds has covariance sigma^2 B B^T over its releases (the widths read the diagonal):
    the empirical covariance over many streams matches it entrywise."""
    n, T, sigma = 40000, 12, 1.5
    w = tuple([1e-3] * 4 + [1.0] * 8)
    c = OptimizedFactorizationCounter(n, T, sigma, noise=NoiseSource(5), groups=np.zeros(n, np.int64),
                                      group_mass=np.array([float(n)]), row_weights=w)
    c.reserve(T)
    errs = []
    for t in range(1, T + 1):
        c.step([])
        errs.append((c.released - c.counts).numpy().copy())
        assert c.release_std() == pytest.approx(sigma * math.sqrt(c.var_factor(t)), rel=1e-12)
    E = np.array(errs)
    B = optimized_factorization(T, w)["B"]
    cov = sigma ** 2 * B @ B.T
    emp = E @ E.T / n
    sd = np.sqrt(np.outer(np.diag(cov), np.diag(cov)) + cov ** 2) / math.sqrt(n)   # std of each entry's estimate
    assert np.all(np.abs(emp - cov) < 5 * sd + 1e-9)
    assert np.allclose(np.diag(cov), [c.release_std(t) ** 2 for t in range(1, T + 1)])
