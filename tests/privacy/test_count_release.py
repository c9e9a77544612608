"""The count release (dppo/privacy/count_release.py): its sensitivity checked by brute force over small neighbouring
datasets, its noise scale from (eps, delta, sensitivity), and the one-pass gate."""
import itertools
import math

import numpy as np
import pytest

from dppo.errors import PrivacyError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.count_release import CountRelease, capped_contributions, count_sensitivity


def _contribution(steps, cap, entries, cols, model, c):
    """One user's released vector (x, reward part / c) from its steps [(entry, r01)], in step order."""
    if not steps:
        return np.zeros(entries + {"transition": entries, "next_state": 2 * cols, "public": 0}[model])
    e = np.array([s[0] for s in steps])
    r = np.array([s[1] for s in steps], dtype=float)
    x, y, col, per_user = capped_contributions(np.zeros(len(e), np.int64), np.arange(len(e)), e, r, cap, entries, cols)
    assert per_user.max() <= cap
    if model == "public":          # the env publishes its rewards: only the counts are released
        return x
    return np.concatenate([x, (y if model == "transition" else col) / c])


@pytest.mark.parametrize("model", ["transition", "next_state", "public"])
@pytest.mark.parametrize("cap,c", [(1, 1.0), (2, 2.0), (3, 0.5)])
def test_brute_force_sensitivity_matches_the_formula(model, cap, c):
    """Enumerate every episode of up to cap + 1 steps over 2 rows x 2 columns (4 entries, one outside the index set)
    with rewards in {0, 1}: the largest L2 distance between two users' contributions is the formula's."""
    entries, cols = 4, 2
    step_choices = [(e, r) for e in (-1, 0, 1, 2, 3) for r in (0.0, 1.0)]
    users = [list(p) for n in range(cap + 2) for p in itertools.product(step_choices, repeat=n)]
    vecs = np.unique(np.stack([_contribution(u, cap, entries, cols, model, c) for u in users]), axis=0)
    d = vecs[:, None, :] - vecs[None, :, :]
    worst = float(np.sqrt((d ** 2).sum(-1).max()))
    # the formula is tight when the index set has 2K disjoint entries (and columns); here it may hold K <= 2 entries
    assert worst <= count_sensitivity(cap, c, model) + 1e-12
    if 2 * cap <= cols or (model in ("transition", "public") and 2 * cap <= entries):
        assert worst == pytest.approx(count_sensitivity(cap, c, model))


def test_formula_is_attained_by_disjoint_users():
    """Two users with K disjoint entries in K disjoint columns, all rewards 1: the formula exactly."""
    K, c = 3, 2.0
    for model, parts in (("transition", 1), ("next_state", 2)):
        cols = 2 * K
        entries = 2 * K * cols
        a = _contribution([(i * cols + i, 1.0) for i in range(K)], K, entries, cols, model, c)
        b = _contribution([(i * cols + K + i, 1.0) for i in range(K)], K, entries, cols, model, c)
        assert np.linalg.norm(a - b) == pytest.approx(math.sqrt(2 * K * (1 + parts / c ** 2)))
        assert count_sensitivity(K, c, model) == pytest.approx(math.sqrt(2 * K * (1 + parts / c ** 2)))


def test_only_the_first_K_transitions_and_distinct_entries_count():
    user = np.array([0, 0, 0, 0, 1, 1])
    t = np.array([0, 1, 2, 3, 0, 1])
    e = np.array([5, 5, 6, 7, 5, -1])
    r = np.array([2.0, 0.0, 1.0, 1.0, -3.0, 1.0])      # out-of-range rewards are clipped into [0, 1]
    x, y, col, per_user = capped_contributions(user, t, e, r, 3, 8, 4)
    assert x.tolist() == [0, 0, 0, 0, 0, 2, 1, 0] and per_user.tolist() == [2, 1]
    assert y[5] == 1.0 and y[6] == 1.0                    # user 0: the first transition on entry 5 (reward 2 -> 1)
    assert col[:4].tolist() == [0, 2, 1, 0]               # columns 5 % 4 = 1 (both users) and 6 % 4 = 2


def test_noise_scale_comes_from_eps_delta_and_the_sensitivity():
    ctx = PrivacyContext(2.0, 1e-5, noise=NoiseSource(0))
    rel = CountRelease(ctx, 50_000, cap=20, reward_noise=4.0, cols=10, reward_model="next_state")
    sens = math.sqrt(2 * 20 * (1 + 2 / 16))
    assert rel.sensitivity == pytest.approx(sens)
    assert rel.sigma == pytest.approx(analytic_gaussian_sigma(2.0, 1e-5, sens))
    m, y, info = rel.release(0, [1, 2, 3], np.zeros(50_000), np.zeros(20))
    assert np.std(m) == pytest.approx(rel.sigma, rel=0.02) and y.shape == (20,)
    entry = ctx.ledger.entries[-1]
    assert entry["mechanism"] == "count_release" and entry["sigma"] == pytest.approx(rel.sigma)
    assert entry["sensitivity"] == pytest.approx(sens) and ctx.spent() == (2.0, 1e-5)


def test_a_user_in_two_releases_is_refused():
    ctx = PrivacyContext(1.0, 1e-5, noise=NoiseSource(0))
    rel = CountRelease(ctx, 4, cap=2, reward_noise=1.0)
    rel.release(0, [1, 2], np.zeros(4), np.zeros(4))
    with pytest.raises(PrivacyError):
        rel.release(1, [2, 3], np.zeros(4), np.zeros(4))
