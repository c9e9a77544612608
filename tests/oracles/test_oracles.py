"""Private least-squares oracles: exactness without privacy, error shrinking with eps, ledger entries,
sensitivity bounds checked on random neighbouring datasets."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from scipy.stats import norm

from dppo.errors import ConfigError, DataError
from dppo.privacy.calibration import ssp_calibration
from dppo.oracles import make_oracle
from dppo.privacy.context import PrivacyContext
from dppo.privacy.noise import NoiseSource


def regression_users(m=40, d=3, rows=(5, 30), seed=0, noise=0.05):
    """m users, each with its own rows; features of norm <= 1, targets within [-1, 1]."""
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=d)
    w_true *= 0.6 / np.linalg.norm(w_true)
    users = []
    for _ in range(m):
        n = rng.integers(*rows)
        X = rng.normal(size=(n, d))
        X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1.0)
        y = np.clip(X @ w_true + noise * rng.normal(size=n), -1, 1)
        users.append((torch.tensor(X), torch.tensor(y)))
    return users, w_true


def numpy_ridge(users, ridge, rows_bound=None):
    """Independent reference: weighted ridge via an augmented numpy lstsq."""
    rows, targets = [], []
    for X, y in users:
        X, y = X.numpy(), y.numpy()
        n = len(y) if rows_bound is None else max(len(y), rows_bound)
        rows.append(X / math.sqrt(n)), targets.append(y / math.sqrt(n))
    d = rows[0].shape[1]
    A = np.vstack(rows + [math.sqrt(ridge) * np.eye(d)])
    b = np.concatenate(targets + [np.zeros(d)])
    return np.linalg.lstsq(A, b, rcond=None)[0]


def ctx(eps, seed=0):
    return PrivacyContext(eps=eps, delta=1e-5, noise=NoiseSource(seed))


UNIT = dict(x_bound=1.0, y_bound=1.0)  # the test users' rows: ||x|| <= 1, |y| <= 1 (nothing clipped)
SSP_UNIT = dict(UNIT, b_clip=1.0)       # and the moments unclipped: one Gaussian mechanism at Delta = sqrt(4.5)
ORACLE_KW = {"ssp": dict(SSP_UNIT, ridge=1e-3), "dp_gd": dict(UNIT, steps=100, lr=0.5, clip=2.0, ridge=1e-3, radius=5.0),
             "exp_mech": dict(UNIT, ridge=1e-3, w_max=1.0, cover="grid", grid_points=31)}


@pytest.mark.parametrize("name", ["exact", "ssp", "dp_gd", "exp_mech"])
def test_non_private_solution_matches_numpy_ridge(name):
    users, _ = regression_users()
    oracle = make_oracle(name, **ORACLE_KW.get(name, dict(ridge=1e-3)))
    privacy = PrivacyContext(eps=None)
    w = oracle.solve(users, privacy=privacy, round=0)
    np.testing.assert_allclose(w.numpy(), numpy_ridge(users, 1e-3), atol=1e-8)
    assert len(privacy.ledger) == 0


def test_rows_bound_weights_rows_like_pooled_regression():
    users, _ = regression_users(m=10)
    oracle = make_oracle("exact", ridge=1e-2, rows_bound=40)
    np.testing.assert_allclose(oracle.solve(users).numpy(), numpy_ridge(users, 1e-2, rows_bound=40), atol=1e-8)


def test_exact_cg_agrees_with_direct_solve():
    users, _ = regression_users(d=6)
    direct = make_oracle("exact", ridge=1e-2).solve(users)
    cg = make_oracle("exact", ridge=1e-2, cg_iters=60).solve(users)
    np.testing.assert_allclose(cg.numpy(), direct.numpy(), atol=1e-7)


def test_bounds_are_enforced_by_clipping():
    X = torch.tensor([[30.0, 40.0], [0.3, 0.4]])
    y = torch.tensor([7.0, -0.5])
    data = make_oracle("exact", x_bound=2.0, y_bound=1.0).prepare([(X, y)])
    np.testing.assert_allclose(data.X.numpy(), [[0.6, 0.8], [0.15, 0.2]])
    np.testing.assert_allclose(data.y.numpy(), [1.0, -0.5])


def test_original_units_are_restored():
    users, _ = regression_users()
    scaled = [(3.0 * X, 5.0 * y) for X, y in users]
    w = make_oracle("exact", x_bound=3.0, y_bound=5.0, ridge=1e-3).solve(scaled)
    np.testing.assert_allclose(w.numpy(), numpy_ridge(users, 1e-3) * 5.0 / 3.0, atol=1e-8)


@pytest.mark.parametrize("name", ["ssp", "dp_gd", "exp_mech"])
def test_private_error_shrinks_as_eps_grows(name):
    users, _ = regression_users(m=200)
    ref = numpy_ridge(users, 1e-3)
    errors = []
    for eps in (0.3, 3.0, 100.0):
        errs = []
        for seed in range(8):
            oracle = make_oracle(name, **ORACLE_KW[name])
            w = oracle.solve(users, privacy=ctx(eps, seed), round=0)
            errs.append(np.linalg.norm(w.numpy() - ref))
        errors.append(np.mean(errs))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.1 * np.linalg.norm(ref), errors


def test_ssp_ledger_entry_and_sigma():
    users, _ = regression_users(m=20)
    privacy = ctx(2.0)
    make_oracle("ssp", **SSP_UNIT).solve(users, privacy=privacy, round=7)
    (entry,) = privacy.ledger.entries
    assert entry["mechanism"] == "ssp" and entry["round"] == 7 and entry["users"] == 20
    assert entry["eps"] == 2.0 and entry["delta"] == 1e-5
    assert entry["sigma"] == pytest.approx(entry["sigma_moment"])  # default split = one mechanism, Delta = sqrt(4.5)
    mu = math.sqrt(4.5) / entry["sigma"]  # Gaussian mechanism = mu-GDP; its delta(eps), Dong-Roth-Su Cor. 2.13
    delta = norm.cdf(-2.0 / mu + mu / 2) - math.exp(2.0) * norm.cdf(-2.0 / mu - mu / 2)
    assert delta == pytest.approx(1e-5, rel=1e-6)
    assert privacy.spent() == (2.0, 1e-5)


def test_ssp_noise_has_the_released_scale():
    """The noise actually added to b has the ledger's sigma (empirical std over many releases)."""
    users, _ = regression_users(m=20, d=2)
    oracle = make_oracle("ssp", **SSP_UNIT, ridge=1e-3, ridge_noise=0.0, psd_floor=1e9)  # huge floor: w = b~ / (floor + ridge)
    data = oracle.prepare(users)
    draws = [oracle.solve(users, privacy=ctx(1.0, s), round=0) * (1e9 + 1e-3) - data.moment() for s in range(400)]
    sigma = oracle.last_release["sigma_moment"]
    assert torch.stack(draws).std().item() == pytest.approx(sigma, rel=0.1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 40), st.integers(1, 40))
