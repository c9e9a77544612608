"""Which users have reached a release: the gate every take and every round's release passes, so the one-pass
rule that parallel composition rests on is enforced where the guarantee is printed, not trusted to a caller.

One-pass runs (replace-one adjacency, ``ParallelAccountant``): the ledger's eps is the worst round's only if every
user's data enters the releases of one round. ``UserGate`` records the round of every user id that a take handed
out or a round's release opened for, and refuses

* a take (``GatedSampler``, the wrapper the builder puts around any sampler, built or passed in) of an id it has
  seen before, in any round: a sampler hands out each user once;
* a release round (``ComposedGaussianSums.open_round``) for an id it has seen in *another* round (the users a take
  handed out for round r may be released in round r);
* an id that a crashed attempt took (``burn``: the trainer's resume rule), for ever.

Multi-pass runs (Poisson sampling, add/remove adjacency) reuse users by design; there the gate checks that a take's
ids are distinct members of the population, and the builder checks that the sampler is dppo's own Poisson sampler
at the config's rate (the amplification the accountant counts on).

The record is part of the privacy context's state: saved with every checkpoint (a secret file: it names user ids),
never in a shareable file. A context made with ``check_users=False`` (an audit's: many trials of one round on the
same neighbouring pair) skips the one-pass rule; ``dppo.train`` refuses such a context.
"""
from __future__ import annotations

import numbers

from dppo.data.sampler import UserSampler
from dppo.errors import PrivacyError

BURNED = -1   # the round recorded for a user a crashed attempt took: never taken or released again


def user_ids(ids) -> list[int]:
    """``ids`` as a list of Python ints, refusing anything that is not an integer id (one line)."""
    if ids is None or isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise PrivacyError(f"users must be a list of integer user ids, got {ids!r}")
    dtype = getattr(ids, "dtype", None)   # an integer tensor / array of ids: one conversion (bool is no id)
    if dtype is not None and getattr(ids, "ndim", 0) == 1 and str(dtype).split(".")[-1].startswith(("int", "uint")):
        return [int(u) for u in ids.tolist()]
    if isinstance(ids, (list, tuple)) and all(type(u) is int for u in ids):   # plain ints (not bool): as they are
        return list(ids)
    out = []
    for u in ids:
        if hasattr(u, "dtype") and hasattr(u, "item") and getattr(u, "ndim", 0) == 0:   # a 0-d tensor / array
            u = u.item()
        if isinstance(u, bool) or not isinstance(u, numbers.Integral):
            raise PrivacyError(f"user ids must be integers, got {u!r} ({type(u).__name__}); pass the users' ids")
        out.append(int(u))
    return out


class UserGate:
    """The round of every user id that reached a take or a release (module docstring)."""

    def __init__(self, multi_pass: bool = False, population_size: int | None = None, check: bool = True):
        self.multi_pass = bool(multi_pass)
        self.population_size = population_size
        self.check = bool(check)
        self.round_of: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.round_of)

    def _distinct(self, ids: list[int], what: str) -> None:
        if len(set(ids)) != len(ids):
            seen, dup = set(), None
            for u in ids:
                if u in seen:
                    dup = u
                    break
                seen.add(u)
            raise PrivacyError(f"{what}: user {dup} appears twice; each user contributes one row (sum or clip a "
                               f"user's own rows into one first)")
        pop = self.population_size
        if pop is not None and any(not 0 <= u < pop for u in ids):
            bad = next(u for u in ids if not 0 <= u < pop)
            raise PrivacyError(f"{what}: user {bad} is outside the population 0..{pop - 1}")

    def admit_take(self, ids, round_idx: int) -> list[int]:
        """A sampler handed out ``ids`` for round ``round_idx``: refuse any id seen before (one-pass)."""
        ids = user_ids(ids)
        self._distinct(ids, "a sampler's take")
        if self.check and not self.multi_pass:
            seen = [u for u in ids if u in self.round_of]
            if seen:
                raise PrivacyError(self._reuse(seen[0], "the sampler handed out user"))
            for u in ids:
                self.round_of[u] = int(round_idx)
        return ids

    def admit_release(self, ids, round_idx: int) -> list[int]:
        """A release round ``round_idx`` opens for ``ids``: refuse an id seen in another round (one-pass)."""
        ids = user_ids(ids)
        self._distinct(ids, f"round {round_idx}'s release")
        if self.check and not self.multi_pass:
            r = int(round_idx)
            other = [u for u in ids if self.round_of.get(u, r) != r]
            if other:
                raise PrivacyError(self._reuse(other[0], f"round {r}'s release names user"))
            for u in ids:
                self.round_of[u] = r
        return ids

    def _reuse(self, u: int, what: str) -> str:
        before = self.round_of[u]
        where = "a crashed attempt took it" if before == BURNED else f"it was in round {before}"
        return (f"{what} {u} again ({where}): one-pass training releases each user in one round only; take fresh "
                f"users (or set privacy.multi_pass=true with an RDP/PRV accountant to reuse them)")

    def burn(self, ids) -> None:
        """Users a crashed attempt took: never taken or released again (one-pass)."""
        if not self.multi_pass:
            for u in user_ids(ids):
                self.round_of[u] = BURNED

    def state_dict(self) -> dict:
        return {"round_of": sorted(self.round_of.items())}

    def load_state_dict(self, state: dict | None) -> None:
        self.round_of = {int(u): int(r) for u, r in (state or {}).get("round_of", ())}


class GatedSampler(UserSampler):
    """Any ``UserSampler`` with every take checked by the run's ``UserGate`` and journalled here (module
    docstring): a subclass that hands out a user twice is refused at the take, before the user is touched.
    Everything else (``used``, ``state_dict``, ``exclude``, ...) is the wrapped sampler's."""

    _own = ("inner", "gate", "journal", "round")

    def __init__(self, inner: UserSampler, gate: UserGate):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "gate", gate)
        object.__setattr__(self, "journal", None)   # the trainer's: takes are journalled after the gate admits them
        object.__setattr__(self, "round", 0)        # the trainer's current round

    def _checked(self, ids, m: int | None) -> list[int]:
        ids = list(ids)
        if m is not None and len(ids) != m:
            raise PrivacyError(f"the sampler handed out {len(ids)} users where {m} were asked for")
        ids = self.gate.admit_take(ids, self.round)
        if self.journal is not None:
            self.journal.take(ids)        # fsynced before anyone touches these users
        return ids

    def next_round(self) -> list[int]:
        return self._checked(self.inner.next_round(), None if self.inner.multi_pass else self.inner.users_per_round)

    def take(self, m: int) -> list[int]:
        return self._checked(self.inner.take(m), int(m))

    def burn(self, ids) -> None:
        self.gate.burn(ids)
        self.inner.burn(ids)

    def check_capacity(self, rounds: int, limit: int | None = None, what: str = "the population") -> None:
        self.inner.check_capacity(rounds, limit, what)

    def check_need(self, need: int, limit: int | None = None, what: str = "the population", detail: str = "") -> None:
        self.inner.check_need(need, limit, what, detail)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def __getattr__(self, name):   # users_per_round, used, burned, multi_pass, exclude, ... are the sampler's
        if name in GatedSampler._own:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name in GatedSampler._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)


# the declared attributes of UserSampler are the wrapped sampler's, not class defaults of the wrapper
for _name in ("multi_pass", "sample_rate"):
    setattr(GatedSampler, _name, property(lambda self, _n=_name: getattr(self.inner, _n)))
