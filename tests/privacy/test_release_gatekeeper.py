"""The release is the gatekeeper (issue 47): whatever a caller hands in, the printed eps is never below the true one.

Each way the Python API used to print a false eps is refused in one line here (the same ids in two rounds, with
independent or banded noise; several rows for one user; a sampler that hands a user out twice; a multi-pass config
run with a one-pass context; a context whose guarantee differs from the config's; an unclipped total; norms of the
wrong length; a clip other than the accounted one), and a property-based test drives the release with random call
sequences (repeated ids, row counts, clip changes, crashes between calls) and recomputes every user's true eps
independently: from the noise std each sum actually drew and each user's actual participation, in Gaussian DP
(Dong, Roth & Su 2019), converted with the Gaussian trade-off formula written here (scipy's normal cdf)."""
from __future__ import annotations

import ast
import glob
import math
import os
from collections import defaultdict

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

import dppo
from dppo.data import OnePassUserSampler
from dppo.errors import ConfigError, PrivacyError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.composed import composed_sums
from dppo.privacy.correlated import CorrelatedNoise

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["algo=dp_pg", "rounds=3", "users_per_round=4", "group_size=2", "env.horizon=20", "eval_episodes=1",
        "progress=false", "eval_every=null", "privacy.secure_rng=false"]


def _ctx(eps=5.0, **kw):
    return PrivacyContext(eps, 1e-5, noise=NoiseSource(0), **kw)


# ---- the table, row by row: each is now refused in one line ----------------------------------------------
@pytest.mark.parametrize("rounds", [2, 20])
@pytest.mark.parametrize("noise", ["independent", "banded"])
def test_the_same_user_ids_in_a_later_round_are_refused(rounds, noise):
    privacy = _ctx(noise_correlation=CorrelatedNoise("banded", 4, rounds=rounds) if noise == "banded" else None)
    release = composed_sums(privacy, parts={"actor": (1, 1.0)})
    ids = list(range(10))
    release.open_round(0, ids, (1.0,))
    release.release_sum(torch.ones(10, 3), ids, part="actor")
    with pytest.raises(PrivacyError, match="user 0 again .it was in round 0.: one-pass"):
        release.open_round(1, ids, (1.0,))
    assert len(privacy.ledger.entries) == 1 and privacy.spent()[0] == pytest.approx(5.0)


def test_rows_that_are_not_exactly_one_per_user_are_refused():
    release = composed_sums(_ctx(), parts={"actor": (1, 1.0)})
    ids = list(range(10))
    release.open_round(0, ids, (1.0,))
    with pytest.raises(PrivacyError, match="rows of shape .20, 3. for 10 users"):
        release.release_sum(torch.ones(20, 3), ids, part="actor")          # per-example rows
    with pytest.raises(PrivacyError, match="more than 10 rows"):
        release.release_sum([torch.ones(6, 3), torch.ones(6, 3)], ids, part="actor")
    with pytest.raises(PrivacyError, match="distinct users"):
        release.release_sum(torch.ones(10, 3), [0] * 10, part="actor")


def test_a_clipped_total_that_was_never_clipped_or_has_norms_of_the_wrong_length_is_refused():
    release = composed_sums(_ctx(), parts={"actor": (2, 1.0)})
    ids = list(range(4))
    release.open_round(0, ids, (1.0,))
    rows = torch.full((4, 3), 5.0)                                           # each of norm 8.7 > C = 1
    with pytest.raises(PrivacyError, match="exceeds what 4 rows clipped to 1.0 can sum to"):
        release.release_clipped_sum(rows.sum(0), rows.norm(dim=1), ids, part="actor")
    with pytest.raises(PrivacyError, match="3 norms for 4 users"):
        release.release_clipped_sum(torch.zeros(3), torch.ones(3), ids, part="actor")
    scale = release.clip_scale(rows.norm(dim=1), 1.0)
    release.release_clipped_sum((rows * scale[:, None]).sum(0), rows.norm(dim=1), ids, part="actor")   # clipped: ok