def test_ssp_sensitivity_bound_holds_for_replaced_users(seed, n1, n2):
    rng = np.random.default_rng(seed)
    d = 4
    oracle = make_oracle("ssp", x_bound=1.0, y_bound=1.0, b_clip=1.0)

    def release_vector(X, y):
        data = oracle.prepare([(torch.tensor(X), torch.tensor(y))])
        S, b = data.gram(), data.moment()
        iu = torch.triu_indices(d, d, 1)
        return torch.cat([torch.diagonal(S), math.sqrt(2) * S[iu[0], iu[1]]]), b

    scale = rng.choice([0.1, 1.0, 10.0])
    s1, b1 = release_vector(scale * rng.normal(size=(n1, d)), scale * rng.normal(size=n1))
    s2, b2 = release_vector(scale * rng.normal(size=(n2, d)), scale * rng.normal(size=n2))
    cal = ssp_calibration(1.0, 1e-5, gram_share=oracle.gram_share, b_clip=oracle.b_clip)
    d_s, d_b = cal.sensitivity_gram, cal.sensitivity_moment
    assert (s1 - s2).norm().item() <= d_s + 1e-9
    assert (b1 - b2).norm().item() <= d_b + 1e-9


def _whitened_change(oracle, user_a, user_b):
    """||dS||^2 / sigma_S^2 + ||db||^2 / sigma_b^2 between two single users, with the oracle's eps = 1 stds."""
    cal = ssp_calibration(1.0, 1e-5, gram_share=oracle.gram_share, b_clip=oracle.b_clip)
    s_gram, s_b = cal.sigma_gram, cal.sigma_moment
    (Sa, ba), (Sb, bb) = [(d.gram(), d.per_user_moments()[0]) for d in (oracle.prepare([u]) for u in (user_a, user_b))]
    ba, bb = [b * min(1.0, oracle.b_clip / max(float(b.norm()), 1e-300)) for b in (ba, bb)]
    return float(((Sa - Sb) ** 2).sum()) / s_gram ** 2 + float(((ba - bb) ** 2).sum()) / s_b ** 2


