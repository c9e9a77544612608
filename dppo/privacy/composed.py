"""The release of clipped per-user sums every policy learner uses: a round *opens* for its users (accounted once,
in one ledger entry, before any noisy sum of it exists), then releases k noisy sums per user in named parts.
DP-PG is the case k = 1 (one part, ``actor``: one sum per round), DP-PPO k = 2 x epochs (``actor`` and ``critic``);
noise independent (``ComposedGaussianSums``), correlated across rounds (``CorrelatedComposedSums``) or multi-pass
(``PoissonComposedSums``); the non-private twin (``ClippedSums``) clips the same vectors and adds no noise.
``composed_sums`` picks one from the privacy context. Per-user clipping and the base class: ``dppo.privacy.release``.

Setting. A round takes m fresh users. Its update makes a sequence of releases; release j sums the clipped
per-user vectors of a subset S_j of the round's users and adds Gaussian noise,

    y_j = sum_{u in S_j} clip_{C_j}(v_u^(j)) + N(0, sigma_j^2 I),    sigma_j = z * 2 C_j,

where v_u^(j) is a function of user u's own data and of the releases y_1..y_{j-1} only (contract C5: a
PPO minibatch step's per-user gradient at the parameters released so far), and S_j depends on public
randomness and on users' positions in the round only (never on data). Every user lies in at most
``releases_per_user`` = k of the S_j (PPO: one minibatch per epoch, ``parts`` releases per minibatch
step, e.g. the actor's and the critic's gradients: k = epochs x parts); ``release_sum`` enforces it.

Sensitivity (replace-one adjacency). Neighbouring rounds D, D' replace user u by u' at the same position,
so the S_j are the same. Given the history y_1..y_{j-1}, every other user's vector is the same under D
and D'. If u is not in S_j, y_j has the same distribution under both; if u is in S_j,

    || sum_D - sum_D' || = || clip_{C_j}(v_u) - clip_{C_j}(v_u') || <= ||clip(v_u)|| + ||clip(v_u')|| <= 2 C_j,

with equality for v_u' = -v_u of norm >= C_j (tests/privacy/test_composed.py checks both by brute force).

Composition (exact for Gaussians, Gaussian DP). Given the history, release j is a Gaussian mechanism
with sensitivity 2 C_j and std z 2 C_j, i.e. (1/z)-GDP for user u when u is in S_j, and 0-GDP otherwise
(Dong, Roth & Su 2019, Thm. 2.7). The adaptive composition of the k releases that touch u is exactly
(sqrt(k)/z)-GDP (DRS 2019, Cor. 3.3: the transcript's trade-off function is that of one Gaussian
shift); mu-GDP is (eps, delta)-DP iff delta >= Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), the
analytic Gaussian mechanism's curve at sensitivity 1 and std 1/mu (Balle & Wang 2018). Hence

    composition="gdp" (default, exact):  z = sqrt(k) * analytic_gaussian_sigma(eps, delta, 1),

the smallest multiplier for which the round is (eps, delta)-DP. One release per user (k = 1, DP-PG) is the
Gaussian sum: sigma = z 2 C = analytic_gaussian_sigma(eps, delta, 2 C), the round one Gaussian mechanism, so its
ledger entry also names that mechanism's ``sigma``, ``sensitivity`` (2 C) and ``clip``. ``composition="rdp"``
calibrates with Opacus' RDP accountant instead (sample rate 1, k steps: without subsampling, the add/remove
analysis of a sensitivity-1, std-z mechanism is the replace-one analysis of ours), an upper bound that needs
more noise.

Unequal shares (``parts``). The releases may form named parts (PPO: the actor's and the critic's sums),
part p with k_p releases per user and a share w_p of the round's budget (sum_p w_p = 1). Each release
of part p is (1/z_p)-GDP for the user; the k releases compose to mu^2 = sum_p k_p / z_p^2, so

    z_p = z sqrt(k_p / (k w_p))     gives   mu^2 = sum_p w_p k / z^2 = k / z^2,

the same mu as k releases at the equal multiplier z: the same (eps, delta). Equal shares w_p = k_p / k
give z_p = z. Under RDP each Gaussian release of multiplier z_p adds alpha / (2 z_p^2) at every order
alpha, so the same z_p keep the RDP curve, hence Opacus' bound, unchanged too.

Rounds take disjoint users (one-pass), so the run is (eps, delta)-DP by parallel composition: one
ledger entry per round (``open_round``), recorded before the round's first noisy sum leaves.
m and the sizes |S_j| are public (replace-one adjacency keeps them fixed).

Correlated noise across rounds (``privacy.noise_correlation``, ``CorrelatedComposedSums``): each part's releases
form one stream whose noise is sigma_p (C^{-1} z)_t, a user's E = k_p releases of a part bound the stream's
sensitivity, and the whole run is one Gaussian mechanism per user (``dppo.privacy.correlated``,
``dppo.privacy.factorizations``).

Multi-pass (``privacy.multi_pass``, ``PoissonComposedSums``): users Poisson-sampled each round, add/remove
adjacency, each round one subsampled Gaussian for the RDP / PRV accountant (its docstring).

The non-private twin (``ClippedSums``) clips the same vectors to the same norms and adds no noise.
"""
from __future__ import annotations

