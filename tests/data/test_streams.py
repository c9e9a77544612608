"""The users' streams hashed in one vectorized pass are the per-user streams, word for word."""
import numpy as np
import pytest

from dppo.data import streams


def test_the_vectorized_hash_is_numpys_seed_sequence_mixing_word_for_word():
    rng = np.random.default_rng(0)
    for _ in range(50):
        before = tuple(int(w) for w in rng.integers(0, 2 ** 32, int(rng.integers(0, 3))))
        after = tuple(int(w) for w in rng.integers(0, 2 ** 32, int(rng.integers(0, 3))))
        xs = [0, 1, 2 ** 32 - 1] + [int(x) for x in rng.integers(0, 2 ** 32, 20)]
        assert streams._hashes(before, xs, after) == [streams._hash(*before, x, *after) for x in xs]


@pytest.mark.parametrize("run_seed", [0, 7, 2 ** 32 - 1, 2 ** 40])   # 2^40: two words, the per-user fallback
def test_user_seeds_and_generators_equal_the_per_user_ones(run_seed):
    users = [0, 1, 5, 123456, 2 ** 32 - 1, 2 ** 33]
    assert streams.user_seeds(run_seed, users) == [streams.user_seed(run_seed, u) for u in users]
    got = [g.initial_seed() for g in streams.user_generators(run_seed, users, 17)]
    assert got == [streams.user_generator(run_seed, u, 17).initial_seed() for u in users]
    with pytest.raises(ValueError):
        streams.user_seeds(run_seed, [3, -1])