@pytest.mark.parametrize("gram_share", [0.1, 1.0 / 3.0, 0.6])
def test_ssp_joint_sensitivity_is_never_exceeded_and_is_attained(gram_share):
    """Random multi-row neighbours never move the whitened release by more than mu = 1/sigma_analytic(1, 1e-5),
    and a grid search over single-row unit users (u = x.x', y = -y') reaches it: the calibration is tight."""
    from dppo.privacy.calibration import analytic_gaussian_sigma

    oracle = make_oracle("ssp", gram_share=gram_share, x_bound=1.0, y_bound=1.0, b_clip=1.0)
    mu_sq = analytic_gaussian_sigma(1.0, 1e-5, 1.0) ** -2
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(400):
        users = []
        for _ in range(2):
            n = int(rng.integers(1, 4))
            X = rng.normal(size=(n, 3))
            X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1.0) if rng.random() < 0.5 else \
                np.linalg.norm(X, axis=1, keepdims=True)
            users.append((torch.tensor(X), torch.tensor(rng.choice([-1.0, 1.0], size=n) * rng.uniform(0.5, 1, n))))
        worst = max(worst, _whitened_change(oracle, *users))
    assert worst <= mu_sq * (1 + 1e-9)
    grid = []
    for u in np.linspace(0.0, 1.0, 201):
        x2 = torch.tensor([[u, math.sqrt(1 - u * u), 0.0]], dtype=torch.float64)
        grid.append(_whitened_change(oracle, (torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([1.0])), (x2, torch.tensor([-1.0]))))
    assert max(grid) <= mu_sq * (1 + 1e-9) and max(grid) >= mu_sq * (1 - 1e-3)


def test_ssp_default_noise_is_the_gaussian_mechanism_at_sensitivity_sqrt_4_5():
    from dppo.privacy.calibration import analytic_gaussian_sigma

    cal = ssp_calibration(3.0, 1e-5, gram_share=1.0 / 3.0, b_clip=1.0)
    s_gram, s_b = cal.sigma_gram, cal.sigma_moment
    assert s_gram == pytest.approx(s_b) and s_b == pytest.approx(analytic_gaussian_sigma(3.0, 1e-5, math.sqrt(4.5)))


def _gd_releases(privacy, data):
    """The dp_gd oracle's 3 released noisy sums of a round (w kept at 0), stacked on the second-to-last axis."""
    sums = []
    make_oracle("dp_gd", steps=3, clip=0.5).descend(data, privacy, 0, list(range(6)),
                                                    lambda w, s: sums.append(s) or w, torch.zeros(3, dtype=torch.float64))
    return torch.stack(sums, dim=-2)