import math
from collections import Counter

import torch

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.correlated import CorrelatedNoise, NoiseStream, correlation_of
from dppo.privacy.factorizations import MAX_HORIZON, participation_norm_sq
from dppo.privacy.release import Release, clip_fraction, clipped_total  # noqa: F401 - clipped_total re-exported

COMPOSITIONS = ("gdp", "rdp")


def composed_noise_multiplier(eps: float, delta: float, releases_per_user: int, composition: str = "gdp") -> float:
    """z such that ``releases_per_user`` adaptive Gaussian releases of noise std z x sensitivity are, together,
    (eps, delta)-DP for every user (module docstring)."""
    k = int(releases_per_user)
    if k < 1:
        raise ConfigError(f"releases per user must be >= 1, got {releases_per_user}")
    if composition == "gdp":
        return math.sqrt(k) * analytic_gaussian_sigma(eps, delta, 1.0)
    if composition == "rdp":
        from dppo.privacy.accountants.opacus import multi_pass_noise_multiplier

        return multi_pass_noise_multiplier(eps, delta, sample_rate=1.0, steps=k, accountant="rdp")
    raise ConfigError(f"composition must be one of {COMPOSITIONS}, got {composition!r}")


class ComposedGaussianSums(Release):
    """The releases of one round (module docstring): ``open_round`` records the round's (eps, delta) in the
    ledger, then each ``release_sum`` returns one noisy clipped sum.

    Args:
        privacy: the run's ``PrivacyContext`` (eps, delta, noise source, ledger).
        releases_per_user: k, the most releases any one user of a round takes part in (one part).
        composition: ``gdp`` (exact) or ``rdp`` (Opacus).
        parts: optional ``{name: (k_p, w_p)}``: named parts of k_p releases per user each with a share w_p of
            the budget (shares sum to 1); ``release_sum(..., part=name)``. Replaces ``releases_per_user``
            (k = sum_p k_p).
    """

    family = "gaussian_sum"
    private = True
    accountant_multiplier = False   # the entry's noise_multiplier is not the accountant's input (one-pass)

    def __init__(self, privacy, releases_per_user: int | None = None, composition: str = "gdp", *,
                 parts: dict | None = None):
        if privacy.multi_pass:
            raise ConfigError("composed per-round releases need one-pass users (privacy.multi_pass=false)")
        self.privacy = privacy
        self.parts = _check_parts(releases_per_user, parts)
        self.releases_per_user = sum(k for k, _ in self.parts.values())
        self.composition = composition
        self.noise_multiplier = composed_noise_multiplier(privacy.eps, privacy.delta, self.releases_per_user,
                                                          composition)
        k, z = self.releases_per_user, self.noise_multiplier
        self.multipliers = {p: z if w * k == kp else z * math.sqrt(kp / (k * w))
                            for p, (kp, w) in self.parts.items()}
        self._round = None
        self._users: frozenset = frozenset()
        self._count: Counter = Counter()

    @property
    def mechanism(self) -> str:
        """The ledger's name: the family's (``gaussian_sum``, ``correlated_gaussian_sum``, ``poisson_gaussian_sum``)
        for one release per user and round (DP-PG), its ``composed_`` form for k > 1 (DP-PPO)."""
        if self.releases_per_user == 1:
            return self.family
        return self.family.replace("gaussian_sum", "composed_gaussian_sum")

    @property
    def gdp_mu(self) -> float:
        """mu of the round's guarantee in Gaussian DP (exact with composition=gdp): sqrt(sum_p k_p / z_p^2)."""
        return math.sqrt(sum(kp / self.multipliers[p] ** 2 for p, (kp, _) in self.parts.items()))

    def sensitivity(self, clip: float, part=None) -> float:
        """The replace-one l2 sensitivity of one sum of ``part`` clipped to ``clip``: 2 C (module docstring)."""
        return 2.0 * float(clip)

    def _clip_list(self, clips) -> list[float]:
        """The round's clip norms, one per part (in the parts' order) when there are several parts."""
        names, clips = list(self.parts), [float(c) for c in clips]
        if len(names) > 1 and len(clips) != len(names):
            raise PrivacyError(f"open_round: one clip norm per part {names}, got {len(clips)}")
        return clips

    def _opened(self, round_idx: int, users, clips) -> tuple[list[int], list[float]]:
        """Start the round's bookkeeping (its users, no release yet): (the users, the checked clips)."""
        users, clips = [int(u) for u in users], self._clip_list(clips)
        self._round, self._users, self._count = int(round_idx), frozenset(users), Counter()
        return users, clips

    def _record(self, round_idx: int, users: int, round_clips: list[float], dim: int | None, **fields) -> dict:
        """The round's one ledger entry (``PrivacyContext.release``: ledger, accountant, journal). A round that is
        one Gaussian mechanism (k = 1: DP-PG's sum) also names its ``sigma``, ``sensitivity`` and ``clip``, its
        ``noise_multiplier`` then sigma / sensitivity (unless the accountant reads the calibrated one: multi-pass);
        ``dim``: the released vectors' size, when given."""
        if dim is not None:
            fields["dim"] = int(dim)
        if self.releases_per_user == 1 and len(round_clips) == 1:
            part, clip = next(iter(self.parts)), round_clips[0]
            sigma, sensitivity = self.sigma(clip, part), self.sensitivity(clip, part)
            fields.update(sigma=sigma, sensitivity=sensitivity, clip=clip)
            if not self.accountant_multiplier:
                fields["noise_multiplier"] = sigma / sensitivity
        return self.privacy.release(self.mechanism, round=int(round_idx), users=users, **fields)

    def open_round(self, round_idx: int, users, clips, *, dim: int | None = None) -> dict:
        """Record the round's release in the ledger (one entry: parallel composition over rounds) before any
        noisy sum of it is computed; ``clips`` are the clip norms C_j the round will use (for the ledger; one
        per part, in the parts' order, when there are parts); ``dim``: the released vectors' size (recorded)."""
        users, clips = self._opened(round_idx, users, clips)
        zs = list(self.multipliers.values())
        zs = zs if len(zs) > 1 else zs * len(clips)
        extra = {} if list(self.parts) == [None] else {
            "parts": {p: {"releases_per_user": kp, "share": w, "noise_multiplier": self.multipliers[p]}
                      for p, (kp, w) in self.parts.items()}}
        return self._record(round_idx, len(users), clips, dim, eps=self.privacy.eps, delta=self.privacy.delta,
                            adjacency="replace_one", noise_multiplier=self.noise_multiplier,
                            releases_per_user=self.releases_per_user, composition=self.composition,
                            gdp_mu=self.gdp_mu, clips=clips, sigmas=[2.0 * z * c for z, c in zip(zs, clips)], **extra)

    def sigma(self, clip: float, part=None) -> float:
        """Noise std of one sum of ``part`` clipped to ``clip``: z_p x its replace-one sensitivity 2 C (k = 1:
        analytic_gaussian_sigma(eps, delta, 2 C), to the bit: z 2 C and z (2 C) differ by a power of 2 only)."""
        return self._multiplier(part) * 2.0 * float(clip)

    def noise_std(self, clip: float | None = None, part=None) -> float:
        """sigma(clip, part): every sum draws fresh N(0, sigma^2 I)."""
        return self.sigma(clip, part)

    def _multiplier(self, part) -> float:
        if part not in self.multipliers:
            raise PrivacyError(f"release_sum: unknown part {part!r}; this round's parts are {list(self.parts)}")
        return self.multipliers[part]

    def _check_users(self, users, part=None) -> list[int]:
        if self._round is None:
            raise PrivacyError("release_sum before open_round: the round's release is not in the ledger")
        users = [int(u) for u in users]
        if len(set(users)) != len(users) or not set(users) <= self._users:
            raise PrivacyError("release_sum: the rows must be distinct users of the opened round")
        self._multiplier(part)
        limit = self.parts[part][0]
        over = [u for u in users if self._count[part, u] >= limit]
        if over:
            raise PrivacyError(f"release_sum: user {over[0]} would take part in more than "
                               f"{limit} releases{'' if part is None else f' of part {part!r}'} of round {self._round}")
        self._count.update((part, u) for u in users)
        return users

    def release_sum(self, per_user, users, clip: float, part=None) -> tuple[torch.Tensor, dict]:
        """sum_u clip_C(per_user[u]) + N(0, (z_p 2 C)^2 I) over the rows (users ``users`` of the opened round).
        ``per_user``: the (b, P) rows, or an iterable of row blocks in the users' order (``clipped_total``).

        Returns (noisy sum float64, stats: ``diag/clip_fraction`` is raw)."""
        self._check_users(users, part)
        return self._noisy(*clipped_total(per_user, clip), clip, part)

    def release_clipped_sum(self, total, norms, users, clip: float, part=None) -> tuple[torch.Tensor, dict]:
        """The same release from a clipped sum formed elsewhere (every row scaled to norm <= ``clip``: the fused
        path's ``clip_scale``, or the sums of every rank's users under multi-process training) and its users'
        pre-clipping ``norms``."""
        self._check_users(users, part)
        return self._noisy(total.double(), norms, clip, part)

    def _noisy(self, total, norms, clip, part) -> tuple[torch.Tensor, dict]:
        noisy = total + self.privacy.noise.gaussian(total.shape, self.sigma(clip, part))
        return noisy, {"diag/clip_fraction": clip_fraction(norms, clip)}


