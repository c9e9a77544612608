"""Where a policy's training data came from: the users it consumed, the run's seed and its population.

The record travels with the policy (every checkpoint, and ``policy.pt`` in its public form), so that
``policy.init_from`` never hands a user whose data shaped the weights to another release, whichever form
the weights come in (``dppo.build.load_init_source``). The shareable form names only what is public
anyway: the ids of a one-pass run over a stream or a seeded population follow from its seed and its
length, and a multi-pass run records its whole population (which members a Poisson round sampled stays
secret: amplification by subsampling needs it). A population of private rows is never described there.

Three kinds of id space (``population["kind"]``):

* ``ids``: a user stream (gym episodes, tabular and GFA episodes, any env without a finite population).
  User u of a run with seed s is the episode reset by ``dppo.data.streams.user_seed(s, u)``; a
  ``privacy.population_size`` only caps the ids at N. A record lists the stream ids consumed. A run
  that inherits such a record starts its stream after the largest one, whatever its env or seed: ids
  are the conservative unit (a real deployment's stream, users arriving in order, has no seed at all).
* ``members``: a finite population the env defines (``env.population``: the bandit's contexts, the
  private prompts of a file). The record lists *member* ids - a prompt's row in its file, a context's
  index - which do not depend on the run's seed or visiting order. A run on the same population (same
  env id and size) burns those members; a run on another population skips none of them, and says so.
  Only populations the env generates from public values (the bandit's seeded contexts) are of this kind.
* ``content``: private rows (the prompts of ``env=prompts``, from a file or from Python). A member is the
  keyed digest of its content (``env.member_content``, HMAC under the run's secret key,
  ``dppo/training/secret.py``); the entry holds that key and the digests, so a later run recognizes the
  same prompts in whatever file, object, name or order they arrive, by keying its own rows with it.
  Such an entry is *secret*: a checkpoint holds it whole, ``policy.pt`` only says it is withheld
  (``public_record``), and fine-tuning from a lone ``policy.pt`` then needs the source run's directory
  (``policy.init_provenance``) or the user's statement that the data are disjoint. A statement keeps the
  withheld entry in the new run's record, marked with the rows it covers (``state_disjoint``): a later run
  from any descendant, on other rows, cannot skip those members and is refused unless it states it too.
"""
from __future__ import annotations

import sys

from dppo.training.secret import data_fingerprint, keyed_digest, new_key

FORMAT = "dppo-provenance-1"


# ---- id sets as half-open ranges ---------------------------------------------------------------------------
def to_ranges(ids) -> list[list[int]]:
    """Sorted half-open ranges ``[[lo, hi), ...]`` covering the integer set ``ids``."""
    out: list[list[int]] = []
    for u in sorted({int(i) for i in ids}):
        if out and out[-1][1] == u:
            out[-1][1] = u + 1
        else:
            out.append([u, u + 1])
    return out


def from_ranges(ranges) -> list[int]:
    return [u for lo, hi in ranges for u in range(int(lo), int(hi))]


def union_ranges(a, b) -> list[list[int]]:
    merged: list[list[int]] = []
    for lo, hi in sorted([list(map(int, r)) for r in list(a) + list(b)]):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return merged


def count(ranges) -> int:
    return sum(int(hi) - int(lo) for lo, hi in ranges)


# ---- the population of a run -------------------------------------------------------------------------------
class Population:
    """The id space of a run's users and the map from the sampler's ids to it.

    Args:
        env: the run's env factory (``member_content`` for private rows; ``population`` and ``member_ids`` when
            it generates a finite population).
        sampler: the run's user sampler (``population_size``: a cap on stream ids, or multi-pass).
        key: the run's secret key (``dppo/training/secret.py``), which keys a content population's members.
    """

    def __init__(self, env, sampler=None, key: str | None = None):
        self.env, self.sampler = env, sampler
        env_id = str(getattr(env, "id", type(env).__name__))
        size = getattr(env, "population", None)
        if callable(getattr(env, "member_content", None)):
            self.identity = {"kind": "content", "env_id": env_id, "key": key}
        elif isinstance(size, int) and not isinstance(size, bool):
            self.identity = {"kind": "members", "env_id": env_id, "size": int(size)}
        else:
            cap = None if sampler is None else sampler.population_size
            self.identity = {"kind": "ids", "env_id": env_id, "size": None if cap is None else int(cap)}

    @property
    def finite_members(self) -> bool:
        return self.identity["kind"] == "members"

    @property
    def by_content(self) -> bool:
        return self.identity["kind"] == "content"

    def set_key(self, key: str) -> None:
        """Adopt the run's stored key (a resume): the run's own entries are keyed as before."""
        if self.by_content:
            self.identity["key"] = key

    def member_ids(self, users) -> list:
        """The population's ids of these sampler ids: keyed content digests (sorted) for private rows, else
        ints (the identity for streams and for the bandit)."""
        if self.by_content:
            size = int(getattr(self.env, "population", 0) or 0)
            users = [int(u) for u in users if 0 <= int(u) < size]
            key = self.identity["key"]
            return sorted({keyed_digest(key, c) for c in self.env.member_content(users)})
        fn = getattr(self.env, "member_ids", None) if self.finite_members else None
        return [int(m) for m in (fn(users) if fn is not None else users)]

    def users_of(self, members) -> list[int]:
        """The sampler ids whose members are in ``members`` (inverse of ``member_ids``)."""
        fn = getattr(self.env, "users_of_members", None) if self.finite_members else None
        return [int(u) for u in (fn(members) if fn is not None else members)]

    def users_of_content(self, e: dict) -> list[int]:
        """This run's user ids whose prompt is one of entry ``e``'s members (keyed with ``e``'s own key)."""
        size = int(getattr(self.env, "population", 0) or 0)
        key, wanted = e["population"]["key"], set(e.get("members") or ())
        contents = self.env.member_content(range(size))
        return [u for u, c in enumerate(contents) if keyed_digest(key, c) in wanted]

    def same_as(self, other: dict) -> bool:
        """Whether ``other`` (a record's population) names the same users as this run's ids do."""
        if other.get("kind") == "ids" and self.identity["kind"] == "ids":
            return True  # stream ids: the conservative unit, whatever the env
        if other.get("kind") == "content":
            return self.by_content   # contents are recognized in any file, object or order
        return (other.get("kind") == "members" and self.finite_members and other.get("env_id") == self.identity["env_id"]
                and other.get("size") == self.identity["size"])


