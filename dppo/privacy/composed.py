"""The one release of clipped per-user sums, ``ComposedGaussianSums``: every Gaussian-sum release of dppo goes
through it (DP-PG, DP-PPO, the LM, the dp_gd oracle of DP-NPG and DP-REBEL, ``dppo.make_private``). A round *opens*
for its users (accounted once, in one ledger entry, before any noisy sum of it exists), then releases k noisy sums
per user in named parts. It is built from three declared parts:

* participation: ``parts`` {name: (k_p, w_p)}, how many sums of each part a user enters per round and its share of
  the budget (DP-PG: one sum, k = 1; DP-PPO: ``actor`` and ``critic``, k = 2 x epochs; dp_gd: its k steps);
* sampling: ``OnePass`` (replace-one, parallel composition over rounds) or ``Poisson`` (multi-pass, add/remove,
  the sampler's rate and population, accounted by RDP/PRV);
* noise: ``Independent``, ``Correlated`` (a ``CorrelatedNoise`` stream across rounds) or ``NoNoise`` (the
  non-private twin: the same clipped sums, nothing recorded).

One calibration function computes its noise (``dppo.privacy.calibration.gaussian_sums_calibration``). The release
is the gatekeeper, not its caller: it clips every user's row itself (or checks a clipped total formed with its own
clipping factors), refuses rows that are not exactly one per user, a clip other than the one it accounted, more
than k_p sums of a part per user, and (one-pass) a user already released in another round (the context's
``UserGate``, checkpointed with the context). ``composed_sums`` builds it from a privacy context.

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

Rounds take disjoint users (one-pass, enforced by the context's ``UserGate``: ``dppo.privacy.users``), so the run
is (eps, delta)-DP by parallel composition: one ledger entry per round (``open_round``), recorded before the round's
first noisy sum leaves. A round index opened again (independent noise) adds a second entry to that round, which the
parallel accountant composes with the first (basic composition within a round): the printed eps covers a user who
takes part in both.
m and the sizes |S_j| are public (replace-one adjacency keeps them fixed).

Correlated noise across rounds (``privacy.noise_correlation``, ``Correlated``): each part's releases
form one stream whose noise is sigma_p (C^{-1} z)_t, a user's E = k_p releases of a part bound the stream's
sensitivity, and the whole run is one Gaussian mechanism per user (``dppo.privacy.correlated``,
``dppo.privacy.factorizations``).

Multi-pass (``privacy.multi_pass``, ``Poisson``): users Poisson-sampled each round, add/remove adjacency, each
round one subsampled Gaussian for the RDP / PRV accountant (its docstring).

The non-private twin (``NoNoise``) clips the same vectors to the same norms and adds no noise.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy.calibration import COMPOSITIONS, gaussian_sums_calibration
from dppo.privacy.correlated import CorrelatedNoise, NoiseStream, correlation_of
from dppo.privacy.factorizations import MAX_HORIZON, participation_norm_sq
from dppo.privacy.release import FUSED_MARGIN, clip_fraction, clip_per_user, clip_scale
from dppo.privacy.users import user_ids

__all__ = ["ComposedGaussianSums", "OnePass", "Poisson", "Independent", "Correlated", "NoNoise", "composed_sums",
           "COMPOSITIONS"]


# ---- sampling: who a round's sums are over, and the adjacency they are accounted for -----------------------------
class OnePass:
    """Each user in one round (replace-one adjacency): a sum's sensitivity is 2 C; rounds compose in parallel."""

    adjacency = "replace_one"
    family = "gaussian_sum"
    sample_rate = None

    def sensitivity(self, clip: float) -> float:
        return 2.0 * float(clip)

    def batch_size(self, users: int, minibatches: int = 1) -> float:
        return users


