"""UBEV and PUCB on statistics pooled over h (with block releases), and the tabular learners' memory: the
counter chosen and the statistics refused by the memory they would need, before anything is allocated."""
import numpy as np
import pytest

from dppo.algos.dp_ubev import DPUBEV
from dppo.algos.ucb import PUCB, UBEV
from dppo.envs.tabular import random_mdp
from dppo.errors import ConfigError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant
from dppo.privacy.gaussian_counter import COUNTERS
from dppo.privacy.tabular_counters import TabularLayout, counter_arrays
from dppo.privacy.tree_counter import TreeCounter
from tests.algos.test_ucb import _naive_privq, _naive_ubev_q

POOLED = dict(pool_steps=True, pool_cap=1, block_growth=1.05)


def _ctx(eps, accountant="basic", seed=0):
    return PrivacyContext(eps, accountant=make_accountant(accountant), noise=NoiseSource(seed))


def _per_step(stats, H):
    """Pooled (l, n, m) [1, ...] as the per-step arrays every step h reads."""
    return [np.broadcast_to(np.asarray(x), (H,) + np.asarray(x).shape[1:]) for x in stats]


def test_pooled_ubev_plans_ubev_on_the_pooled_counts_at_every_step():
    S, A, H = 6, 3, 5
    ubev = UBEV(random_mdp(S=S, A=A, H=H, seed=0), privacy=_ctx(None), seed=1, episodes=12, episodes_per_round=12,
                **POOLED)
    ubev.train_round(0)
    l, n, m = _per_step(ubev.released_stats(), H)
    assert ubev.released_stats()[1].shape == (1, S, A)
    assert (n == 0).any() and (n >= 3).any()
    np.testing.assert_allclose(ubev.q_values(), _naive_ubev_q(l, n, m, S, A, H, 0.05), rtol=1e-12, atol=1e-12)


def test_pooled_ubev_is_dp_ubevs_twin_without_noise():
    """UBEV pooled with blocks and DP-UBEV at eps=null with the same layout plan and run the same episodes."""
    mdp = random_mdp(S=5, A=2, H=6, seed=3)
    ubev = UBEV(mdp, privacy=_ctx(None), seed=2, episodes=600, episodes_per_round=300, **POOLED)
    twin = DPUBEV(mdp, privacy=_ctx(None), seed=2, episodes=600, episodes_per_round=300, **POOLED)
    for r in range(2):
        a, b = ubev.train_round(r), twin.train_round(r)
        assert a["regret/cumulative"] == b["regret/cumulative"]
    np.testing.assert_array_equal(ubev.q_values(), twin.q_values())


def test_pooled_pucb_plans_privq_on_the_pooled_counts_at_every_step():
    S, A, H = 3, 2, 3
    pucb = PUCB(random_mdp(S=S, A=A, H=H, seed=2), privacy=_ctx(30.0), seed=0, episodes=1000,
                episodes_per_round=1000, **POOLED)
    pucb.train_round(0)
    l, n, m = _per_step(pucb.released_stats(), H)
    gate = n >= 2 * pucb.E
    assert gate.any() and (~gate).any()
    naive = _naive_privq(l, n, m, S, A, H, pucb.E, 1000, pucb.beta_prime)
    np.testing.assert_allclose(pucb.q_values(), naive, rtol=1e-10, atol=1e-10)
    assert pucb.q_values().shape == (H, S, A)


def test_pooled_pucb_charges_the_pooled_sensitivity_once():
    pucb = PUCB(random_mdp(S=3, A=2, H=4, seed=2), privacy=_ctx(2.0), seed=0, episodes=100, episodes_per_round=50,
                **POOLED)
    pucb.train_round(0)
    entries = [e for e in pucb.privacy.ledger.entries if e["mechanism"] == "tree_counter"]
    assert len(entries) == 3 and all(e["pooled"] for e in entries)
    assert sum(e["eps"] for e in entries) == pytest.approx(2.0)