class CorrelatedComposedSums(ComposedGaussianSums):
    """DP-PPO's round releases with one correlated stream per part (module docstring): part p's E_p = k_p
    releases per user (one minibatch per epoch) bound its sensitivity 2 C_p sqrt(B_{E_p}(c)), its noise
    sigma_p = 2 C_p sqrt(B_{E_p}) / (sqrt(w_p) mu), mu = 1 / analytic_gaussian_sigma(eps, delta, 1)."""

    family = "correlated_gaussian_sum"

    def __init__(self, privacy, releases_per_user: int | None = None, composition: str = "gdp", *,
                 parts: dict | None = None, correlation: CorrelatedNoise):
        if composition != "gdp":
            raise ConfigError("privacy.noise_correlation composes its stream in Gaussian DP: use algo.accountant=gdp")
        super().__init__(privacy, releases_per_user, composition, parts=parts)
        self.correlation = correlation
        self.mu = 1.0 / analytic_gaussian_sigma(privacy.eps, privacy.delta, 1.0)
        rounds = correlation.rounds or MAX_HORIZON
        self.coefficients = {p: correlation.coefficients(rounds * kp, participations=kp)
                             for p, (kp, _) in self.parts.items()}
        self.bound = {p: participation_norm_sq(self.coefficients[p], kp) for p, (kp, _) in self.parts.items()}
        # sigma(clip, part) = multipliers[part] x 2 clip, as for independent noise
        self.multipliers = {p: math.sqrt(self.bound[p] / w) / self.mu for p, (_, w) in self.parts.items()}
        self.noise_multiplier = 1.0 / self.mu   # of the whole stream: sigma / sensitivity at the full budget
        self.streams = {p: NoiseStream(self.coefficients[p], privacy.noise) for p in self.parts}
        self._clips: dict = {}

    @property
    def gdp_mu(self) -> float:
        """mu of every user's guarantee: sqrt(sum_p (Delta_p / sigma_p)^2) = mu."""
        return math.sqrt(sum(self.bound[p] / self.multipliers[p] ** 2 for p in self.parts))

    def sensitivity(self, clip: float, part=None) -> float:
        """The stream's replace-one sensitivity for a user in its part's k_p releases: 2 C sqrt(B_{k_p}(c))."""
        return 2.0 * float(clip) * math.sqrt(self.bound[part])

    def sigma(self, clip: float, part=None) -> float:
        """sigma_p = 2 C_p sqrt(B_p) / (sqrt(w_p) mu); a part holding the whole budget (w_p = 1: DP-PG's one stream)
        is the analytic Gaussian at the stream's sensitivity, analytic_gaussian_sigma(eps, delta, 2 C sqrt(B))."""
        if self.parts[part][1] == 1.0:
            return analytic_gaussian_sigma(self.privacy.eps, self.privacy.delta, self.sensitivity(clip, part))
        return self._multiplier(part) * 2.0 * float(clip)

    def open_round(self, round_idx: int, users, clips, *, dim: int | None = None) -> dict:
        """One ledger entry for the round's users, stating the whole stream's guarantee (module docstring)."""
        names = list(self.parts)
        checked = self._clip_list(clips)
        for p, c in zip(names, checked if len(names) > 1 else checked[:1] * len(names)):
            if self._clips.setdefault(p, c) != c:
                raise PrivacyError(f"a correlated noise stream keeps one clip norm per part: {p!r} had "
                                   f"{self._clips[p]}, now {c}")
        for stream in self.streams.values():
            stream.begin(round_idx, self.privacy)
        users, clips = self._opened(round_idx, users, clips)
        parts = {str(p): {"releases_per_user": kp, "share": w, "noise_multiplier": self.multipliers[p] / math.sqrt(
                     self.bound[p]), "sensitivity_factor": math.sqrt(self.bound[p]),
                     "coefficients": [float(x) for x in self.coefficients[p]]}
                 for p, (kp, w) in self.parts.items()}
        first = next(iter(self.streams.values()))
        return self._record(round_idx, len(users), clips, dim, eps=self.privacy.eps, delta=self.privacy.delta,
                            adjacency="replace_one", noise_multiplier=self.noise_multiplier,
                            releases_per_user=self.releases_per_user, composition="gdp", gdp_mu=self.gdp_mu,
                            clips=clips, sigmas=[self.sigma(self._clips[p], p) for p in names], parts=parts,
                            noise_correlation=self.correlation.kind, bands=len(first.c),
                            stream_start=first.start_round)

    def release_sum(self, per_user, users, clip: float, part=None) -> tuple[torch.Tensor, dict]:
        """sum_u clip_C(per_user[u]) + sigma_p (C^{-1} z)_t, t this part's next release."""
        self._check_users(users, part)
        if float(clip) != self._clips.get(part, float(clip)):
            raise PrivacyError(f"release_sum: part {part!r} was opened with clip {self._clips[part]}, got {clip}")
        return self._noisy(*clipped_total(per_user, clip), clip, part)

    def release_clipped_sum(self, total, norms, users, clip: float, part=None) -> tuple[torch.Tensor, dict]:
        self._check_users(users, part)
        if float(clip) != self._clips.get(part, float(clip)):
            raise PrivacyError(f"release_sum: part {part!r} was opened with clip {self._clips[part]}, got {clip}")
        return self._noisy(total.double(), norms, clip, part)

    def _noisy(self, total, norms, clip, part) -> tuple[torch.Tensor, dict]:
        noisy = total + self.streams[part].scaled(total.shape, self.sigma(clip, part))
        return noisy, {"diag/clip_fraction": clip_fraction(norms, clip)}

    def noise_std(self, clip: float | None = None, part=None) -> float:
        """The std of the last release's noise coordinates of ``part`` (public): sigma_p times the stream's."""
        return self.sigma(clip, part) * self.streams[part].marginal_std()