@dataclass(frozen=True)
class Poisson:
    """Multi-pass DP-PG / DP-PPO (``privacy.multi_pass``): each round's users Poisson-sampled at rate q from a population
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
    minibatch becomes a mean by its expected count q N / b (``Poisson.batch_size``: the sampled count is not released).

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

    Attributes: ``sample_rate`` q, ``population_size`` N, ``rounds`` (the run the multiplier is calibrated over).
    """

    sample_rate: float
    population_size: int
    rounds: int

    adjacency = "add_remove"
    family = "poisson_gaussian_sum"

    def sensitivity(self, clip: float) -> float:
        return float(clip)

    def batch_size(self, users: int, minibatches: int = 1) -> float:
        """The public expected count of one of a round's ``minibatches`` minibatches, q N / b (each sampled user's
        minibatch uniform over the b, ``PPO.schedule``), whatever the realised ``users``: that count is a function
        of who else was sampled, and no release divides by it."""
        return self.sample_rate * int(self.population_size) / int(minibatches)


# ---- noise: independent, correlated across rounds, or none (the twin) ----------------------------------------------
class Independent:
    """Every sum draws fresh N(0, sigma_p^2 I)."""

    private = True


@dataclass(frozen=True)
class Correlated:
    """Each part's sums form one stream with noise sigma_p (C^{-1} z)_t (``dppo.privacy.correlated``)."""

    spec: CorrelatedNoise
    private = True


class NoNoise:
    """The non-private twin: the same clipped sums, no noise, nothing recorded."""

    private = False