# ---- the record --------------------------------------------------------------------------------------------
def entry(population: dict, users, *, everyone: bool = False, source: str = "training") -> dict:
    """One population's consumed users (``users``: ids, or a content population's digests), ``everyone`` for a
    multi-pass run's whole population."""
    if population.get("kind") == "content":
        return {"population": dict(population), "users": [], "members": sorted({str(m) for m in users}),
                "all": bool(everyone), "source": source}
    return {"population": dict(population), "users": to_ranges(users), "all": bool(everyone), "source": source}


def merge(entries: list[dict]) -> list[dict]:
    """One entry per population: ranges (or a content population's digests) united, ``all`` if any entry used
    everyone."""
    out: list[dict] = []
    for e in entries:
        for o in out:
            if (o["population"] == e["population"] and bool(o.get("withheld")) == bool(e.get("withheld"))
                    and statements(o) == statements(e)):
                o["users"] = union_ranges(o["users"], e["users"])
                if "members" in o or "members" in e:
                    o["members"] = sorted(set(o.get("members") or ()) | set(e.get("members") or ()))
                o["all"] = o["all"] or e["all"]
                if e["source"] not in o["source"].split("+"):
                    o["source"] = f"{o['source']}+{e['source']}"
                break
        else:
            o = {"population": dict(e["population"]), "users": union_ranges(e["users"], []),
                 "all": bool(e.get("all")), "source": e.get("source", "training")}
            if "members" in e:
                o["members"] = sorted(set(e.get("members") or ()))
            if e.get("withheld"):
                o["withheld"] = True
            if statements(e):
                o["stated_disjoint"] = statements(e)
            out.append(o)
    return out


def record(*, seed: int, algo: str, env_id: str, population: Population, sampler, inherited: list[dict]) -> dict:
    """The provenance of the current policy: this run's consumed users and everything it inherited."""
    own = []
    if sampler is not None:
        if sampler.multi_pass:
            n = int(sampler.population_size)
            own = [entry(population.identity, population.member_ids(range(n)), everyone=True)]
        elif sampler.used:
            own = [entry(population.identity, population.member_ids(sorted(sampler.used)))]
    return {"format": FORMAT, "seed": int(seed), "algo": str(algo), "env_id": str(env_id),
            "consumed": merge(list(inherited) + own)}


def public_record(rec: dict | None) -> dict | None:
    """The shareable form of a record (``policy.pt``): a content population's entries keep only that they
    exist (``withheld``), not their key, digests or count; ids of streams and seeded populations stay."""
    if rec is None:
        return None
    out = dict(rec)
    consumed = []
    for e in rec["consumed"]:
        if e["population"].get("kind") == "content":
            e = {"population": {"kind": "content", "env_id": e["population"].get("env_id")}, "users": [],
                 "all": bool(e.get("all")), "source": e.get("source", "training"), "withheld": True}
        consumed.append(e)
    out["consumed"] = merge(consumed)
    return out


def withheld(rec: dict | None) -> bool:
    """Whether a record names a content population without its members (a shareable ``policy.pt``'s)."""
    return rec is not None and any(e.get("withheld") for e in rec.get("consumed", ()))


def statements(e: dict) -> list[dict]:
    """The statements ``policy.init_data_disjoint=true`` that a withheld entry carries (``state_disjoint``)."""
    return [dict(s) for s in e.get("stated_disjoint") or ()]


def rows_fingerprint(key: str, population: Population) -> str:
    """The keyed fingerprint of the set of a run's private rows (their members' content, sorted: the same in any
    file, name or order) under ``key``: which rows a statement of disjointness is about. Kept, like the
    members' digests, in the secret record only."""
    size = int(getattr(population.env, "population", 0) or 0)
    return data_fingerprint(key, sorted(set(population.env.member_content(range(size)))))


