"""User-level batch samplers: one-pass (each user at most once) and multi-pass (Poisson, opt-in)."""
from __future__ import annotations

import numpy as np

from dppo.errors import ConfigError, PrivacyError


class UserSampler:
    """What the trainer, the builder and the learners ask of a user sampler, declared here so that none of
    them reads it by guessing from attribute names. ``OnePassUserSampler`` and ``PoissonUserSampler`` are
    the two of ``privacy.multi_pass``; a sampler passed to ``dppo.train(sampler=...)`` subclasses this base
    (the builder refuses another in one line) and calls its ``__init__``.

    Attributes:
        multi_pass: a user may be drawn in several rounds (Poisson sampling, accounted by RDP/PRV); False:
            each user at most once (one-pass: parallel composition of the per-round guarantees).
        users_per_round: the users a round draws (multi-pass: the expected number).
        population_size: how many user ids there are (None: an unbounded stream ``0, 1, 2, ...``).
        sample_rate: multi-pass, each user's probability to be in a round (None: one-pass).
        used: every user id handed out so far; checkpointed, and the summary's ``users_seen``.
        burned: the users a crashed attempt took (a subset of ``used``; ``burn``), the summary's
            ``users_burned``.
        journal: set by the trainer (``dppo.training.journal.UserJournal``); draws are journalled before
            they are returned.
    """

    multi_pass: bool = False
    sample_rate: float | None = None

    def __init__(self, users_per_round: int, population_size: int | None = None):
        if users_per_round < 1:
            raise ConfigError(f"users_per_round must be >= 1, got {users_per_round}")
        self.users_per_round = int(users_per_round)
        self.population_size = population_size
        self.used: set[int] = set()
        self.burned: set[int] = set()
        self.journal = None

    def next_round(self) -> list[int]:
        """The user ids of the next round (journalled, then added to ``used``)."""
        raise NotImplementedError

    def take(self, m: int) -> list[int]:
        """``m`` fresh user ids (a tabular learner's one user per episode); one-pass samplers only."""
        raise NotImplementedError

    def check_capacity(self, rounds: int, limit: int | None = None, what: str = "the population") -> None:
        """Raise (one line) before training if the population cannot give ``rounds`` more rounds; ``limit``:
        ids at or above it do not exist (an env's finite population). The base cannot tell and checks
        nothing: such a sampler checks itself as it draws."""

    def check_need(self, need: int, limit: int | None = None, what: str = "the population", detail: str = "") -> None:
        """Raise (one line) if fewer than ``need`` fresh users are left (the trainer asks it with the users its
        learner still plans to draw). The base cannot tell and checks nothing, like ``check_capacity``."""

    def burn(self, ids) -> None:
        """A crashed attempt of a private run took these users (the resume rule, ``Trainer.recover_journal``)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything a resume needs to draw on as if never stopped (``used`` and ``burned`` included)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError


class OnePassUserSampler(UserSampler):
    """Hands out ``users_per_round`` fresh user ids per round and refuses to hand out a user twice.

    Users are ids ``0..population_size-1`` visited in a seeded random order (a finite dataset of
    contexts/prompts), or an unbounded stream ``0, 1, 2, ...`` (gym episodes) when the population
    is ``None``. Parallel composition of per-round guarantees is valid only because of this check.
    """

    def __init__(self, users_per_round: int, population_size: int | None = None, seed: int = 0):
        super().__init__(users_per_round, population_size)   # burned users are skipped for ever
        self.seed = int(seed)
        self.excluded: set[int] = set()  # users another run's training consumed (policy.init_from): never taken
        self.next_index = 0
        self._order = None if population_size is None else np.random.default_rng(seed).permutation(population_size)

    def check_capacity(self, rounds: int, limit: int | None = None, what: str = "the population") -> None:
        """Raise before training if the population cannot give ``rounds`` more rounds of fresh users.

        ``limit``: ids at or above it are outside the population (an env's finite population of size
        ``limit`` that this stream of ids indexes); the sampler's own ``population_size`` applies too.
        """
        self.check_need(int(rounds) * self.users_per_round, limit, what,
                        f" ({rounds} rounds x {self.users_per_round})")

    def check_need(self, need: int, limit: int | None = None, what: str = "the population", detail: str = "") -> None:
        """Raise (one line) if fewer than ``need`` fresh users are left (see ``check_capacity``)."""
        left = self.fresh_remaining(limit)
        if left is not None and need > left:
            size = min(x for x in (limit, self.population_size) if x is not None)
            gone = size - left
            taken = f", {gone} of them already used or excluded" if gone else ""
            raise ConfigError(f"one-pass training needs {need} more users{detail} but {what} has {size}{taken}; "
                              f"lower rounds/users_per_round (or episodes), or use a larger population")

    def fresh_remaining(self, limit: int | None = None) -> int | None:
        """How many ids this sampler can still hand out (None: an unbounded stream)."""
        pop = self.population_size
        if pop is None and limit is None:
            return None
        if pop is None:        # a stream of ids 0, 1, ... capped at ``limit``
            start = min(self.next_index, int(limit))
            taken = sum(1 for u in self.used | self.excluded if start <= u < limit)
            return int(limit) - start - taken
        order = self._order[self.next_index:]
        if limit is not None:
            order = order[order < int(limit)]
        bad = self.used | self.excluded
        if bad:
            order = order[~np.isin(order, np.fromiter(bad, dtype=np.int64, count=len(bad)))]
        return int(order.size)

    def next_round(self) -> list[int]:
        """Fresh user ids for the next round."""
        return self.take(self.users_per_round)

    def take(self, m: int) -> list[int]:
        """``m`` fresh user ids (e.g. one per episode for tabular learners)."""
        pop = self.population_size
        if pop is not None and self.next_index + m > pop:
            raise PrivacyError(f"the user population ({pop}) is exhausted after "
                               f"{len(self.used)} users; one-pass training cannot continue")
        ids, i, used, order = [], self.next_index, self.used, self._order
        while len(ids) < m:                 # in order, skipping burned users
            if pop is not None and i >= pop:
                raise PrivacyError(f"the user population ({pop}) is exhausted after "
                                   f"{len(self.used)} users; one-pass training cannot continue")
            u = int(order[i]) if order is not None else i
            i += 1
            if u not in used and u not in self.excluded:
                ids.append(u)
        self.claim(ids)
        self.next_index = i
        return ids

    def burn(self, ids) -> None:
        """Mark users of a crashed attempt as used for ever (they may have reached an output)."""
        ids = [int(i) for i in ids]
        self.used.update(ids)
        self.burned.update(ids)

    def exclude(self, ids) -> None:
        """Never hand out these users: another run's training consumed them (``policy.init_from``)."""
        self.excluded.update(int(i) for i in ids)

    def claim(self, ids) -> None:
        """Mark users as used; a user seen before is a privacy error in one-pass mode."""
        ids = [int(i) for i in ids]
        reused = [i for i in ids if i in self.used or i in self.excluded] + _dupes(ids)
        if reused:
            raise PrivacyError(f"user {reused[0]} was already used: one-pass training must not reuse a user "
                               f"(set privacy.multi_pass=true with an RDP/PRV accountant to allow it)")
        if self.journal is not None:
            self.journal.take(ids)      # fsynced before anyone touches these users
        self.used.update(ids)

    def state_dict(self) -> dict:
        return {"used": sorted(self.used), "next_index": self.next_index, "burned": sorted(self.burned),
                "excluded": sorted(self.excluded)}

    def load_state_dict(self, state: dict) -> None:
        self.used = set(int(i) for i in state["used"])
        self.next_index = int(state["next_index"])
        self.burned = set(int(i) for i in state.get("burned", ()))
        self.excluded |= set(int(i) for i in state.get("excluded", ()))


