import pytest

from dppo.data import OnePassUserSampler, PoissonUserSampler
from dppo.errors import ConfigError, PrivacyError


def test_one_pass_users_are_fresh_each_round():
    s = OnePassUserSampler(4, population_size=20, seed=1)
    seen = [u for _ in range(5) for u in s.next_round()]
    assert len(seen) == len(set(seen)) == 20


def test_reused_user_is_rejected():
    s = OnePassUserSampler(3)
    ids = s.next_round()
    with pytest.raises(PrivacyError, match="already used"):
        s.claim([ids[0]])


def test_duplicate_within_a_round_is_rejected():
    with pytest.raises(PrivacyError):
        OnePassUserSampler(3).claim([5, 6, 5])


def test_exhausted_population_raises():
    s = OnePassUserSampler(4, population_size=10)
    s.next_round(); s.next_round()
    with pytest.raises(PrivacyError, match="exhausted"):
        s.next_round()


def test_population_too_small_is_caught_before_training():
    with pytest.raises(ConfigError, match="needs 50 more users"):
        OnePassUserSampler(10, population_size=40).check_capacity(5)


def test_state_round_trip_keeps_used_users():
    s = OnePassUserSampler(2, population_size=10, seed=3)
    s.next_round()
    t = OnePassUserSampler(2, population_size=10, seed=3)
    t.load_state_dict(s.state_dict())
    assert t.next_round() == s.next_round()
    with pytest.raises(PrivacyError):
        t.claim(list(s.used)[:1])


def test_poisson_sampler_rate():
    s = PoissonUserSampler(10, population_size=1000, seed=0)
    sizes = [len(s.next_round()) for _ in range(200)]
    assert sum(sizes) / len(sizes) == pytest.approx(10, rel=0.1)


def test_excluded_users_are_never_taken_and_count_against_the_capacity():
    """Users another run consumed (policy.init_from) are skipped, not counted as used or burned, and the
    capacity check counts what is left: fresh ids only."""
    s = OnePassUserSampler(3)                      # a stream of ids, capped at 10 by an env's population
    s.exclude([1, 4])
    assert s.fresh_remaining(10) == 8 and s.fresh_remaining() is None
    assert s.next_round() == [0, 2, 3] and s.next_round() == [5, 6, 7]
    assert s.used == {0, 2, 3, 5, 6, 7} and s.burned == set()
    with pytest.raises(ConfigError, match="needs 3 more users .* has 10, 8 of them already used or excluded"):
        s.check_capacity(1, limit=10)
    with pytest.raises(PrivacyError):
        s.claim([4])
    finite = OnePassUserSampler(2, population_size=6, seed=1)
    finite.exclude([finite._order[0]])
    assert finite.fresh_remaining() == 5 and finite._order[0] not in finite.next_round()