@pytest.mark.parametrize("kind", ["gaussian_tree", "gaussian_sqrt", "gaussian_opt", "laplace_tree"])
def test_counter_arrays_count_every_array_a_private_counter_holds(kind):
    """After a release, the counter's buffers are ``counter_arrays`` float64 arrays of the streams (the noise is
    drawn into the state: more streams than ``max_chunk`` here)."""
    n, T = 5000, 40
    if kind == "laplace_tree":
        ctr = TreeCounter(n, T, 1.0, noise=NoiseSource(0), max_chunk=1000)
    else:
        ctr = COUNTERS[kind](n, T, 1.0, noise=NoiseSource(0), max_chunk=1000)
    ctr.reserve(1)
    ctr.step(np.arange(3))
    held = sum(b.numel() for b in ctr.buffers() if b.numel() >= n)
    chunk = getattr(getattr(ctr, "_pending", None), "chunk", None)
    held += 0 if chunk is None else chunk.size
    assert held == counter_arrays(kind, T, True) * n


def test_noise_drawn_in_pieces_has_the_release_std():
    """More streams than ``max_chunk``: every step's noise is drawn in pieces straight into the state; the release
    error is still exactly ``N(0, release_std^2)`` per stream, with the per-set multipliers."""
    lay = TabularLayout(20, 10, 1, pooled=True, set_noise=(2.0, 2.0, 1.0))
    n = lay.num_streams
    ctr = COUNTERS["gaussian_tree"](n, 8, 1.0, noise=NoiseSource(5), groups=lay.group_ranges(),
                                     group_mass=lay.group_mass, stream_noise=lay.stream_noise_ranges(), max_chunk=999)
    ctr.reserve(3)
    for _ in range(3):
        ctr.step([0], [1.0])
    err = (ctr.released - ctr.counts).numpy() / lay.stream_noise()
    assert err.std() == pytest.approx(ctr.release_std(), rel=0.03)


def test_stream_ranges_give_the_layouts_per_stream_groups_and_multipliers():
    for pooled in (True, False):
        lay = TabularLayout(3, 2, 4, pooled=pooled, set_noise=(2.0, 3.0, 1.0))
        i = np.arange(lay.num_streams)
        np.testing.assert_array_equal(lay.group_ranges().of(i), lay.groups)
        np.testing.assert_array_equal(lay.stream_noise_ranges().of(i), lay.stream_noise())
        assert [lay.group_ranges().of_one(int(k)) for k in i] == lay.groups.tolist()


def _big_mdp():
    return random_mdp(S=120, A=10, H=20, seed=0)     # 144k pooled transition streams, 2.9M per step


def test_statistics_over_the_budget_are_refused_naming_the_fixes():
    with pytest.raises(ConfigError, match=r"needs ~0\.\d+ GB .*algo\.pool_steps=true.*algo\.max_memory_gb"):
        UBEV(_big_mdp(), privacy=_ctx(None), episodes=100, max_memory_gb=0.05)
    with pytest.raises(ConfigError, match=r"algo\.block_growth=1\.05"):
        PUCB(_big_mdp(), privacy=_ctx(1.0), episodes=100, pool_steps=True, max_memory_gb=0.01)


def test_gaussian_is_the_most_accurate_counter_that_fits_the_budget():
    """``counter=gaussian``: the optimized factorization where its history fits, the square-root factorization,
    then the tree; each learner's estimate (with the round's stored policies, 18 MB here) stays within its budget."""
    mdp = _big_mdp()
    kinds = {}
    for gb in (2.0, 0.05, 0.035):
        learner = DPUBEV(mdp, privacy=_ctx(3.0, "gdp"), episodes=20000, max_memory_gb=gb)
        kinds[gb] = learner.counter_kind
        assert learner.memory_gb <= gb
    assert kinds == {2.0: "gaussian_opt", 0.05: "gaussian_sqrt", 0.035: "gaussian_tree"}
    with pytest.raises(ConfigError, match=r"needs ~0\.03\d* GB"):    # the tree and the round's stored policies
        DPUBEV(mdp, privacy=_ctx(3.0, "gdp"), episodes=20000, max_memory_gb=0.02)