class PoissonUserSampler(UserSampler):
    """Multi-pass sampling: each round includes each of ``population_size`` users independently with
    rate q = users_per_round / population_size (Opacus' Poisson sampling; accounted by RDP/PRV)."""

    multi_pass = True

    def __init__(self, users_per_round: int, population_size: int, seed: int = 0, noise=None):
        super().__init__(users_per_round, population_size)
        if not population_size or population_size < users_per_round:
            raise ConfigError("privacy.multi_pass=true needs privacy.population_size >= users_per_round")
        self.population_size = int(population_size)
        self.sample_rate = users_per_round / population_size
        self.rng = np.random.default_rng(seed)
        # secure noise: the subsampling coins come from the OS CSPRNG too (amplification by sampling needs
        # them secret); seeded: from ``seed`` (reproducible)
        self.noise = noise if (noise is not None and getattr(noise, "secure", False)) else None
        self.rounds_sampled = 0     # burned stays empty: multi-pass reuses users, lost rounds are charged instead

    def check_capacity(self, rounds: int, limit: int | None = None, what: str = "the population") -> None:
        """Multi-pass reuses users; only the population must lie inside ``limit`` (an env's population)."""
        if limit is not None and self.population_size > limit:
            raise ConfigError(f"privacy.population_size={self.population_size} is larger than {what} ({limit}); "
                              f"lower privacy.population_size")

    def next_round(self) -> list[int]:
        if self.noise is not None:
            mask = self.noise.uniform((self.population_size,)).numpy() < self.sample_rate
        else:
            mask = self.rng.random(self.population_size) < self.sample_rate
        self.rounds_sampled += 1
        ids = [int(i) for i in np.flatnonzero(mask)]
        if self.journal is not None:
            self.journal.take(ids)
        self.used.update(ids)
        return ids

    def burn(self, ids) -> None:
        """Multi-pass users are reused by design; a crashed attempt's releases are charged instead."""

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