def test_stacked_noise_gives_the_same_releases_as_one_release_per_noise():
    """The mechanisms broadcast over a leading noise dimension (how the audit runs many trials): each row of a
    stacked release equals the unstacked release fed that row's noise."""
    from dppo.privacy.mechanisms import exponential_mechanism, ssp_release

    users, _ = regression_users(m=6, d=3)
    data = make_oracle("ssp").prepare(users)
    gen = torch.Generator().manual_seed(0)
    releases = {
        "ssp": lambda p: ssp_release(p, data.gram(), data.per_user_moments(), round=0, eps=2.0, delta=1e-5,
                                     gram_share=0.3, b_clip=1.0)[:2],
        "ssp public Gram": lambda p: ssp_release(p, None, data.per_user_moments(), round=0, eps=2.0, delta=1e-5,
                                                 gram_share=0.3, b_clip=0.5, public_gram=True)[1],
        "noisy gd": lambda p: _gd_releases(p, data),
        "exponential": lambda p: exponential_mechanism(p, torch.linspace(-1, 1, 7, dtype=torch.float64), eps=2.0,
                                                       sensitivity=1.0, round=0, users=6)[0]}
    for name, release in releases.items():
        draws = []

        class Recorded(NoiseSource):
            def gaussian(self, shape, sigma):
                draws.append(torch.randn((5, *shape), generator=gen, dtype=torch.float64) * sigma)
                return draws[-1]

            def gumbel(self, shape):
                draws.append(-torch.log(-torch.log(torch.rand((5, *shape), generator=gen, dtype=torch.float64))))
                return draws[-1]

        stacked = release(PrivacyContext(2.0, 1e-5, noise=Recorded(0)))
        for row in range(5):
            class Replay(NoiseSource):
                it = iter([d[row] for d in draws])

                def gaussian(self, shape, sigma):
                    return next(self.it)

                def gumbel(self, shape):
                    return next(self.it)

            single = release(PrivacyContext(2.0, 1e-5, noise=Replay(0)))
            for a, b in zip(stacked if isinstance(stacked, tuple) else (stacked,),
                            single if isinstance(single, tuple) else (single,)):
                assert torch.allclose(a[row].double(), b.double(), atol=1e-10), name


def test_dp_gd_noise_meets_eps_delta_by_both_accountants():
    from opacus.accountants import RDPAccountant

    gdp = make_oracle("dp_gd", steps=25, clip=1.5)
    s, z = gdp.noise_std(3.0, 1e-5)
    mu = math.sqrt(25) * 2 * 1.5 / s  # k composed (2C/s)-GDP steps
    delta = norm.cdf(-3.0 / mu + mu / 2) - math.exp(3.0) * norm.cdf(-3.0 / mu - mu / 2)
    assert delta == pytest.approx(1e-5, rel=1e-5)
    rdp = make_oracle("dp_gd", steps=25, clip=1.5, accountant="rdp")
    s_rdp, z_rdp = rdp.noise_std(3.0, 1e-5)
    acc = RDPAccountant()
    for _ in range(25):
        acc.step(noise_multiplier=z_rdp, sample_rate=1.0)
    assert acc.get_epsilon(delta=1e-5) <= 3.0 + 1e-6
    assert s_rdp == pytest.approx(2 * 1.5 * z_rdp)
    assert s < s_rdp  # exact GDP composition needs less noise than RDP


def test_dp_gd_ledger_entry():
    users, _ = regression_users(m=10)
    privacy = ctx(5.0)
    make_oracle("dp_gd", steps=7, clip=0.5).solve(users, privacy=privacy, round=3)
    (entry,) = privacy.ledger.entries
    assert entry["mechanism"] == "dp_gd" and entry["steps"] == 7 and entry["round"] == 3
    assert entry["eps"] == 5.0 and entry["delta"] == 1e-5 and entry["sensitivity"] == 1.0