def test_a_clip_other_than_the_accounted_one_is_refused():
    release = composed_sums(_ctx(), parts={"actor": (1, 1.0)})
    release.open_round(0, [0, 1], (1.0,))
    with pytest.raises(PrivacyError, match="opened with clip 1.0, got 2.0"):
        release.release_sum(torch.ones(2, 3), [0, 1], 2.0, part="actor")
    entry = release.privacy.ledger.entries[0]
    assert entry["clip"] == 1.0 and entry["sigma"] == release.sigma(1.0, "actor")


class _Repeating(OnePassUserSampler):
    """Hands out users 0..3 every round (and tells the journal so): the issue's subclass."""

    def next_round(self):
        return [0, 1, 2, 3]


@pytest.mark.parametrize("config", [[], ["+experiment=cartpole_dp_pg_eps5"]], ids=["dp_pg", "banded_noise"])
def test_a_sampler_that_hands_out_a_user_twice_is_refused_at_the_take(config):
    with pytest.raises(PrivacyError, match="the sampler handed out user 0 again .it was in round 0."):
        dppo.train([*config, *TINY], sampler=_Repeating(4))


def test_a_one_pass_context_for_a_multi_pass_config_is_refused_before_round_0():
    config = ["algo=dp_pg", "rounds=30", "users_per_round=4", "privacy.multi_pass=true",
              "privacy.population_size=8", "privacy.accountant=rdp", "progress=false", "eval_episodes=1"]
    with pytest.raises(ConfigError, match="privacy= runs privacy.multi_pass=False but the config says "
                                          "privacy.multi_pass=True"):
        dppo.train(config, privacy=PrivacyContext(5, 1e-5))


@pytest.mark.parametrize("eps", ["1.0", "null"])
def test_a_context_whose_guarantee_differs_from_the_config_is_refused_so_hydra_records_what_runs(eps):
    with pytest.raises(ConfigError, match="privacy= runs eps=5.0 but the config says eps="):
        dppo.train([*TINY, f"eps={eps}"], privacy=PrivacyContext(5.0, 1e-5, noise=NoiseSource(0)))


def test_a_passed_context_and_sampler_that_match_the_config_run_and_spend_the_target():
    privacy = PrivacyContext(5.0, 1e-5, noise=NoiseSource(0))
    summary = dppo.train([*TINY, "eps=5"], privacy=privacy, sampler=OnePassUserSampler(4))
    assert summary["epsilon_spent"] == pytest.approx(5.0) and len(privacy.ledger.entries) == 3


def test_a_context_that_already_released_or_skips_the_user_check_is_refused():
    used = PrivacyContext(5.0, 1e-5, noise=NoiseSource(0))
    used.users.admit_release([0], 0)
    with pytest.raises(ConfigError, match="already released or admitted users"):
        dppo.train([*TINY, "eps=5"], privacy=used)
    with pytest.raises(ConfigError, match="check_users=False"):
        dppo.train([*TINY, "eps=5"], privacy=PrivacyContext(5.0, 1e-5, noise=NoiseSource(0), check_users=False))


# ---- one release class, one calibration function ------------------------------------------------------------------
def _classes_defining(method: str) -> dict[str, str]:
    out = {}
    for path in glob.glob(os.path.join(ROOT, "dppo", "**", "*.py"), recursive=True):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.FunctionDef) and b.name == method
                                                      for b in node.body):
                out[node.name] = os.path.relpath(path, ROOT)
    return out


