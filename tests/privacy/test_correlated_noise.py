"""Correlated noise across rounds (dppo/privacy/factorizations.py, correlated.py and the release): the
sensitivity bound against brute force on small dense matrices, the recursive noise against C^{-1} z, the
calibration to exactly (eps, delta), the ledger, and the independent-noise path left untouched. DP-PG's release is
the composed release's k = 1 case (one part, each user in one sum)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.composed import ComposedGaussianSums, Correlated, composed_sums
from dppo.privacy.correlated import CorrelatedNoise, NoiseStream
from dppo.privacy.factorizations import (factorization, inverse_coefficients, is_stable, participation_norm_sq,
                                         prefix_error_variances, relative_error, sqrt_coefficients,
                                         stream_sensitivity)


def dense(c, T):
    """The T x T lower-triangular banded Toeplitz matrix of coefficients c (independent construction)."""
    C = np.zeros((T, T))
    for i in range(T):
        for j in range(i + 1):
            if i - j < len(c):
                C[i, j] = c[i - j]
    return C


COEFFS = [[1.0], [1.0, 0.5], list(sqrt_coefficients(4)), [1.0, -0.7, 0.3], [1.0, 0.2, 0.9, 0.1]]


@pytest.mark.parametrize("c", COEFFS)
def test_single_participation_sensitivity_is_twice_the_clip_times_the_largest_column_norm(c):
    for T in (len(c), 7):
        C = dense(c, T)
        assert stream_sensitivity(c, 0.3, 1) == pytest.approx(2 * 0.3 * np.linalg.norm(C, axis=0).max(), rel=1e-12)


@pytest.mark.parametrize("c", COEFFS)
@pytest.mark.parametrize("E", [1, 2, 3])
def test_participation_bound_covers_every_set_of_releases_by_brute_force(c, E):
    """B_E >= sum_{i,j in S} |<C_i, C_j>| for every S of E columns of every stream length (truncated columns
    included), which bounds ||C (sum_S e_i delta_i^T)||^2 / (2 C_clip)^2 for every direction."""
    bound = participation_norm_sq(c, E)
    worst = 0.0
    for T in range(E, 9):
        G = np.abs(dense(c, T).T @ dense(c, T))
        for S in itertools.combinations(range(T), E):
            worst = max(worst, G[np.ix_(S, S)].sum())
    assert worst <= bound + 1e-12
    rng = np.random.default_rng(0)
    C = dense(c, 8)
    for _ in range(200):   # random unit-norm changes of a user in E random releases (dimension 3)
        S = rng.choice(8, E, replace=False)
        delta = rng.normal(size=(E, 3))
        delta /= np.linalg.norm(delta, axis=1, keepdims=True)
        change = C[:, S] @ delta
        assert np.linalg.norm(change) <= math.sqrt(bound) + 1e-12


@pytest.mark.parametrize("c", [[1.0], [1.0, 0.5], list(sqrt_coefficients(4)), [1.0, 0.4, 0.2]])
@pytest.mark.parametrize("E", [1, 3])
def test_participation_bound_is_attained_by_consecutive_releases_for_nonnegative_decreasing_coefficients(c, E):
    C = dense(c, 12)
    S = list(range(2, 2 + E))                     # interior, consecutive; all changes the same unit vector
    assert np.linalg.norm(C[:, S].sum(1)) ** 2 == pytest.approx(participation_norm_sq(c, E), rel=1e-12)


def test_inverse_coefficients_and_prefix_error_match_dense_algebra():
    c, T = [1.0, 0.6, 0.3, 0.1], 9
    C = dense(c, T)
    Cinv = np.linalg.inv(C)
    assert np.allclose(inverse_coefficients(c, T), Cinv[:, 0], atol=1e-12)
    A = np.tril(np.ones((T, T)))
    assert np.allclose(prefix_error_variances(c, T), ((A @ Cinv) ** 2).sum(1), atol=1e-12)
    beta = 0.9
    Am = np.array([[(1 - beta ** (i - j + 1)) / (1 - beta) if j <= i else 0.0 for j in range(T)] for i in range(T)])
    assert np.allclose(prefix_error_variances(c, T, beta), ((Am @ Cinv) ** 2).sum(1), atol=1e-10)


def test_noise_stream_is_sigma_times_c_inverse_z_drawn_recursively():
    c, T = list(factorization("banded", 4, 20)), 20
    stream = NoiseStream(c, NoiseSource(3))
    got = torch.stack([stream.draw((5,)) for _ in range(T)]).numpy()
    source = NoiseSource(3)   # the same seeded z, drawn as the stream draws them (one release at a time)
    z = torch.stack([torch.randn(5, generator=source.generator, dtype=torch.float64) for _ in range(T)]).numpy()
    assert np.allclose(got, np.linalg.solve(dense(c, T), z), atol=1e-12)
    assert len(stream.history) == 3   # b - 1 vectors kept


def test_optimized_banded_beats_the_truncated_square_root_and_independent_noise():
    for T, E, mom in ((100, 1, 0.0), (100, 1, 0.9), (60, 3, 0.0)):
        opt = relative_error(factorization("banded", 6, T, E, mom), T, E, mom)
        assert opt <= relative_error(sqrt_coefficients(6), T, E, mom) + 1e-9
        assert opt < 1.0
    assert min(factorization("banded", 6, 60, 3)) >= 0   # c >= 0: the bound is exact for consecutive releases


def dp_pg_release(privacy):
    """DP-PG's release: the composed release's k = 1 case (one part, each user in one sum of its round)."""
    return composed_sums(privacy, parts={"actor": (1, 1.0)})


def dp_pg_mean(rel, rows, round_idx, clip):
    """One DP-PG round: opened for the rows' users, their noisy clipped sum over m."""
    users = list(range(100 * round_idx, 100 * round_idx + rows.shape[0]))
    rel.open_round(round_idx, users, (clip,), dim=rows.shape[1])
    total, stats = rel.release_sum(rows, users, clip, part="actor")
    return total / len(users), stats