class PoissonComposedSums(ComposedGaussianSums):
    """Multi-pass DP-PPO (``privacy.multi_pass``): each round's users Poisson-sampled at rate q from a population
    of N, so a user takes part in many rounds; adjacency is add/remove one user (Opacus' analysis).

    Sensitivity: adding or removing user u changes each sum it takes part in by clip_{C_j}(v_u), norm <= C_j
    (the other users' vectors are unchanged given the history, as in the module docstring), provided removing u
    moves nobody else to another sum: ``PPO.schedule`` draws each user's minibatch of an epoch from public
    randomness keyed by (run seed, round, epoch, the user's population index) only, never from a split of the
    sample (below). Part p's sums carry N(0, (z_p C)^2 I).

    Accounting: given that u is sampled, the round's k adaptive releases are (sqrt(sum_p k_p / z_p^2))-GDP, and
    that composition is exact for Gaussians (one Gaussian's trade-off curve: DRS 2019, Cor. 3.3), so the round is
    the Poisson-subsampled Gaussian mechanism of multiplier z_round = 1 / mu at rate q: one ledger entry per round
    (``noise_multiplier`` z_round, ``sample_rate`` q) for the RDP / PRV accountant, which composes the rounds;
    z_round is the smallest meeting (eps, delta) after ``rounds`` rounds (``multi_pass_noise_multiplier``), and
    z_p = sqrt(k) z_round sqrt(k_p / (k w_p)) splits it between the parts as for one-pass rounds. A sum over a
    minibatch becomes a mean by its expected count q N / b (``batch_size``: the sampled count is not released).

    Several minibatches (b > 1) leave the round's guarantee that of b = 1. Fix the public draws: user u's
    minibatch in each epoch e is a function m_e(u) of (seed, round, e, u), the same whether or not any other user
    is sampled, and each sampled user is in exactly one minibatch per epoch. Let D' = D + {u}. If u is not
    sampled, the two rounds run the same users through the same minibatches: identical output distributions.
    If u is sampled, it takes part in exactly the k = 2 x epochs releases of its minibatches m_e(u) (the actor's
    and the critic's sum of each epoch), as with b = 1; every other release j sums the same users under D and D'
    (their minibatches do not depend on u), their vectors functions of their own data and of y_1..y_{j-1}, and it
    is divided by the public q N / b, never by a count u could change: given the history, its output
    distribution does not depend on u (0-GDP). A release of m_e(u) moves by clip(v_u), norm <= C_j, against noise
    z_p C_j: (1/z_p)-GDP given the history. Adaptive composition over the round's releases (DRS 2019, Cor. 3.3)
    gives sqrt(sum_p k_p / z_p^2)-GDP, the same mu = 1 / z_round as b = 1, and u's inclusion is the one Poisson
    event of rate q that b = 1 has. So the round is the same Poisson-subsampled Gaussian of multiplier z_round at
    rate q, and the accountant's entry (q, z_round, k) is unchanged. A minibatch that drew nobody releases noise
    only, as an empty round does. A split of the realised sample (positions in it) would break the argument:
    adding u would shift other users between minibatches, changing sums u is not in.
    """

    family = "poisson_gaussian_sum"
    accountant_multiplier = True    # the RDP / PRV accountant reads the entry's noise_multiplier, as calibrated

    def __init__(self, privacy, composition: str = "gdp", *, parts: dict, sample_rate: float, population_size: int,
                 rounds: int):
        from dppo.privacy.accountants.opacus import multi_pass_noise_multiplier

        self.privacy = privacy
        self.parts = _check_parts(None, parts)
        self.releases_per_user = k = sum(kp for kp, _ in self.parts.values())
        self.composition = composition
        self.sample_rate = float(sample_rate)
        self.expected_users = self.sample_rate * int(population_size)
        self.noise_multiplier = multi_pass_noise_multiplier(privacy.eps, privacy.delta, self.sample_rate, int(rounds),
                                                            privacy.accountant.name)
        z = math.sqrt(k) * self.noise_multiplier
        self.multipliers = {p: z if w * k == kp else z * math.sqrt(kp / (k * w)) for p, (kp, w) in self.parts.items()}
        self._round = None
        self._users: frozenset = frozenset()
        self._count: Counter = Counter()

    def sensitivity(self, clip: float, part=None) -> float:
        """The add/remove l2 sensitivity of one sum clipped to ``clip``: C."""
        return float(clip)

    def sigma(self, clip: float, part=None) -> float:
        """z_p x the add/remove sensitivity C of one sum."""
        return self._multiplier(part) * float(clip)

    def batch_size(self, users: int, minibatches: int = 1) -> float:
        """The public expected count of one of a round's ``minibatches`` minibatches, q N / b (each sampled user's
        minibatch uniform over the b, ``PPO.schedule``), whatever the realised ``users``: that count is a function
        of who else was sampled, and no release divides by it."""
        return self.expected_users / int(minibatches)

    def open_round(self, round_idx: int, users, clips, *, dim: int | None = None) -> dict:
        """The round's one entry (a Poisson-subsampled Gaussian of multiplier 1 / mu), before any sum leaves."""
        users, clips = self._opened(round_idx, users, clips)
        names = list(self.parts)
        zs = [self.multipliers[p] for p in names] if len(names) > 1 else [self.multipliers[names[0]]] * len(clips)
        parts = {str(p): {"releases_per_user": kp, "share": w, "noise_multiplier": self.multipliers[p]}
                 for p, (kp, w) in self.parts.items()}
        # users: the expected count q N (public); the realised size of a Poisson sample is not (add/remove)
        return self._record(round_idx, round(self.expected_users), clips, dim, eps=None, delta=None,
                            adjacency="add_remove", noise_multiplier=self.noise_multiplier,
                            sample_rate=self.sample_rate, releases_per_user=self.releases_per_user,
                            gdp_mu=self.gdp_mu, clips=clips, sigmas=[z * c for z, c in zip(zs, clips)], parts=parts)