def test_one_release_class_and_one_calibration_function_remain():
    """Every class with a ``release_sum`` is the one release, or a wrapper that hands its sums to an inner one
    (multi-process sums, the audit's score reader) and draws no noise itself; the composed Gaussian sums are
    calibrated by one function, and the retired second calibration and release engines are gone."""
    classes = _classes_defining("release_sum")
    assert classes.pop("ComposedGaussianSums") == "dppo/privacy/composed.py"
    for name, path in classes.items():
        source = open(os.path.join(ROOT, path)).read()
        node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == name)
        body = ast.get_source_segment(source, node)
        assert "self.inner" in body and ".gaussian(" not in body, name
    sources = {p: open(p).read() for p in glob.glob(os.path.join(ROOT, "dppo", "**", "*.py"), recursive=True)}
    for retired in ("noisy_gd_sigma", "composed_noise_multiplier", "noisy_gradient_descent", "PoissonComposedSums",
                    "CorrelatedComposedSums", "ClippedSums"):
        assert not [p for p, s in sources.items() if retired in s], retired
    callers = [os.path.relpath(p, ROOT) for p, s in sources.items() if "gaussian_sums_calibration(" in s]
    assert sorted(callers) == ["dppo/oracles/dp_gd.py", "dppo/privacy/calibration.py", "dppo/privacy/composed.py"]


# ---- property: random call sequences never print an eps below the true one ---------------------------------------
def _eps_of_gdp(mu: float, delta: float) -> float:
    """The smallest eps with delta(eps) <= delta for a mu-GDP mechanism (written here from the trade-off formula)."""
    if mu == 0:
        return 0.0
    f = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta  # noqa: E731
    return 0.0 if f(0.0) <= 0 else brentq(f, 0.0, 200.0, xtol=1e-12)


class _Recording(NoiseSource):
    """Seeded noise that remembers the std of every Gaussian draw (what the sums actually got)."""

    def __init__(self):
        super().__init__(0)
        self.sigmas = []

    def gaussian(self, shape, sigma):
        self.sigmas.append(float(sigma))
        return super().gaussian(shape, sigma)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_call_sequences_never_print_an_eps_below_the_true_one(data):
    """Random sequences of opens (new or repeated ids, repeated or skipped round indices, clips), sums (the round's
    users or others, one row each or not, the accounted clip or another, rows or a total formed elsewhere, any
    part) and crashes (a new process resumes from the saved state); each user's true mu is recomputed from the
    sums it actually entered and the noise std each actually drew, and the printed eps covers it."""
    parts = {"a": (1, 0.8), "b": (1, 0.2)}     # unequal: two sums of ``a`` for one user is over the round's mu
    noise = _Recording()
    privacy = PrivacyContext(2.0, 1e-5, noise=noise)
    release, round_idx, opened = composed_sums(privacy, parts=parts), 0, []
    mu_sq = defaultdict(float)                            # user -> sum over its sums of (2 C / sigma)^2
    pool = st.integers(0, 11)
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["open", "sum", "sum", "sum", "crash"]))
        try:
            if op == "open":
                round_idx += data.draw(st.integers(0, 2))
                ids = data.draw(st.lists(st.sampled_from(opened) if opened and data.draw(st.booleans()) else pool,
                                         max_size=5))
                clip = data.draw(st.sampled_from([0.5, 1.0]))
                release.open_round(round_idx, ids, (clip, clip / 2))
                opened = list(dict.fromkeys(int(u) for u in ids))
            elif op == "sum":
                part = data.draw(st.sampled_from(["a", "a", "a", "b", "c"]))
                ours = opened and data.draw(st.sampled_from([True, True, True, False]))
                ids = data.draw(st.lists(st.sampled_from(opened), min_size=1, max_size=5, unique=True) if ours
                                else st.lists(pool, max_size=5))
                extra = data.draw(st.sampled_from([0, 0, 0, 0, 1, -1]))
                clip = data.draw(st.sampled_from([None, None, None, 0.5, 1.0, 2.0]))
                rows = torch.randn(max(len(ids) + extra, 0), 3, dtype=torch.float64) * 3
                before = len(noise.sigmas)
                if data.draw(st.booleans()):              # a total formed elsewhere with the release's factors
                    norms = rows.norm(dim=1)
                    total = (rows * release.clip_scale(norms, release._clips.get(part, 1.0))[:, None]).sum(0)
                    release.release_clipped_sum(total, norms, ids, clip, part=part)
                else:
                    release.release_sum(rows, ids, clip, part=part)
                sigma = noise.sigmas[before]              # the noise this sum actually drew
                for u in set(ids):                        # its rows were clipped to the part's accounted clip
                    mu_sq[u] += (2 * release._clips[part] / sigma) ** 2
            else:                                         # a crash: a new process resumes from the saved state
                state = privacy.state_dict()
                privacy = PrivacyContext(2.0, 1e-5, noise=noise)
                privacy.load_state_dict(state)
                release, opened = composed_sums(privacy, parts=parts), []
        except (PrivacyError, ConfigError):
            continue                                      # refused: nothing released
    printed_eps, printed_delta = privacy.spent()
    for u, m2 in mu_sq.items():
        true = _eps_of_gdp(math.sqrt(m2), printed_delta)
        assert printed_eps >= true - 1e-7, (u, printed_eps, true)