class ComposedGaussianSums:
    """The one release of clipped per-user sums (module docstring): ``open_round`` records the round in the ledger
    (one entry), then each ``release_sum`` / ``release_clipped_sum`` returns one noisy clipped sum of a part.

    Args:
        privacy: the run's ``PrivacyContext`` (eps, delta, noise source, ledger, user gate).
        releases_per_user: k, the sums any one user of a round enters (one part); or ``parts``.
        composition: ``gdp`` (exact) or ``rdp`` (Opacus), for one-pass independent noise.
        parts: ``{name: (k_p, w_p)}``: named parts of k_p sums per user, each with a share w_p of the budget.
        sampling: ``OnePass()`` (default) or ``Poisson(...)`` (must agree with ``privacy.multi_pass``).
        noise: ``Independent()``, ``Correlated(spec)`` or ``NoNoise()``; default: the context's
            (``NoNoise`` without eps, ``Correlated`` with ``privacy.noise_correlation``).
        mechanism: the ledger's name of the round (default: the family's, below); ``ledger``: fields every entry
            carries besides (e.g. dp_gd's ``steps``).
    """

    def __init__(self, privacy, releases_per_user: int | None = None, composition: str = "gdp", *,
                 parts: dict | None = None, sampling=None, noise=None, mechanism: str | None = None,
                 ledger: dict | None = None):
        if composition not in COMPOSITIONS:
            raise ConfigError(f"algo.accountant must be one of {COMPOSITIONS}, got {composition!r}")
        self.privacy = privacy
        self.parts = _check_parts(releases_per_user, parts)
        self.releases_per_user = sum(kp for kp, _ in self.parts.values())
        self.composition = composition
        self.sampling = sampling if sampling is not None else OnePass()
        if noise is None:
            spec = correlation_of(privacy) if privacy.private else None
            noise = NoNoise() if not privacy.private else Correlated(spec) if spec is not None else Independent()
        self.noise = noise
        self.private = bool(noise.private)
        self._name, self._ledger = mechanism, dict(ledger or {})
        self._round, self._last_round = None, None
        self._users: frozenset = frozenset()
        self._count: Counter = Counter()
        self._clips: dict = {}
        self.multipliers: dict = {p: 0.0 for p in self.parts}
        self.noise_multiplier = 0.0
        if not self.private:
            return
        if privacy.eps is None:
            raise ConfigError("a private release needs a privacy context with eps set (eps=None: NoNoise)")
        poisson = isinstance(self.sampling, Poisson)
        if poisson != bool(privacy.multi_pass):
            raise ConfigError("composed per-round releases need one-pass users (privacy.multi_pass=false)" if not
                              poisson else "a Poisson release needs a multi-pass privacy context "
                              "(privacy.multi_pass=true)")
        bounds = None
        if isinstance(noise, Correlated):
            if poisson:
                raise ConfigError("privacy.noise_correlation needs one-pass users: set privacy.multi_pass=false or "
                                  "privacy.noise_correlation=none")
            if composition != "gdp":
                raise ConfigError("privacy.noise_correlation composes its stream in Gaussian DP: use "
                                  "algo.accountant=gdp")
            rounds = noise.spec.rounds or MAX_HORIZON
            self.coefficients = {p: noise.spec.coefficients(rounds * kp, participations=kp)
                                 for p, (kp, _) in self.parts.items()}
            bounds = {p: participation_norm_sq(self.coefficients[p], kp) for p, (kp, _) in self.parts.items()}
            self.streams = {p: NoiseStream(self.coefficients[p], privacy.noise) for p in self.parts}
        self.bound = bounds or {p: kp for p, (kp, _) in self.parts.items()}
        cal = gaussian_sums_calibration(
            privacy.eps, privacy.delta, self.parts, composition=composition, stream_bounds=bounds,
            sample_rate=self.sampling.sample_rate if poisson else None,
            rounds=self.sampling.rounds if poisson else 1, accountant=privacy.accountant.name if poisson else "rdp")
        self.calibration = cal
        self.noise_multiplier, self.multipliers, self.gdp_mu = cal.noise_multiplier, cal.multipliers, cal.mu

    # ---- what a learner asks of a release ----------------------------------------------------------------------
    @property
    def mechanism(self) -> str:
        """The ledger's name: the job's (``dp_gd``) if given, else the family's (``gaussian_sum``,
        ``correlated_gaussian_sum``, ``poisson_gaussian_sum``) for one sum per user and round (DP-PG), its
        ``composed_`` form for k > 1 (DP-PPO); ``none`` for the twin."""
        if not self.private:
            return "none"
        if self._name is not None:
            return self._name
        family = "correlated_gaussian_sum" if isinstance(self.noise, Correlated) else self.sampling.family
        return family if self.releases_per_user == 1 else family.replace("gaussian_sum", "composed_gaussian_sum")

    def sensitivity(self, clip: float, part=None) -> float:
        """The l2 sensitivity of ``part``'s releases for one user: one sum's (2 C replace-one, C add/remove),
        times sqrt(B_p(c)) for a correlated stream (a user's k_p sums of it)."""
        one = self.sampling.sensitivity(clip)
        return one * math.sqrt(self.bound[part]) if isinstance(self.noise, Correlated) else one

    def sigma(self, clip: float, part=None) -> float:
        """Noise std of one sum of ``part`` clipped to ``clip``: z_p x one sum's sensitivity; a correlated part
        holding the whole budget is the analytic Gaussian at the stream's sensitivity (DP-PG's one stream)."""
        z = self._multiplier(part)
        if not self.private:
            return 0.0
        if part in self.calibration.whole_stream:
            return self.calibration.sigma(part, self.sampling.sensitivity(clip), math.sqrt(self.bound[part]))
        return z * self.sampling.sensitivity(clip)

    def noise_std(self, clip: float | None = None, part=None) -> float:
        """The std of each noise coordinate of ``part``'s last released sum (public; 0 for the twin)."""
        self._multiplier(part)
        if not self.private:
            return 0.0
        clip = self._clips.get(part, clip)
        if isinstance(self.noise, Correlated):
            return self.sigma(clip, part) * self.streams[part].marginal_std()
        return self.sigma(clip, part)

    def clip_scale(self, norms: torch.Tensor, clip: float) -> torch.Tensor:
        """The clipping factors of a clipped sum formed elsewhere (clip norm ``clip``), with ``FUSED_MARGIN``."""
        return clip_scale(norms, float(clip), FUSED_MARGIN)

    def batch_size(self, users: int, minibatches: int = 1) -> float:
        """What a released sum over ``users`` users (one of ``minibatches``) is divided by to form a mean: the count
        (public under replace-one), or a Poisson release's expected count q N / b."""
        return self.sampling.batch_size(users, minibatches) if self.private else users

    def round_users(self, users: list[int]) -> tuple[list[int], int]:
        """(the round's users, where ``users`` start among them): ``users`` and 0 in one process; under
        multi-process training every rank's users and this rank's offset (``dppo.training.distributed``)."""
        return list(users), 0

    # ---- the round -----------------------------------------------------------------------------------------------
    def open_round(self, round_idx: int, users, clips, *, dim: int | None = None) -> dict | None:
        """Record the round's release in the ledger (one entry: parallel composition over rounds) before any noisy
        sum of it is computed, for its ``users`` (ids; one-pass: refused if any was released in another round) and
        ``clips``, one clip norm per part in the parts' order (every sum of a part is clipped to it);
        ``dim``: the released vectors' size (recorded). The twin records nothing (None)."""
        round_idx, names = int(round_idx), list(self.parts)
        try:
            clips = [float(c) for c in (clips if isinstance(clips, (list, tuple)) else (clips,))]
        except (TypeError, ValueError):
            clips = None
        if clips is None or len(clips) != len(names) or not all(c > 0 and math.isfinite(c) for c in clips):
            raise PrivacyError(f"open_round: pass clips, one positive clip norm per part {names} in that order")
        if not self.private:
            self._round, self._users, self._count = round_idx, frozenset(user_ids(users)), Counter()
            self._clips = dict(zip(names, clips))
            return None
        if isinstance(self.noise, Correlated):
            if self._last_round is not None and round_idx <= self._last_round:
                raise PrivacyError(f"open_round: round {round_idx} does not follow round {self._last_round}; a "
                                   f"correlated noise stream opens each round once, in order")
            for p, c in zip(names, clips):
                if self._clips.setdefault(p, c) != c:
                    raise PrivacyError(f"a correlated noise stream keeps one clip norm per part: {p!r} had "
                                       f"{self._clips[p]}, now {c}")
            for stream in self.streams.values():
                stream.begin(round_idx, self.privacy)
        users = self.privacy.users.admit_release(users, round_idx) if not isinstance(self.sampling, Poisson) \
            else user_ids(users)
        self._round, self._last_round, self._users, self._count = round_idx, round_idx, frozenset(users), Counter()
        self._clips = dict(zip(names, clips))
        return self.privacy.release(self.mechanism, round=round_idx, **self._entry(len(users), clips, dim))

    def _entry(self, users: int, clips: list[float], dim: int | None) -> dict:
        """The round's ledger fields (module docstring): its users and (eps, delta) (a Poisson round: the expected
        count and None, the accountant's), multipliers, clips and sigmas, the parts; one part of one clip also
        names its ``sigma``, ``sensitivity`` and ``clip`` (the round is one Gaussian mechanism of a sum when k = 1,
        or its k composed steps under one-pass noise)."""
        names, poisson = list(self.parts), isinstance(self.sampling, Poisson)
        correlated = isinstance(self.noise, Correlated)
        sigmas = [self.sigma(c, p) for p, c in zip(names, clips)]
        fields = {"users": round(self.sampling.sample_rate * self.sampling.population_size) if poisson else users,
                  "eps": None if poisson else self.privacy.eps, "delta": None if poisson else self.privacy.delta,
                  "adjacency": self.sampling.adjacency, "noise_multiplier": self.noise_multiplier}
        if poisson:
            fields["sample_rate"] = self.sampling.sample_rate
        fields.update(releases_per_user=self.releases_per_user)
        if not poisson:
            fields["composition"] = self.composition
        fields.update(gdp_mu=self.gdp_mu, clips=clips, sigmas=sigmas)
        if correlated:
            fields["parts"] = {str(p): {"releases_per_user": kp, "share": w, "noise_multiplier":
                                        self.multipliers[p] / math.sqrt(self.bound[p]),
                                        "sensitivity_factor": math.sqrt(self.bound[p]),
                                        "coefficients": [float(x) for x in self.coefficients[p]]}
                               for p, (kp, w) in self.parts.items()}
            first = next(iter(self.streams.values()))
            fields.update(noise_correlation=self.noise.spec.kind, bands=len(first.c), stream_start=first.start_round)
        elif poisson or names != [None]:
            fields["parts"] = {(str(p) if poisson else p): {"releases_per_user": kp, "share": w,
                                                            "noise_multiplier": self.multipliers[p]}
                               for p, (kp, w) in self.parts.items()}
        fields.update(self._ledger)
        if dim is not None:
            fields["dim"] = int(dim)
        if len(names) == 1 and (self.releases_per_user == 1 or not (poisson or correlated)):
            sigma, sensitivity = sigmas[0], self.sensitivity(clips[0], names[0])
            fields.update(sigma=sigma, sensitivity=sensitivity, clip=clips[0])
            if not poisson:
                fields["noise_multiplier"] = sigma / sensitivity
        return fields

    # ---- the sums ------------------------------------------------------------------------------------------------
    def release_sum(self, per_user, users, clip: float | None = None, part=None) -> tuple[torch.Tensor, dict]:
        """sum_u clip_C(per_user[u]) + the part's noise, over exactly one row per user of ``users`` (ids of the
        opened round, in the rows' order). ``per_user``: the (b, P) rows, or an iterable of row blocks in the
        users' order; each row is clipped here to the part's clip (``clip``, if given, must be it).

        Returns (noisy sum float64, stats: ``diag/clip_fraction`` is raw)."""
        users, clip = self._check(users, clip, part)
        total, norms = _clipped_rows(per_user, clip, len(users))
        return self._noisy(total, norms, clip, part, users)

    def release_clipped_sum(self, total, norms, users, clip: float | None = None, part=None
                            ) -> tuple[torch.Tensor, dict]:
        """The same release from a clipped sum formed elsewhere with this release's clipping factors
        (``clip_scale``: the fused path, or the sums of every rank's users under multi-process training) and its
        users' pre-clipping ``norms``, one per user. Refused if the norms are not one per user, or if ``total``
        is longer than a sum of rows clipped to ``clip`` can be: sum_u min(||g_u||, C)."""
        users, clip = self._check(users, clip, part)
        try:
            norms, total = torch.as_tensor(norms).double().reshape(-1), torch.as_tensor(total).double()
        except (TypeError, RuntimeError, ValueError):
            raise PrivacyError("release_clipped_sum: pass the clipped total and one pre-clipping norm per user as "
                               "tensors") from None
        if norms.numel() != len(users):
            raise PrivacyError(f"release_clipped_sum: {norms.numel()} norms for {len(users)} users; pass one "
                               f"pre-clipping norm per user")
        bound = float(norms.nan_to_num(nan=math.inf).clamp_max(clip).sum())
        if float(total.norm()) > bound * (1 + 1e-4) + 1e-12 * clip:
            raise PrivacyError(f"release_clipped_sum: the total's norm {float(total.norm()):.6g} exceeds what "
                               f"{len(users)} rows clipped to {clip} can sum to ({bound:.6g}); clip each user's row "
                               f"with clip_scale, or pass the rows to release_sum")
        return self._noisy(total, norms, clip, part, users)

    def _check(self, users, clip, part) -> tuple[list[int], float]:
        """The gate of every sum: an opened round, a known part, its users distinct members of the round, none past
        k_p sums of the part, and the part's accounted clip."""
        if part not in self.parts:
            raise PrivacyError(f"release_sum: unknown part {part!r}; this release's parts are {list(self.parts)}")
        users = user_ids(users)
        if self._round is None:
            if self.private:
                raise PrivacyError("release_sum before open_round: the round's release is not in the ledger; call "
                                   "open_round(round, users, clips) first")
            if clip is None:
                raise PrivacyError("release_sum: pass clip= (the twin has no opened round to take it from)")
            if len(set(users)) != len(users):
                raise PrivacyError("release_sum: the rows must be distinct users, one row each")
            return users, float(clip)
        if len(set(users)) != len(users) or not set(users) <= self._users:
            raise PrivacyError(f"release_sum: the rows must be distinct users of the opened round {self._round}, one "
                               f"row each")
        accounted = self._clips[part]
        if clip is not None and float(clip) != accounted:
            raise PrivacyError(f"release_sum: part {part!r} was opened with clip {accounted}, got {clip}; open the "
                               f"round with the clip you release with")
        limit = self.parts[part][0]
        over = [u for u in users if self._count[part, u] >= limit]
        if over:
            raise PrivacyError(f"release_sum: user {over[0]} would take part in more than {limit} releases"
                               f"{'' if part is None else f' of part {part!r}'} of round {self._round}")
        return users, accounted

    def _noisy(self, total, norms, clip, part, users) -> tuple[torch.Tensor, dict]:
        """The sum leaves with its noise; its users' participation is counted now that nothing refused it."""
        stats = {"diag/clip_fraction": clip_fraction(norms, clip)}
        if self._round is not None:
            self._count.update((part, u) for u in users)
        if not self.private:
            return total, stats
        if isinstance(self.noise, Correlated):
            return total + self.streams[part].scaled(total.shape, self.sigma(clip, part)), stats
        return total + self.privacy.noise.gaussian(total.shape, self.sigma(clip, part)), stats

    def _multiplier(self, part) -> float:
        if part not in self.multipliers:
            raise PrivacyError(f"release_sum: unknown part {part!r}; this release's parts are {list(self.parts)}")
        return self.multipliers[part]