def test_dp_pg_correlated_release_is_calibrated_to_eps_delta_and_records_one_entry_per_round():
    privacy = PrivacyContext(2.0, 1e-5, noise=NoiseSource(0))
    privacy.noise_correlation = CorrelatedNoise("banded", 4, rounds=30)
    rel = dp_pg_release(privacy)
    assert isinstance(rel.noise, Correlated) and rel.mechanism == "correlated_gaussian_sum"
    c = rel.coefficients["actor"]
    assert list(c) == list(factorization("banded", 4, 30, 1))
    sens = 2 * 0.5 * float(np.linalg.norm(c))
    assert rel.sensitivity(0.5, "actor") == pytest.approx(sens, rel=1e-12)
    # the whole budget on one stream: exactly the analytic Gaussian at the stream's sensitivity
    assert rel.sigma(0.5, "actor") == analytic_gaussian_sigma(2.0, 1e-5, stream_sensitivity(c, 0.5, 1))
    for r in range(3):
        mean, stats = dp_pg_mean(rel, torch.randn(6, 4, dtype=torch.float64), r, 0.5)
        assert mean.shape == (4,) and rel.noise_std(0.5, "actor") > 0
    entries = privacy.ledger.entries
    assert [e["round"] for e in entries] == [0, 1, 2] and all(e["users"] == 6 and e["dim"] == 4 for e in entries)
    assert all(e["eps"] == 2.0 and e["sensitivity"] == pytest.approx(sens) for e in entries)
    assert all(e["sigma"] == rel.sigma(0.5, "actor") and e["clip"] == 0.5 for e in entries)
    assert privacy.spent() == (2.0, 1e-5)


def test_dp_pg_noise_is_the_stream_of_the_factorization_and_the_twin_is_unchanged():
    """The released sums minus the clipped sums are sigma C^{-1} z for the run's seeded z."""
    privacy = PrivacyContext(1.0, 1e-5, noise=NoiseSource(5))
    privacy.noise_correlation = CorrelatedNoise("banded_sqrt", 3, rounds=10)
    rel = dp_pg_release(privacy)
    rows = [torch.randn(4, 2, dtype=torch.float64) * 0.1 for _ in range(6)]  # norms < C: no clipping
    noise = np.array([(dp_pg_mean(rel, r, t, 1.0)[0] * 4 - r.sum(0)).numpy() for t, r in enumerate(rows)])
    source = NoiseSource(5)
    z = torch.stack([torch.randn(2, generator=source.generator, dtype=torch.float64) for _ in range(6)]).numpy()
    sigma = rel.sigma(1.0, "actor")
    assert np.allclose(noise, sigma * np.linalg.solve(dense(sqrt_coefficients(3), 6), z), atol=1e-10)
    independent = dp_pg_release(PrivacyContext(1.0, 1e-5, noise=NoiseSource(5)))
    assert type(independent) is ComposedGaussianSums and independent.mechanism == "gaussian_sum"
    twin = PrivacyContext(None)
    twin.noise_correlation = CorrelatedNoise()
    out, _ = dp_pg_mean(dp_pg_release(twin), rows[0], 0, 1.0)
    assert torch.equal(out, rows[0].sum(0) / 4)


