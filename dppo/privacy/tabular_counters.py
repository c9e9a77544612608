"""The private statistics of the tabular learners: stream layout, replace-one sensitivity, counter choice.

Layout. Three sets of streams in one flat vector ``[ l | n | m ]`` (reward sums, visits, transitions):

* per step (``pooled=False``, the papers'): ``l, n`` over ``(h, s, a)``, ``m`` over ``(h, s, a, s')``;
  index of ``(h, s, a)`` is ``(h S + s) A + a``;
* pooled over h (``pooled=True``, time-homogeneous MDPs): ``l, n`` over ``(s, a)``, ``m`` over
  ``(s, a, s')``; a user's episode adds its visits of every step to the same streams.

Replace-one sensitivity (one user = one episode = one counter time step). Split the streams into
*groups* whose one-episode increment is a nonnegative vector with L1 mass at most ``M``:

* per step: a group is (set, h), ``M = 1`` - at step h the episode adds 1 to one ``n`` entry, 1 to one
  ``m`` entry and its reward in [0, 1] to one ``l`` entry;
* pooled: a group is a set, ``M = H`` - the episode's H visits (rewards, transitions) all land in
  the set, possibly on the same entry.

Replacing the user changes a group's increment from ``u`` to ``u'`` (both >= 0, ``||.||_1 <= M``):
``||u - u'||_2^2 = ||u||^2 + ||u'||^2 - 2 <u, u'> <= ||u||_1^2 + ||u'||_1^2 <= 2 M^2``, attained by two
episodes that put all their mass on different entries. Pooled, the learner may keep only the first
``cap`` visits of each (s, a) per episode (``pool_cap``; the kept visits are still an unbiased sample
of each pair's transitions and rewards, by the Markov property): entries are then in [0, cap], and
``||u||_2^2 <= q cap^2 + r^2`` with ``(q, r) = divmod(M, cap)``, ``M = min(H, cap S A)`` (at most
``cap H``). Summing over groups, the joint L2 sensitivity of one time step is ``sqrt(6 H)`` per step
(3H groups of mass 1), ``sqrt(6) H`` pooled without a cap and ``sqrt(6 cap H)`` with one; the L1
sensitivity is ``2 M`` per group, at most ``6H`` in every layout. The Gaussian counters enforce the
premise (``_GaussianCounter.clip_increment``: values clipped to ``[0, cap]``, group sums scaled to
``<= M``); ``tests/privacy/test_tabular_counters.py`` checks the bound by brute force over all pairs
of episodes of small MDPs.

Counters (``algo.counter``):

* ``laplace_tree``: PUCB's binary tree with Laplace noise (``dppo.privacy.tree_counter``), pure eps-DP:
  Laplace scale ``b = L * (L1 sensitivity 6H) / eps`` over all streams and levels, i.e. each stream is
  an ``eps Delta / (6H)``-DP tree counter with per-stream clip ``Delta`` (1 per step, H pooled);
* ``gaussian_tree`` / ``gaussian_sqrt`` / ``gaussian_opt`` (``gaussian`` = ``gaussian_opt`` for at most
  ``DENSE_MAX_STEPS`` counter steps, ``gaussian_sqrt`` beyond; ``resolve_counter``): one Gaussian continual
  counter over all streams with ``rho`` from the target (eps, delta) (``rho_for_target``) and
  ``sigma = Delta_2 kappa / sqrt(2 rho)`` (``dppo.privacy.gaussian_counter``). The ledger gets one entry
  per set with that set's share ``rho_set = (Delta_set kappa)^2 / (2 sigma^2)``
  (``Delta_set^2 = 2H`` per step, ``2 H^2`` pooled); the three add up to ``rho`` in the zCDP accountant.
  With the ``gdp`` accountant the same one Gaussian mechanism is calibrated exactly instead (analytic Gaussian,
  ``counter_sigma``; the sets' ``mu_set^2 = (Delta_set kappa / (c_set sigma))^2`` add up to the joint ``mu^2``).

Unequal noise per set (``set_noise = (c_l, c_n, c_m)``, Gaussian counters only). The set's streams get the
node noise ``c_set sigma`` (a fixed per-stream multiplier of the data-independent noise), which is the
Gaussian mechanism on the data scaled by ``1 / c_set`` with noise ``sigma``: its joint L2 sensitivity is
``Delta_c = sqrt(sum_set (Delta_set / c_set)^2)`` (``weighted_l2_sensitivity``; ``sqrt(3) Delta_set`` for
equal multipliers), ``sigma = Delta_c kappa / sqrt(2 rho)`` and the set's ledger share is
``rho_set = (Delta_set kappa)^2 / (2 (c_set sigma)^2)``, summing to ``rho``. A learner whose widths are
dominated by one set (DP-UBEV: the transitions) spends more of the budget on it.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from dppo.errors import ConfigError
from dppo.privacy.accountants.zcdp import rho_for_target
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.gaussian_counter import (COUNTERS, DENSE_MAX_STEPS, GAUSSIAN_ALIASES, GaussianTreeCounter,
                                           StreamRanges, optimized_factorization, sigma_for_rho, sqrt_decoder,
                                           sqrt_factorization)
from dppo.privacy.tree_counter import TreeCounter, tree_levels

COUNTER_CHOICES = ("laplace_tree", "gaussian", *COUNTERS)
SETS = ("rewards", "visits", "transitions")


class TabularLayout:
    """Stream layout and sensitivity of the (l, n, m) statistics (module docstring)."""

    def __init__(self, S: int, A: int, H: int, pooled: bool, pool_cap: int | None = None,
                 set_noise: tuple | None = None):
        self.S, self.A, self.H, self.pooled = int(S), int(A), int(H), bool(pooled)
        c = (1.0, 1.0, 1.0) if set_noise is None else tuple(float(x) for x in set_noise)
        if len(c) != 3 or not all(x > 0 and math.isfinite(x) for x in c):
            raise ConfigError(f"set_noise must be three positive noise multipliers (rewards, visits, transitions), "
                              f"got {set_noise}")
        self.set_noise = c
        Hc = 1 if pooled else H
        self.sa = Hc * S * A                        # streams per set l, n (m: sa * S)
        self.set_sizes = (self.sa, self.sa, self.sa * S)
        self.num_streams = sum(self.set_sizes)
        # pooled: keep the first `cap` visits of each (s, a) per episode (entries <= cap, mass <= min(H, cap S A))
        self.cap = (H if pool_cap is None else max(1, min(int(pool_cap), H))) if pooled else 1
        self.mass = float(min(H, self.cap * S * A) if pooled else 1)    # L1 mass of one group's increment
        self.group_mass = np.full(3 if pooled else 3 * H, self.mass)   # one group per set (per set and h)
        self.stream_max = float(self.cap)

    @functools.cached_property
    def groups(self) -> np.ndarray:
        """The group of every stream (built on first use: a too-large layout is refused before it is built)."""
        if self.pooled:
            groups = [np.full(k, i) for i, k in enumerate(self.set_sizes)]
        else:
            h_of = lambda k, per: np.arange(k) // per         # streams are h-major
            groups = [i * self.H + h_of(k, k // self.H) for i, k in enumerate(self.set_sizes)]
        return np.concatenate(groups).astype(np.int64)

    def group_ranges(self) -> StreamRanges:
        """``groups`` as contiguous ranges (G numbers, not one per stream): per set pooled, per (set, h) per step."""
        per = 1 if self.pooled else self.H
        starts, at = [], 0
        for k in self.set_sizes:
            starts += [at + j * (k // per) for j in range(per)]
            at += k
        return StreamRanges(starts, np.arange(len(starts)), self.num_streams)

    def stream_noise_ranges(self) -> StreamRanges:
        """``stream_noise()`` as three ranges (one multiplier per set)."""
        return StreamRanges([0, self.set_sizes[0], self.set_sizes[0] + self.set_sizes[1]], self.set_noise,
                             self.num_streams)

    @property
    def group_sq_norm(self) -> float:
        """Largest ``||u||_2^2`` of a group increment with entries in [0, cap] and L1 mass <= M."""
        q, r = divmod(self.mass, self.cap)
        return q * self.cap ** 2 + r ** 2

    @property
    def set_l2_sensitivity(self) -> float:
        """Per set: ``sqrt(2 max||u||^2 * groups per set)``: sqrt(2H) per step; pooled sqrt(2 cap H)
        (sqrt(2) H without a cap)."""
        per_set = 1 if self.pooled else self.H
        return math.sqrt(2 * self.group_sq_norm * per_set)

    @property
    def l2_sensitivity(self) -> float:
        """Joint, all three sets: sqrt(6H) per step, sqrt(6) H pooled."""
        return math.sqrt(3) * self.set_l2_sensitivity

    @property
    def equal_noise(self) -> bool:
        return self.set_noise == (1.0, 1.0, 1.0)

    @property
    def weighted_l2_sensitivity(self) -> float:
        """``sqrt(sum_set (Delta_set / c_set)^2)`` (module docstring): ``l2_sensitivity`` for equal multipliers."""
        if self.equal_noise:
            return self.l2_sensitivity
        return self.set_l2_sensitivity * math.sqrt(sum(1.0 / (c * c) for c in self.set_noise))

    def stream_noise(self) -> np.ndarray:
        """Per-stream noise multiplier (``c_set`` over each set's streams)."""
        return np.concatenate([np.full(k, c) for k, c in zip(self.set_sizes, self.set_noise)])

    @property
    def l1_sensitivity(self) -> float:
        """Joint L1 over the three sets: ``6 M`` per step h summed (6H), ``6 M`` pooled (<= 6H)."""
        return 6.0 * (self.mass if self.pooled else self.H)

    @property
    def streams_changed_per_set(self) -> float:
        """Replacing one user changes a set's streams by at most this many per-stream clips in L1
        (``l1_sensitivity / 3 / stream_max``): ``2H`` streams per step, each by at most 1."""
        return self.l1_sensitivity / 3 / self.stream_max

    def increments(self, states, actions, rewards) -> tuple[list, list]:
        """One episode's (stream indices, values), aggregated so that each stream appears once."""
        S, A, k, cap = self.S, self.A, self.sa, self.cap
        acc: dict[int, float] = {}
        for h, (s, a, r) in enumerate(zip(states, actions, rewards)):
            i = (s * A + a) if self.pooled else (h * S + s) * A + a
            if acc.get(k + i, 0.0) >= cap:               # beyond the cap: this visit is not counted
                continue
            for j, v in ((i, float(r)), (k + i, 1.0), (2 * k + i * S + states[h + 1], 1.0)):
                acc[j] = acc.get(j, 0.0) + v
        return list(acc), list(acc.values())


def release_schedule(episodes: int, growth: float, max_block: int | None = None) -> list[int]:
    """When the counters release: the (1-based) episode counts ``t_1 < t_2 < ... = T`` that end a block,
    ``t_j = min(T, t_{j-1} + max_block, max(t_{j-1} + 1, ceil(growth t_{j-1})))`` from ``t_0 = 0`` - blocks of
    one episode while ``t < 1/(growth - 1)``, then growing by the factor ``growth`` up to ``max_block``
    episodes (``growth = 1``: after every episode).

    The schedule is public (a function of T and growth only). Each block is one time step of the
    continual counters (``add`` / ``close_step``): every user is in exactly one step, so the guarantee is
    the one of one user per step, with ``B = len(schedule)`` steps instead of T - about
    ``1/(g-1) + ln((g-1) T)/ln(g)`` (187 for T = 10^5 at g = 1.05, 234 for 10^6) - which lowers the counters' error
    (``kappa`` and the release variance grow with the number of steps) and the number of releases a
    union bound over the learner's plans has to cover.
    """
    if not growth >= 1:
        raise ConfigError(f"block_growth must be >= 1, got {growth}")
    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    if max_block is not None and max_block < 1:
        raise ConfigError(f"max_block must be >= 1 (or null), got {max_block}")
    cap = math.inf if max_block is None else int(max_block)
    ends, t = [], 0
    while t < episodes:
        t = int(min(episodes, t + cap, max(t + 1, math.ceil(t * growth))))
        ends.append(t)
    return ends


def counter_kappa(kind: str, capacity: int, row_weights: tuple | None = None) -> float:
    """Largest encoder column norm of a Gaussian counter for T = capacity (module docstring)."""
    if kind == "gaussian_tree":
        return math.sqrt(int(capacity).bit_length())
    if kind == "gaussian_opt":
        return optimized_factorization(int(capacity), row_weights)["kappa"]
    return sqrt_factorization(int(capacity))["kappa"]


def counter_arrays(kind: str, capacity: int, private: bool) -> int:
    """Arrays of one float64 per stream a counter holds (its memory is this times ``8 num_streams`` bytes):
    the exact counts and the open step; private, also the release and the noise state - the tree's levels
    (Laplace: and its running total), the square-root decoder's buffers, last draw
    and current noise, the optimized factorization's whole history of draws (``capacity`` rows) and current
    noise. Fresh noise is drawn into its row of the state, in pieces (Laplace: where the streams outnumber
    its ``max_chunk``; else a chunk of at most ``max_chunk`` values)."""
    if not private:
        return 2
    kind = GAUSSIAN_ALIASES.get(kind, kind)
    state = {"laplace_tree": tree_levels(capacity) + 1, "gaussian_tree": int(capacity).bit_length(),
             "gaussian_sqrt": sqrt_decoder(int(capacity))[0].size + 2, "gaussian_opt": int(capacity) + 1}[kind]
    return 2 + 1 + state


def resolve_counter(kind: str, capacity: int | None = None, streams: int | None = None,
                    budget_gb: float | None = None) -> str:
    """The counter kind ``kind`` names. ``gaussian`` is the most accurate Gaussian counter for the number of
    counter steps whose state fits ``budget_gb`` for ``streams`` streams (both public): the optimized
    factorization (``gaussian_opt``, state ``capacity`` rows) for at most ``DENSE_MAX_STEPS`` steps, else the
    square-root factorization (``gaussian_sqrt``, about ``2 log2(8 capacity)`` rows), else the binary tree
    (``gaussian_tree``, ``log2 capacity`` rows). Without a capacity: the square-root factorization."""
    if kind not in COUNTER_CHOICES:
        raise ConfigError(f"algo.counter must be one of {list(COUNTER_CHOICES)}, got '{kind}'")
    if kind != "gaussian" or capacity is None:
        return GAUSSIAN_ALIASES.get(kind, kind)
    fits = lambda k: streams is None or budget_gb is None or \
        counter_arrays(k, capacity, True) * 8 * int(streams) <= budget_gb * 2 ** 30
    if int(capacity) <= DENSE_MAX_STEPS and fits("gaussian_opt"):
        return "gaussian_opt"
    return "gaussian_sqrt" if fits("gaussian_sqrt") or not fits("gaussian_tree") else "gaussian_tree"


def build_counter(kind: str, layout: TabularLayout, capacity: int, privacy, users: int | None = None,
                  row_weights: tuple | None = None):
    """The counter over all streams of ``layout`` for ``capacity`` time steps holding ``users`` users in all
    (default: one per step); exact counts when ``privacy`` is off. ``row_weights``: ``gaussian_opt`` only, the
    releases its factorization is optimized for (``OptimizedFactorizationCounter``)."""
    kind = resolve_counter(kind, capacity)
    eps = privacy.eps if privacy is not None and privacy.private else None
    n = layout.num_streams
    if not layout.equal_noise and kind not in COUNTERS:
        raise ConfigError("algo.set_noise (unequal noise per statistic set) needs a Gaussian counter (algo.counter=gaussian)")
    if kind == "laplace_tree":
        delta_stream = layout.stream_max             # per-stream clip: 1 per step, the cap pooled
        eps_stream = None if eps is None else laplace_stream_eps(eps, layout)
        return TreeCounter(n, capacity, eps_stream, sensitivity=delta_stream,
                           noise=privacy.noise if eps is not None else None, users=users)
    cls = COUNTERS[kind]
    extra = {"row_weights": row_weights} if kind == "gaussian_opt" else {}
    groups = layout.group_ranges()
    if eps is None:
        return cls(n, capacity, None, groups=groups, group_mass=layout.group_mass,
                   stream_max=layout.stream_max, **extra)
    kappa = counter_kappa(kind, capacity, row_weights)
    sigma = counter_sigma(privacy, layout.weighted_l2_sensitivity, kappa)
    rho = (rho_for_target(eps, privacy.delta) if getattr(privacy.accountant, "name", None) != "gdp"
           else (layout.weighted_l2_sensitivity * kappa) ** 2 / (2 * sigma ** 2))   # the zCDP it is (B&S Prop. 1.6)
    counter = cls(n, capacity, sigma, noise=privacy.noise, groups=groups, group_mass=layout.group_mass,
                  stream_max=layout.stream_max, stream_noise=None if layout.equal_noise else layout.stream_noise_ranges(),
                  **extra)
    counter.rho = rho
    return counter


def counter_sigma(privacy, sensitivity: float, kappa: float) -> float:
    """Node noise of a Gaussian counter with joint L2 sensitivity ``sensitivity`` (the layout's
    ``weighted_l2_sensitivity``) and encoder column norm ``kappa``, for the target (eps, delta) of ``privacy``.
    The whole continual release is a post-processing of one Gaussian mechanism ``C X + Z`` with L2 sensitivity
    ``sensitivity * kappa`` (``dppo.privacy.gaussian_counter``), so the calibration follows the run's accountant:

    * ``gdp`` accountant: the analytic Gaussian mechanism, ``sigma = analytic_gaussian_sigma(eps, delta,
      sensitivity kappa)``, the exact privacy profile of that one mechanism (``dppo.privacy.accountants.gdp``
      then reports exactly (eps, delta));
    * otherwise (``zcdp``): ``sigma = sensitivity kappa / sqrt(2 rho)`` with the largest ``rho`` whose zCDP
      conversion meets (eps, delta) (``rho_for_target``): 7% (eps 5) to 8% (eps 1) more noise at delta 1e-5.
    """
    if getattr(privacy.accountant, "name", None) == "gdp":
        return analytic_gaussian_sigma(privacy.eps, privacy.delta, sensitivity * kappa)
    return sigma_for_rho(rho_for_target(privacy.eps, privacy.delta), sensitivity, kappa)


def laplace_stream_eps(eps: float, layout: TabularLayout) -> float:
    """Per-stream budget of the Laplace tree counters: ``eps Delta_stream / L1`` with ``L1`` the joint L1
    sensitivity of the three sets (``layout.l1_sensitivity``), i.e. ``eps / (6H)`` per step (PUCB's): each
    set's ``2H`` changed streams then compose to ``eps/3`` and the three sets to ``eps`` (basic composition)."""
    return eps * layout.stream_max / layout.l1_sensitivity


def reference_error_bound(counter: TreeCounter, layout: TabularLayout, eps: float, beta: float) -> float:
    """PUCB's count-error bound (Vietri et al. 2020, REFERENCE.md section 2) for the Laplace tree counters:
    ``E_eps = (3/eps) U ln((2SAH + S^2AH)/beta) ln(T)^{5/2}`` with ``U`` the streams of a set one user changes
    (``2H`` under replace-one; the paper's ``H`` is add/remove), ``T`` the counter capacity, plus the
    snapping error ``Lambda/2`` of the released values."""
    S, A, H, T = layout.S, layout.A, layout.H, counter.capacity
    touched = layout.streams_changed_per_set
    return counter.snap_error + (3 / eps) * touched * math.log((2 * S * A * H + S * S * A * H) / beta) \
        * math.log(T) ** 2.5


def record_counter_releases(privacy, counter, layout: TabularLayout, users: int) -> None:
    """Ledger entries (one per statistic set) for the whole continual release, before the first step: the one
    release record of every tabular learner (UBEV's exact counts record nothing)."""
    if privacy is None or not privacy.private:
        return
    for name, size, c in zip(SETS, layout.set_sizes, layout.set_noise):
        if isinstance(counter, TreeCounter):
            privacy.release("tree_counter", round=0, users=users, eps=privacy.eps / 3, delta=0.0, counter_set=name,
                            streams=size, eps_per_stream=counter.eps_stream,
                            streams_changed_per_user=layout.streams_changed_per_set, noise_scale=counter.scale,
                            scale=counter.scale,
                            sensitivity=layout.l1_sensitivity / 3, node_sensitivity=counter.levels * counter.sensitivity,
                            levels=counter.levels, capacity=counter.capacity, adjacency="replace_one",
                            pooled=layout.pooled)
            continue
        from dppo.privacy.accountants.zcdp import zcdp_to_dp

        sens = layout.set_l2_sensitivity * counter.kappa          # over all node releases of the set
        sigma_set = counter.sigma if c == 1.0 else counter.sigma * c     # the set's node noise
        rho_set = sens ** 2 / (2 * sigma_set ** 2)
        privacy.release(f"{counter.kind}_counter", round=0, users=users, eps=zcdp_to_dp(rho_set, privacy.delta),
                        delta=privacy.delta, sigma=sigma_set, sensitivity=sens,
                        noise_multiplier=sigma_set / sens, rho=rho_set, adjacency="replace_one",
                        counter_set=name, streams=size, step_l2_sensitivity=layout.set_l2_sensitivity,
                        kappa=counter.kappa, capacity=counter.capacity, pooled=layout.pooled,
                        grid=2.0 ** -16)
