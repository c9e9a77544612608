"""One Gaussian release of a round's capped transition counts and rewards (``algo=dp_model``; ``algo=model`` is the
same code without noise).

Index set (public): rows are the pairs (s, a) of a public table (the admissible pairs of the env's published mask
table, ``dppo.envs.masks.mask_table``, or every pair), columns the next states (plus, for an env that can end an
episode and publishes no terminal states, one sink column for "terminated"). It is a function of the env's
definition only, never of the data.

User u's contribution (its episode's transitions (s_t, a_t, s'_t, r_t), t = 0, 1, ...):

* C_u = the distinct entries e = (row(s_t, a_t), col(s'_t)) of its first K transitions (t < K, ``cap``) whose row
  is in the index set; |C_u| <= K (a transition on a row outside the set is dropped);
* x_u[e] = 1 for e in C_u (a transition repeated within the first K steps is counted once);
* y_u[e] = r01 of the first of its transitions with entry e, r01 = (clip(r, lo, hi) - lo) / (hi - lo) in [0, 1]
  (``lo, hi``: the declared reward range; the clip is enforced here, whatever the caller did).

Reward model ``next_state`` (rewards a function of the next state, e.g. ICU-Sepsis's survival): instead of
``y_u`` per entry, two vectors over the columns: ``z_u[c] = 1`` if one of the entries of C_u has column c, and
``v_u[c]`` = r01 of the first such transition (at most K columns each), released with noise ``N(0, (c sigma)^2 I)``
on every column; the reward of entering c is estimated by ``V~_c / Z~_c``.

Release: ``M~ = sum_u x_u + N(0, sigma^2 I)`` and ``Y~ = sum_u y_u + N(0, (c sigma)^2 I)`` on EVERY entry of the
index set, ``c = reward_noise`` (null: the reward part is not released).

Sensitivity (replace-one: u replaced by u'). Divide the reward part by c: the release is ``f(D) + N(0, sigma^2 I)``
with ``f(D) = sum_u (x_u, y_u / c)``, and ``f(D) - f(D') = (x_u - x_u', (y_u - y_u') / c)``. Per entry e:

* e in C_u and in C_u': ``0 + (y - y')^2 / c^2 <= 1 / c^2``;
* e in exactly one of them: ``1 + y^2 / c^2 <= 1 + 1 / c^2``;
* e in neither: 0.

With j shared entries, ``||f(D) - f(D')||^2 <= j / c^2 + (|C_u| + |C_u'| - 2j)(1 + 1/c^2) <= 2K (1 + 1/c^2)``
(j = 0, disjoint sets of K entries with rewards 1, attains it), so

    Delta_2 = sqrt(2K (1 + 1/c^2))        (transitions only, c = inf: sqrt(2K)),

and with the ``next_state`` reward part the same count per column (``(z, v) / c``: ``0 + (v - v')^2/c^2 <= 1/c^2``
where both users have column c, ``(1 + v^2)/c^2 <= 2/c^2`` where one has it, at most K columns each, and the count
part as before) gives ``||.||^2 <= 2K + 2K (2/c^2)``, ``Delta_2 = sqrt(2K (1 + 2/c^2))``,

and with the ``public`` reward model (the env publishes its reward as a function of the transition, e.g. ICU-Sepsis:
1 on entering the survival state; no reward part is released) ``Delta_2 = sqrt(2K)``,

and ``sigma = analytic_gaussian_sigma(eps, delta, Delta_2)`` makes each round's release (eps, delta)-DP; rounds
hold disjoint users (one-pass, checked by the privacy context's user gate before any noise is drawn), so the run
is (eps, delta)-DP by parallel composition (``tests/privacy/test_count_release.py`` checks Delta_2 by brute force).
"""
from __future__ import annotations

import math

import numpy as np

from dppo.errors import ConfigError
from dppo.privacy.calibration import analytic_gaussian_sigma

MECHANISM = "count_release"


REWARD_MODELS = ("transition", "next_state", "public")


def count_sensitivity(cap: int, reward_noise: float | None, reward_model: str = "transition") -> float:
    """Delta_2 of one user's capped contribution (module docstring): sqrt(2K (1 + 1/c^2)) with the per-entry reward
    part, sqrt(2K (1 + 2/c^2)) with the per-column one (``next_state``); c None or ``public`` rewards: sqrt(2K)."""
    if reward_model == "public":
        reward_noise = None
    parts = 1.0 if reward_model == "transition" else 2.0
    extra = 0.0 if reward_noise is None else parts / float(reward_noise) ** 2
    return math.sqrt(2.0 * int(cap) * (1.0 + extra))