def test_dp_ppo_correlated_sums_give_every_user_exactly_eps_delta():
    privacy = PrivacyContext(3.0, 1e-5, noise=NoiseSource(1))
    privacy.noise_correlation = CorrelatedNoise("banded", 4, rounds=5)
    rel = composed_sums(privacy, parts={"actor": (3, 0.7), "critic": (3, 0.3)})
    assert isinstance(rel.noise, Correlated)
    mu = 1 / analytic_gaussian_sigma(3.0, 1e-5, 1.0)
    assert rel.gdp_mu == pytest.approx(mu, rel=1e-12)
    for p, w in (("actor", 0.7), ("critic", 0.3)):   # (Delta_p / sigma_p)^2 = w_p mu^2
        delta_p = stream_sensitivity(rel.coefficients[p], 0.2, 3)
        assert (delta_p / rel.sigma(0.2, p)) ** 2 == pytest.approx(w * mu ** 2, rel=1e-12)
    for r in range(2):
        rel.open_round(r, [10 * r, 10 * r + 1], (0.2, 0.2))
        for _ in range(3):
            for p in ("actor", "critic"):
                rel.release_sum(torch.randn(2, 5, dtype=torch.float64), [10 * r, 10 * r + 1], 0.2, part=p)
        with pytest.raises(PrivacyError, match="more than 3 releases"):
            rel.release_sum(torch.randn(2, 5, dtype=torch.float64), [10 * r], 0.2, part="actor")
    assert len(privacy.ledger.entries) == 2 and privacy.spent() == (3.0, 1e-5)
    with pytest.raises(PrivacyError, match="clip"):
        rel.open_round(2, [30], (0.3, 0.2))


def test_refusals_are_one_line_config_errors():
    privacy = PrivacyContext(1.0, 1e-5, noise=NoiseSource(0))
    with pytest.raises(ConfigError, match="noise_correlation must be one of"):
        CorrelatedNoise("tree", 4)
    with pytest.raises(ConfigError, match="bands"):
        CorrelatedNoise("banded", 0)
    privacy.noise_correlation = CorrelatedNoise("banded", 2)
    with pytest.raises(ConfigError, match="accountant=gdp"):
        composed_sums(privacy, composition="rdp", parts={"actor": (2, 0.5), "critic": (2, 0.5)})
    assert type(composed_sums(PrivacyContext(1.0, 1e-5), parts={"a": (2, 1.0)})) is ComposedGaussianSums


def test_the_workload_option_picks_the_factorizations_momentum_from_the_learners_optimizer():
    """privacy.noise_workload: auto takes DP-PG's SGD momentum (0.9 by default) and prefix sums for Adam; prefix
    optimizes for prefix sums whatever the optimizer; momentum without SGD momentum is refused in one line."""
    from hydra.utils import get_class

    from dppo.api import make_config
    from dppo.build.privacy import correlated_noise
    pg = get_class("dppo.algos.pg.PolicyGradient")
    base = ["algo=dp_pg", "eps=1", "privacy.noise_correlation=banded", "privacy.bands=4", "rounds=20"]
    assert correlated_noise(make_config(base), pg).momentum == 0.9
    assert correlated_noise(make_config(base + ["algo.momentum=0.5"]), pg).momentum == 0.5
    assert correlated_noise(make_config(base + ["algo.optimizer=adam"]), pg).momentum == 0.0
    prefix = correlated_noise(make_config(base + ["privacy.noise_workload=prefix"]), pg)
    assert prefix.momentum == 0.0 and list(prefix.coefficients(20)) == list(factorization("banded", 4, 20, 1, 0.0))
    momentum = correlated_noise(make_config(base + ["privacy.noise_workload=momentum"]), pg)
    assert list(momentum.coefficients(20)) == list(factorization("banded", 4, 20, 1, 0.9))
    with pytest.raises(ConfigError, match="noise_workload=momentum needs"):
        correlated_noise(make_config(base + ["privacy.noise_workload=momentum", "algo.optimizer=adam"]), pg)
    with pytest.raises(ConfigError, match="noise_workload must be one of"):
        correlated_noise(make_config(base + ["privacy.noise_workload=adam"]), pg)