def _check_parts(releases_per_user, parts) -> dict:
    """{part: (k_p, w_p)}: ``parts`` checked (k_p >= 1, w_p in (0, 1], shares summing to 1), or one part
    ``None`` of ``releases_per_user`` releases."""
    if parts is None:
        if releases_per_user is None or int(releases_per_user) < 1:
            raise ConfigError(f"releases per user must be >= 1, got {releases_per_user}")
        return {None: (int(releases_per_user), 1.0)}
    if releases_per_user is not None:
        raise ConfigError("give releases_per_user or parts, not both")
    out = {p: (int(k), float(w)) for p, (k, w) in parts.items()}
    if not out or any(k < 1 or not 0 < w <= 1 for k, w in out.values()):
        raise ConfigError(f"every part needs >= 1 release and a budget share in (0, 1], got {parts}")
    if abs(sum(w for _, w in out.values()) - 1.0) > 1e-9:
        raise ConfigError(f"the parts' budget shares must sum to 1, got {sum(w for _, w in out.values()):g}")
    return out


class ClippedSums(Release):
    """The non-private twin: the same clipped sums without noise; nothing is recorded."""

    noise_multiplier = 0.0
    multipliers: dict = {}   # no part is noised

    def open_round(self, round_idx: int, users, clips, *, dim: int | None = None) -> None:
        return None

    def sigma(self, clip: float, part=None) -> float:
        return 0.0

    def release_sum(self, per_user, users, clip: float, part=None) -> tuple[torch.Tensor, dict]:
        total, norms = clipped_total(per_user, clip)
        return total, {"diag/clip_fraction": clip_fraction(norms, clip)}

    def release_clipped_sum(self, total, norms, users, clip: float, part=None) -> tuple[torch.Tensor, dict]:
        return total.double(), {"diag/clip_fraction": clip_fraction(norms, clip)}