def capped_contributions(user: np.ndarray, t: np.ndarray, entry: np.ndarray, r01: np.ndarray, cap: int,
                         entries: int, cols: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The round's summed contributions ``(sum_u x_u, sum_u y_u)`` (float64 [entries] each), the per-column part
    ``(sum_u z_u, sum_u v_u)`` concatenated (float64 [2 cols]; entry e has column ``e % cols``) and each user's |C_u|.

    Args:
        user, t, entry, r01: one element per step of the round's users: the user (0..n-1), the step index t, the
            entry index (-1: outside the index set) and the reward in [0, 1] (clipped again here).
        cap: K, only steps t < K count.
        entries: the size of the index set.
    """
    keep = (t < int(cap)) & (entry >= 0)
    u, e, tt = user[keep].astype(np.int64), entry[keep].astype(np.int64), t[keep]
    r = np.clip(r01[keep].astype(np.float64), 0.0, 1.0)
    u, e, tt, r = _first(u, e, tt, r)              # each user's distinct entries, at their first step
    uc, c, _, rc = _first(u, e % int(cols), tt, r)  # each user's distinct columns among them, at their first step
    column = np.concatenate([np.bincount(c, minlength=cols), np.bincount(c, weights=rc, minlength=cols)])
    per_user = np.bincount(u, minlength=int(user.max()) + 1 if len(user) else 0)
    if len(per_user) and per_user.max() > cap:    # cannot happen (t < K, distinct): the bound the noise rests on
        raise AssertionError("a user's capped contribution exceeds the transition cap")
    return (np.bincount(e, minlength=entries).astype(np.float64), np.bincount(e, weights=r, minlength=entries),
            column.astype(np.float64), per_user)


def _first(u, key, t, r):
    """The first step (smallest t) of each distinct (user, key), as the four arrays restricted to them."""
    order = np.lexsort((t, key, u))
    u, key, t, r = u[order], key[order], t[order], r[order]
    first = np.ones(len(u), dtype=bool)
    first[1:] = (u[1:] != u[:-1]) | (key[1:] != key[:-1])
    return u[first], key[first], t[first], r[first]


class CountRelease:
    """The release of a round's capped counts on a fixed public index set (module docstring).

    Args:
        privacy: the run's privacy context (non-private: the exact sums are returned, nothing recorded).
        entries: the size of the index set.
        cap: K, the transitions of each user that count (``algo.transition_cap``).
        reward_noise: c, the reward part's noise multiplier relative to the counts' (null: not released).
    """

    def __init__(self, privacy, entries: int, *, cap: int, reward_noise: float | None, cols: int = 1,
                 reward_model: str = "transition"):
        if int(cap) < 1:
            raise ConfigError(f"algo.transition_cap must be >= 1, got {cap}")
        if reward_noise is not None and not float(reward_noise) > 0:
            raise ConfigError(f"algo.reward_noise must be > 0 (or null), got {reward_noise}")
        if reward_model not in REWARD_MODELS:
            raise ConfigError(f"algo.reward_model must be one of {REWARD_MODELS}, got '{reward_model}'")
        self.privacy, self.entries, self.cap, self.cols = privacy, int(entries), int(cap), int(cols)
        self.reward_model = reward_model
        self.reward_entries = {"transition": self.entries, "next_state": 2 * self.cols, "public": 0}[reward_model]
        self.reward_noise = None if reward_noise is None or reward_model == "public" else float(reward_noise)
        self.private = privacy is not None and privacy.private
        self.sensitivity = count_sensitivity(self.cap, self.reward_noise, reward_model)
        self.sigma = analytic_gaussian_sigma(privacy.eps, privacy.delta, self.sensitivity) if self.private else 0.0

    @property
    def reward_sigma(self) -> float:
        """The std of the reward part's noise, c sigma (0 without noise; inf where it is not released)."""
        if self.reward_noise is None:
            return math.inf
        return self.reward_noise * self.sigma

    def release(self, round_idx: int, users: list[int], counts: np.ndarray, rewards: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray | None, dict]:
        """The released ``(M~, Y~)`` of a round's summed contributions (from ``capped_contributions``) of ``users``;
        ``rewards``: the per-entry sums [entries] (``transition``) or the per-column ``(z, v)`` sums [2 cols]
        (``next_state``); ``Y~`` None where the reward part is not released. The users pass the context's one-pass gate before any
        noise is drawn; the release is recorded in the ledger (and the accountant stepped) before it leaves."""
        if counts.shape != (self.entries,) or rewards.shape != (self.reward_entries,):
            raise ValueError(f"the release takes [{self.entries}] and [{self.reward_entries}] sums, got "
                             f"{counts.shape} and {rewards.shape}")
        info = {"count_sigma": self.sigma, "sensitivity": self.sensitivity}
        if self.privacy is not None:
            self.privacy.users.admit_release(users, round_idx)     # one-pass: these users in this round only
        if not self.private:
            return counts.copy(), (None if self.reward_noise is None else rewards.copy()), info
        entry = self.privacy.release(MECHANISM, round=round_idx, users=len(users), eps=self.privacy.eps,
                                     delta=self.privacy.delta, sigma=self.sigma, sensitivity=self.sensitivity,
                                     noise_multiplier=self.sigma / self.sensitivity, adjacency="replace_one",
                                     transition_cap=self.cap, reward_noise=self.reward_noise, entries=self.entries,
                                     reward_model=self.reward_model)
        noise = self.privacy.noise
        m = counts + noise.gaussian((self.entries,), self.sigma).numpy()
        y = None
        if self.reward_noise is not None:
            y = rewards + noise.gaussian((self.reward_entries,), self.reward_sigma).numpy()
        return m, y, {**info, "entry": entry}