def _clipped_rows(per_user, clip: float, users: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the rows each clipped to ``clip``, their norms), refusing anything but exactly ``users`` rows: a
    (b, P) matrix, or an iterable of (b_k, P) blocks clipped as they come (a round's users need not be in memory at
    once). An empty round (no users) is the zero vector of the rows' width."""
    if torch.is_tensor(per_user):
        if per_user.dim() != 2 or per_user.shape[0] != users:
            raise PrivacyError(f"release_sum: rows of shape {tuple(per_user.shape)} for {users} users; pass exactly "
                               f"one row per user, a (users, P) matrix (sum each user's own rows first)")
        clipped, norms = clip_per_user(per_user, clip)
        return clipped.sum(0), norms
    if per_user is None or not hasattr(per_user, "__iter__"):
        raise PrivacyError(f"release_sum: pass the rows, a (users, P) tensor (one row per user), got {per_user!r}")
    total, norms, rows = None, [], 0
    blocks = per_user
    for block in blocks:
        block = torch.as_tensor(block)
        if block.dim() != 2:
            raise PrivacyError(f"release_sum: rows must be a (users, P) matrix (one row per user), got shape "
                               f"{tuple(block.shape)}")
        rows += block.shape[0]
        if rows > users:
            break
        clipped, n = clip_per_user(block, clip)
        total = clipped.sum(0) if total is None else total + clipped.sum(0)
        norms.append(n)
    if rows != users:
        raise PrivacyError(f"release_sum: {rows if rows <= users else 'more than ' + str(users)} rows for {users} "
                           f"users; pass exactly one row per user (sum each user's own rows first)")
    if total is None:
        raise PrivacyError("release_sum: no rows; pass a (0, P) matrix for a round without users")
    return total, torch.cat(norms)


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