def composed_sums(privacy, releases_per_user: int | None = None, composition: str = "gdp", *, parts: dict | None = None,
                  sampler=None, rounds: int = 1):
    """The round's release for this privacy context: ``ComposedGaussianSums`` (``CorrelatedComposedSums`` with
    ``privacy.noise_correlation``: ``dppo.privacy.correlated``; ``PoissonComposedSums`` with ``privacy.multi_pass``,
    from the ``sampler``'s rate and population, calibrated over ``rounds``), or ``ClippedSums`` if eps is null.
    DP-PG's: ``parts={"actor": (1, 1.0)}``; DP-PPO's: ``{"actor": (epochs, w), "critic": (epochs, 1 - w)}``."""
    if composition not in COMPOSITIONS:
        raise ConfigError(f"algo.accountant must be one of {COMPOSITIONS}, got {composition!r}")
    _check_parts(releases_per_user, parts)
    if not privacy.private:
        return ClippedSums()
    if privacy.multi_pass:
        if getattr(privacy, "noise_correlation", None) is not None:
            raise ConfigError("privacy.noise_correlation needs one-pass users: set privacy.multi_pass=false or "
                              "privacy.noise_correlation=none")
        return PoissonComposedSums(privacy, composition, parts=parts if parts is not None else
                                   {None: (releases_per_user, 1.0)}, sample_rate=sampler.sample_rate,
                                   population_size=sampler.population_size, rounds=rounds)
    if getattr(privacy, "noise_correlation", None) is not None:  # one correlated stream per part
        return CorrelatedComposedSums(privacy, releases_per_user, composition, parts=parts,
                                      correlation=correlation_of(privacy))
    return ComposedGaussianSums(privacy, releases_per_user, composition, parts=parts)