def test_a_sums_rows_are_clipped_to_the_accounted_clip_by_the_release_itself():
    """What the property test assumes of ``_clips``: a sum's rows end at norm <= the accounted clip, whatever is
    handed in (the twin shows the clipped sum itself)."""
    twin = composed_sums(PrivacyContext(None, 1e-5), parts={"a": (1, 1.0)})
    twin.open_round(0, [0, 1], (0.5,))
    total, _ = twin.release_sum(torch.tensor([[30.0, 40.0], [0.0, 0.3]]), [0, 1], part="a")
    assert float(total.norm()) <= 1.0 and total[0] == pytest.approx(0.3)


MISUSES = {
    "users None": lambda r: r.open_round(0, None, (1.0,)),
    "clips None": lambda r: r.open_round(0, [1], None),
    "clips text": lambda r: r.open_round(0, [1], "a"),
    "a float user id": lambda r: r.open_round(0, [1.5], (1.0,)),
    "rows None": lambda r: (r.open_round(0, [1], (1.0,)), r.release_sum(None, [1], part="actor")),
    "a 1-d row": lambda r: (r.open_round(0, [1], (1.0,)), r.release_sum(torch.ones(3), [1], part="actor")),
    "an unknown part": lambda r: (r.open_round(0, [1], (1.0,)), r.release_sum(torch.ones(1, 2), [1], part="x")),
    "norms None": lambda r: (r.open_round(0, [1], (1.0,)),
                             r.release_clipped_sum(torch.zeros(2), None, [1], part="actor")),
    "a sum before open_round": lambda r: r.release_sum(torch.ones(1, 2), [1], part="actor"),
    "the noise of an unknown part": lambda r: r.noise_std(1.0, "x"),
}


@pytest.mark.parametrize("noise", ["independent", "banded", "twin"])
@pytest.mark.parametrize("misuse", list(MISUSES))
def test_every_misuse_of_the_release_api_is_one_privacy_or_config_error_line(misuse, noise):
    corr = CorrelatedNoise("banded", 2, rounds=4) if noise == "banded" else None
    privacy = PrivacyContext(None if noise == "twin" else 2.0, 1e-5, noise=NoiseSource(0), noise_correlation=corr)
    release = composed_sums(privacy, parts={"actor": (1, 1.0)})
    with pytest.raises((PrivacyError, ConfigError)) as err:
        MISUSES[misuse](release)
    assert "\n" not in str(err.value)


def test_a_passed_learner_runs_only_with_its_own_context_and_sampler_checked_and_gated():
    from dppo.build import build

    cfg = dppo.make_config([*TINY, "eps=5"])
    first = build(cfg)
    with pytest.raises(ConfigError, match="pass those two as privacy= and sampler= too"):
        build(cfg, learner=first.learner)
    trainer = build(cfg, learner=first.learner, privacy=first.privacy, sampler=first.sampler)
    trainer.fit()
    assert trainer.privacy.spent()[0] == pytest.approx(5.0) and len(trainer.privacy.users) == 12
