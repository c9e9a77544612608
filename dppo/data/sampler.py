"""User-level batch samplers: one-pass (each user at most once) and multi-pass (Poisson, opt-in)."""
from __future__ import annotations

import numpy as np

from dppo.errors import ConfigError, PrivacyError


class OnePassUserSampler:
    """Hands out ``users_per_round`` fresh user ids per round and refuses to hand out a user twice.

    Users are ids ``0..population_size-1`` visited in a seeded random order (a finite dataset of
    contexts/prompts), or an unbounded stream ``0, 1, 2, ...`` (gym episodes) when the population
    is ``None``. Parallel composition of per-round guarantees is valid only because of this check.
    """

    multi_pass = False

    def __init__(self, users_per_round: int, population_size: int | None = None, seed: int = 0):
        if users_per_round < 1:
            raise ConfigError(f"users_per_round must be >= 1, got {users_per_round}")
        self.users_per_round = int(users_per_round)
        self.population_size = population_size
        self.seed = int(seed)
        self.used: set[int] = set()
        self.next_index = 0
        self._order = None if population_size is None else np.random.default_rng(seed).permutation(population_size)

    def check_capacity(self, rounds: int) -> None:
        """Raise before training if the population cannot give ``rounds`` rounds of fresh users."""
        need = rounds * self.users_per_round
        if self.population_size is not None and need > self.population_size:
            raise ConfigError(f"one-pass training needs {need} users ({rounds} rounds x {self.users_per_round}) "
                              f"but the population has {self.population_size}; lower rounds/users_per_round "
                              f"or set privacy.multi_pass=true")

    def next_round(self) -> list[int]:
        """Fresh user ids for the next round."""
        return self.take(self.users_per_round)

    def take(self, m: int) -> list[int]:
        """``m`` fresh user ids (e.g. one per episode for tabular learners)."""
        if self.population_size is not None and self.next_index + m > self.population_size:
            raise PrivacyError(f"the user population ({self.population_size}) is exhausted after "
                               f"{len(self.used)} users; one-pass training cannot continue")
        idx = range(self.next_index, self.next_index + m)
        ids = [int(self._order[i]) for i in idx] if self._order is not None else list(idx)
        self.next_index += m
        self.claim(ids)
        return ids

    def claim(self, ids) -> None:
        """Mark users as used; a user seen before is a privacy error in one-pass mode."""
        ids = [int(i) for i in ids]
        reused = [i for i in ids if i in self.used] + _dupes(ids)
        if reused:
            raise PrivacyError(f"user {reused[0]} was already used: one-pass training must not reuse a user "
                               f"(set privacy.multi_pass=true with an RDP/PRV accountant to allow it)")
        self.used.update(ids)

    def state_dict(self) -> dict:
        return {"used": sorted(self.used), "next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        self.used = set(int(i) for i in state["used"])
        self.next_index = int(state["next_index"])


class PoissonUserSampler:
    """Multi-pass sampling: each round includes each of ``population_size`` users independently with
    rate q = users_per_round / population_size (Opacus' Poisson sampling; accounted by RDP/PRV)."""

    multi_pass = True

    def __init__(self, users_per_round: int, population_size: int, seed: int = 0):
        if users_per_round < 1:
            raise ConfigError(f"users_per_round must be >= 1, got {users_per_round}")
        if not population_size or population_size < users_per_round:
            raise ConfigError("privacy.multi_pass=true needs privacy.population_size >= users_per_round")
        self.users_per_round = int(users_per_round)
        self.population_size = int(population_size)
        self.sample_rate = users_per_round / population_size
        self.rng = np.random.default_rng(seed)
        self.rounds_sampled = 0
        self.used: set[int] = set()

    def check_capacity(self, rounds: int) -> None:
        return None

    def next_round(self) -> list[int]:
        mask = self.rng.random(self.population_size) < self.sample_rate
        self.rounds_sampled += 1
        ids = [int(i) for i in np.flatnonzero(mask)]
        self.used.update(ids)
        return ids

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "rounds_sampled": self.rounds_sampled, "used": sorted(self.used)}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.rounds_sampled = int(state["rounds_sampled"])
        self.used = set(state["used"])


def _dupes(ids: list[int]) -> list[int]:
    seen, out = set(), []
    for i in ids:
        if i in seen:
            out.append(i)
        seen.add(i)
    return out