def state_disjoint(consumed: list[dict], population: Population) -> list[dict]:
    """``policy.init_data_disjoint=true``: the user states that this run's rows share no person with the withheld
    rows that trained its initial weights. The withheld entries are kept - dropping them would let a later run
    from this one, back on those rows, reuse them unnoticed - each marked with the rows the statement is about
    (a keyed fingerprint under the run's key), so this run, and a later one on the very same rows, go on."""
    if not population.by_content:
        return list(consumed)   # users that are not rows: a withheld entry never names one (``exclude``)
    key = population.identity.get("key") or new_key()
    mark = {"key": key, "rows": rows_fingerprint(key, population)}
    return [{**e, "stated_disjoint": statements(e) + [mark]} if e.get("withheld") and not stated_disjoint(e, population)
            else e for e in consumed]


def stated_disjoint(e: dict, population: Population) -> bool:
    """Whether a withheld entry was stated disjoint from this run's private rows: a statement made on the same set
    of rows (by this run, or by a run it descends from). Rows of any other set may hold its members."""
    if not population.by_content:
        return False
    return any(s.get("key") and rows_fingerprint(s["key"], population) == s.get("rows") for s in statements(e))


def is_record(obj) -> bool:
    return isinstance(obj, dict) and obj.get("format") == FORMAT and isinstance(obj.get("consumed"), list)


def legacy_record(used) -> dict:
    """A checkpoint written before provenance existed: its sampler's ids, applied to any population."""
    return {"format": FORMAT, "seed": None, "algo": None, "env_id": None,
            "consumed": [{"population": {"kind": "ids", "env_id": None, "size": None}, "users": to_ranges(used),
                          "all": False, "source": "training"}]}


def offset_entry(population: Population, offset: int) -> dict:
    """``policy.init_users_offset=n``: the weights' training used this run's user ids 0..n-1."""
    return entry(population.identity, population.member_ids(range(int(offset))), source="init_users_offset")


def exclude(sampler, population: Population, consumed: list[dict], what: str) -> None:
    """Never hand a consumed user to this run: skip (stream ids) or burn (members) them in ``sampler``.

    Raises ConfigError when users must be excluded from a Poisson-sampled (multi-pass) population.
    """
    from dppo.errors import ConfigError

    ids: set[int] = set()
    skip_below = 0
    for e in consumed:
        pop = e["population"]
        if e.get("withheld") and population.by_content:
            if not stated_disjoint(e, population):
                raise ConfigError(f"{what} was trained on private rows whose members no record carries, and this "
                                  f"run's rows are not stated disjoint from them; name the run directory that "
                                  f"holds them (policy.init_provenance=<run_dir>), or state "
                                  f"policy.init_data_disjoint=true if this run's data share no person with them")
            continue   # stated disjoint from these very rows: none of them is a member
        if pop.get("kind") == "content":
            if population.by_content:
                ids.update(population.users_of_content(e))
            else:
                print(f"dppo: note: {what} was trained on private rows; this run's users "
                      f"({_describe(population.identity)}) are not rows, and none is skipped", file=sys.stderr)
            continue
        if pop.get("kind") == "members" and str(pop.get("env_id", "")).startswith("prompts:") and population.by_content:
            raise ConfigError(f"{what} names its prompts by file row (a record of an older dppo); rows cannot be "
                              f"matched by content: fine-tune from a newer run, or state "
                              f"policy.init_data_disjoint=true if this run's prompts share no person with its")
        if not e["users"] and not e.get("all"):
            continue
        if pop.get("env_id") is None and pop.get("kind") == "ids":   # a legacy record: the sampler's own ids
            skip_below = max(skip_below, max(hi for _, hi in e["users"]))
            ids.update(from_ranges(e["users"]))
            continue
        if not population.same_as(pop):
            print(f"dppo: note: {what} was trained on users of another population ({_describe(pop)}); no user "
                  f"of this run's population ({_describe(population.identity)}) is skipped", file=sys.stderr)
            continue
        if population.finite_members:
            ids.update(population.users_of(from_ranges(e["users"])))
        else:
            skip_below = max(skip_below, max(hi for _, hi in e["users"]))
    if not ids and not skip_below:
        return
    if sampler.multi_pass:
        raise ConfigError(f"{what} was trained on users of this population, and a Poisson-sampled (multi-pass) "
                          f"run cannot exclude them; fine-tune one-pass (privacy.multi_pass=false)")
    if sampler.population_size is None:
        sampler.next_index = max(sampler.next_index, skip_below)
        sampler.exclude(sorted(u for u in ids if u >= skip_below))
    else:
        sampler.exclude(sorted(u for u in ids | set(range(min(skip_below, sampler.population_size)))
                               if u < sampler.population_size))


def _describe(pop: dict) -> str:
    if pop.get("kind") == "members":
        return f"{pop.get('size')} members of {pop.get('env_id')}"
    if pop.get("kind") == "content":
        return f"the private rows of {pop.get('env_id')}"
    return f"user ids of {pop.get('env_id')}"