def test_exp_mech_ledger_entry_is_pure_dp():
    users, _ = regression_users(m=10, d=2)
    privacy = ctx(1.0)
    oracle = make_oracle("exp_mech", w_max=2.0, x_bound=1.0, y_bound=0.5, cover="grid", grid_points=5)
    oracle.solve(users, privacy=privacy, round=0)
    (entry,) = privacy.ledger.entries
    assert entry["mechanism"] == "exponential" and entry["oracle"] == "exp_mech" and entry["delta"] == 0.0
    assert entry["sensitivity"] == pytest.approx((2.0 * 1.0 / 0.5 + 1) ** 2)
    assert entry["beta"] == pytest.approx(1.0 / (2 * 25.0))


def test_exp_mech_samples_the_gibbs_distribution():
    """Gumbel-max frequencies match exp(beta * score) normalized (chi-square test)."""
    from scipy.stats import chisquare

    users, _ = regression_users(m=5, d=1)
    oracle = make_oracle("exp_mech", **UNIT, w_max=1.0, cover="grid", grid_points=5)
    data = oracle.prepare(users)
    W = oracle.candidate_set(1)
    beta = 8.0 / (2 * oracle.sensitivity())
    logits = beta * oracle.score(data, W)
    probs = torch.softmax(logits, 0).numpy()
    privacy = ctx(8.0)
    counts = np.zeros(len(W))
    for _ in range(4000):
        w = oracle.solve(users, privacy=privacy, round=0)
        counts[int(torch.argmin((W - w).abs().sum(1)))] += 1
    assert chisquare(counts, probs * counts.sum()).pvalue > 1e-3


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_exp_mech_score_sensitivity_bound(seed):
    rng = np.random.default_rng(seed)
    oracle = make_oracle("exp_mech", w_max=1.5, x_bound=2.0, y_bound=1.0, candidates=256)
    users, _ = regression_users(m=6, d=3, seed=seed)
    other = (torch.tensor(10 * rng.normal(size=(4, 3))), torch.tensor(10 * rng.normal(size=4)))
    W = oracle.candidate_set(3)
    s1 = oracle.score(oracle.prepare(users), W)
    s2 = oracle.score(oracle.prepare(users[:-1] + [other]), W)
    assert (s1 - s2).abs().max().item() <= oracle.sensitivity() + 1e-9


def test_exact_oracle_refuses_private_context():
    users, _ = regression_users(m=3)
    with pytest.raises(ConfigError):
        make_oracle("exact").solve(users, privacy=ctx(1.0), round=0)


def test_unknown_oracle_and_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError):
        make_oracle("nope")
    with pytest.raises(ConfigError):
        make_oracle("ssp", bogus=1)
    with pytest.raises(ConfigError):
        make_oracle("dp_gd", accountant="zcdp")


def test_non_finite_data_is_rejected_before_any_release():
    privacy = ctx(1.0)
    with pytest.raises(DataError):
        make_oracle("ssp").solve([(torch.ones(2, 2), torch.tensor([1.0, float("nan")]))], privacy=privacy, round=0)
    assert len(privacy.ledger) == 0


def test_batched_loss_equals_direct_sum_of_user_losses():
    users, _ = regression_users(m=7, d=3)
    data = make_oracle("exact").prepare(users)
    W = torch.randn(5, 3, dtype=torch.float64)
    direct = [sum(((X @ w - y) ** 2).mean() for X, y in users) for w in W]
    np.testing.assert_allclose(data.loss(W).numpy(), torch.stack(direct).numpy(), rtol=1e-10)