def test_a_seeded_stream_refuses_to_start_mid_run_and_a_secure_one_starts_a_new_block():
    seeded = PrivacyContext(1.0, 1e-5, noise=NoiseSource(0))
    seeded.noise_correlation = CorrelatedNoise("banded", 3)
    with pytest.raises(PrivacyError, match="seeded run mid-stream"):
        dp_pg_mean(dp_pg_release(seeded), torch.ones(2, 3), 4, 1.0)
    assert seeded.ledger.entries == []   # refused before the round's entry
    secure = PrivacyContext(1.0, 1e-5)
    secure.noise_correlation = CorrelatedNoise("banded", 3)
    rel = dp_pg_release(secure)
    dp_pg_mean(rel, torch.ones(2, 3), 4, 1.0)
    dp_pg_mean(rel, torch.ones(2, 3), 5, 1.0)
    assert [e["stream_start"] for e in secure.ledger.entries] == [4, 4]
    assert secure.spent() == (1.0, 1e-5)


@pytest.mark.slow   # long: pytest -m slow (scripts/reproduce_suite.py runs the slow tests first)
def test_marginal_std_is_the_row_norm_of_c_inverse_and_optimized_factorizations_are_stable():
    c = list(factorization("banded", 5, 40, 2))
    stream = NoiseStream(c, NoiseSource(0))
    rows = np.linalg.norm(np.linalg.inv(dense(c, 12)), axis=1)
    for t in range(12):
        stream.draw((1,))
        assert stream.marginal_std() == pytest.approx(rows[t], rel=1e-12)
    for args in ((8, 100, 1, 0.0), (16, 100, 1, 0.9), (16, 300, 6, 0.0)):
        assert is_stable(factorization("banded", *args))
    assert not is_stable([1.0, 2.0])      # c(x) = 1 + 2x: a zero at -1/2, C^{-1} grows like 2^t
    with pytest.raises(PrivacyError, match="one sigma"):
        stream.scaled((1,), 1.0), stream.scaled((1,), 2.0)


@pytest.mark.parametrize("algo, extra", [("dp_ppo", ["+experiment=cartpole_dp_ppo", "algo.epochs=2"]),
                                         ("dp_pg", ["+experiment=cartpole_dp_pg", "group_size=2"])])
def test_a_training_run_with_correlated_noise_reports_exactly_its_target_from_the_accountant(algo, extra):
    import dppo

    summary = dppo.train([*extra, "rounds=5", "users_per_round=4", "eps=2.0", "privacy.secure_rng=false",
                          "privacy.noise_correlation=banded", "privacy.bands=4",
                          "progress=false", "eval_every=null", "eval_episodes=2"])
    assert summary["epsilon_spent"] == pytest.approx(2.0, abs=1e-12)
    assert summary["delta_spent"] == pytest.approx(1e-5)
    entries = summary["ledger"]
    assert [e["round"] for e in entries] == [0, 1, 2, 3, 4]
    assert all(e["mechanism"].startswith("correlated_") and e["bands"] == 4 for e in entries)


def test_the_dp_gd_oracle_of_dp_rebel_and_dp_npg_takes_correlated_noise_and_ssp_refuses_it():
    """DP-REBEL / DP-NPG with oracle=dp_gd release through the one release, so the correlated noise is theirs too:
    each round's entry is the oracle's (``dp_gd``) with the stream's bands, and the run spends exactly its target;
    DP-NPG's default ssp oracle releases sufficient statistics and is refused in one line."""
    import dppo

    for algo in ("algo=dp_rebel", "algo=dp_npg oracle=dp_gd"):
        summary = dppo.train([*algo.split(), "rounds=4", "users_per_round=4", "eps=2.0", "privacy.secure_rng=false",
                              "privacy.noise_correlation=banded", "privacy.bands=3", "progress=false",
                              "eval_every=null", "eval_episodes=1"])
        assert summary["epsilon_spent"] == pytest.approx(2.0, abs=1e-12)
        assert [(e["mechanism"], e["bands"], e["noise_correlation"]) for e in summary["ledger"]] == \
            [("dp_gd", 3, "banded")] * 4
    with pytest.raises(ConfigError, match="oracle=dp_gd"):
        dppo.train(["algo=dp_npg", "rounds=2", "privacy.noise_correlation=banded", "progress=false"])