def composed_sums(privacy, releases_per_user: int | None = None, composition: str = "gdp", *, parts: dict | None = None,
                  sampler=None, rounds: int = 1, mechanism: str | None = None, ledger: dict | None = None
                  ) -> ComposedGaussianSums:
    """The release for this privacy context, its sampling from the context and the ``sampler`` actually used
    (multi-pass: a Poisson sampler's rate and population, calibrated over ``rounds``), its noise from the context
    (``NoNoise`` if eps is null, ``Correlated`` with ``privacy.noise_correlation``). DP-PG's:
    ``parts={"actor": (1, 1.0)}``; DP-PPO's: ``{"actor": (epochs, w), "critic": (epochs, 1 - w)}``."""
    sampling = None
    if privacy.private and privacy.multi_pass:
        if sampler is None or not sampler.multi_pass or sampler.sample_rate is None:
            raise ConfigError("a multi-pass release needs the run's Poisson sampler (privacy.multi_pass=true draws "
                              "users with dppo.data.PoissonUserSampler)")
        sampling = Poisson(float(sampler.sample_rate), int(sampler.population_size), int(rounds))
    elif privacy.private and sampler is not None and sampler.multi_pass:
        raise ConfigError("the sampler reuses users (multi-pass) but the privacy context is one-pass: set "
                          "privacy.multi_pass=true with an RDP/PRV accountant")
    return ComposedGaussianSums(privacy, releases_per_user, composition, parts=parts, sampling=sampling,
                                mechanism=mechanism, ledger=ledger)