def test_each_oracle_declares_the_defaults_of_its_family():
    """One home per setting: the class. ssp and exp_mech carry DP-NPG's bounds and ridge, dp_gd DP-REBEL's, exact
    the twins' (no clipping)."""
    ssp, gd, em, ex = (make_oracle(n) for n in ("ssp", "dp_gd", "exp_mech", "exact"))
    assert (ssp.x_bound, ssp.y_bound, ssp.ridge, ssp.b_clip) == (0.5, 3.0, 0.4, 0.003)
    assert (em.x_bound, em.y_bound, em.ridge, em.w_max) == (0.5, 3.0, 0.4, 2.0)
    assert (gd.x_bound, gd.y_bound, gd.ridge, gd.steps, gd.clip, gd.radius) == (1.0, 1.0, 0.0, 1, 0.1, None)
    assert ex.clip_rows == (False, False) and ex.ridge == 0.01


def test_ssp_split_budget_composes_to_eps_delta():
    cal = ssp_calibration(4.0, 1e-5, gram_share=0.2, b_clip=0.1)
    s_gram, s_b = cal.sigma_gram, cal.sigma_moment
    mu = math.hypot(math.sqrt(2) / s_gram, 2 * 0.1 / s_b)  # two Gaussian mechanisms compose in GDP
    delta = norm.cdf(-4.0 / mu + mu / 2) - math.exp(4.0) * norm.cdf(-4.0 / mu - mu / 2)
    assert delta == pytest.approx(1e-5, rel=1e-6)
    assert (math.sqrt(2) / s_gram) ** 2 == pytest.approx(0.2 * mu ** 2)


def test_ssp_gram_average_is_the_bias_corrected_mean_of_released_grams():
    users, _ = regression_users(m=30, d=2)
    oracle = make_oracle("ssp", **SSP_UNIT, gram_momentum=0.5)
    grams = []
    for r in range(3):
        privacy = ctx(1.0, seed=r)
        oracle.solve(users, privacy=privacy, round=r)
        grams.append(oracle.gram_sum.clone() if r == 0 else None)
    S0 = oracle.prepare(users).gram()
    S_bar = oracle.gram_sum / oracle.gram_weight
    assert oracle.gram_weight == pytest.approx(1 + 0.5 + 0.25)
    # the average of three noisy releases is closer to S than one release is, on average over entries
    assert (S_bar - S0).abs().mean() < (grams[0] - S0).abs().mean() * 1.5
    state = oracle.state_dict()
    other = make_oracle("ssp", **SSP_UNIT, gram_momentum=0.5)
    other.load_state_dict(state)
    torch.testing.assert_close(other.gram_sum, oracle.gram_sum)


def test_ssp_with_public_gram_spends_everything_on_the_moment():
    users, _ = regression_users(m=50, d=3)
    gram = torch.eye(3, dtype=torch.float64) * 0.3
    privacy = ctx(2.0)
    oracle = make_oracle("ssp", **UNIT, b_clip=0.5, ridge=0.0)
    oracle.solve(users, privacy=privacy, round=0, public_gram=gram)
    (entry,) = privacy.ledger.entries
    assert entry["gram"] == "public" and entry["eps"] == 2.0
    mu = 2 * 0.5 / entry["sigma_moment"]
    delta = norm.cdf(-2.0 / mu + mu / 2) - math.exp(2.0) * norm.cdf(-2.0 / mu - mu / 2)
    assert delta == pytest.approx(1e-5, rel=1e-6)
    # at huge eps the answer is (m * gram)^-1 sum_i clip(b_i): check against numpy
    w = make_oracle("ssp", **UNIT, b_clip=0.5, ridge=0.0).solve(users, privacy=ctx(1e6), round=0, public_gram=gram)
    b = sum(np.asarray(X.T @ y / len(y)) * min(1.0, 0.5 / np.linalg.norm(X.T @ y / len(y))) for X, y in users)
    np.testing.assert_allclose(w.numpy(), np.linalg.solve(50 * 0.3 * np.eye(3), b), atol=1e-4)
