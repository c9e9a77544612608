"""Several Gaussian sums of per-user vectors in one round, composed for the same users (DP-PPO's releases).

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

the smallest multiplier for which the round is (eps, delta)-DP. ``composition="rdp"`` calibrates with
Opacus' RDP accountant instead (sample rate 1, k steps: without subsampling, the add/remove analysis of
a sensitivity-1, std-z mechanism is the replace-one analysis of ours), an upper bound that needs more
noise. Rounds take disjoint users (one-pass), so the run is (eps, delta)-DP by parallel composition: one
ledger entry per round (``open_round``), recorded before the round's first noisy sum leaves.
m and the sizes |S_j| are public (replace-one adjacency keeps them fixed).

The non-private twin (``ClippedSums``) clips the same vectors to the same norms and adds no noise.
"""
from __future__ import annotations

import math
from collections import Counter

import torch

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.clipping import clip_per_user

COMPOSITIONS = ("gdp", "rdp")
MECHANISM = "composed_gaussian_sum"


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


class ComposedGaussianSums:
    """The releases of one round (module docstring): ``open_round`` records the round's (eps, delta) in the
    ledger, then each ``release_sum`` returns one noisy clipped sum.

    Args:
        privacy: the run's ``PrivacyContext`` (eps, delta, noise source, ledger).
        releases_per_user: k, the most releases any one user of a round takes part in.
        composition: ``gdp`` (exact) or ``rdp`` (Opacus).
    """

    mechanism = MECHANISM
    private = True

    def __init__(self, privacy, releases_per_user: int, composition: str = "gdp"):
        if privacy.multi_pass:
            raise ConfigError("composed per-round releases need one-pass users (privacy.multi_pass=false)")
        self.privacy = privacy
        self.releases_per_user, self.composition = int(releases_per_user), composition
        self.noise_multiplier = composed_noise_multiplier(privacy.eps, privacy.delta, self.releases_per_user,
                                                          composition)
        self._round = None
        self._users: frozenset = frozenset()
        self._count: Counter = Counter()

    @property
    def gdp_mu(self) -> float:
        """mu of the round's guarantee in Gaussian DP (exact with composition=gdp)."""
        return math.sqrt(self.releases_per_user) / self.noise_multiplier

    def open_round(self, round_idx: int, users, clips) -> dict:
        """Record the round's release in the ledger (one entry: parallel composition over rounds) before any
        noisy sum of it is computed; ``clips`` are the clip norms C_j the round will use (for the ledger)."""
        users = [int(u) for u in users]
        self._round, self._users, self._count = int(round_idx), frozenset(users), Counter()
        z = self.noise_multiplier
        return self.privacy.release(self.mechanism, round=int(round_idx), users=len(users), eps=self.privacy.eps,
                                    delta=self.privacy.delta, adjacency="replace_one", noise_multiplier=z,
                                    releases_per_user=self.releases_per_user, composition=self.composition,
                                    gdp_mu=self.gdp_mu, clips=[float(c) for c in clips],
                                    sigmas=[2.0 * z * float(c) for c in clips])

    def sigma(self, clip: float) -> float:
        """Noise std of one sum clipped to ``clip``: z x its replace-one sensitivity 2 C."""
        return self.noise_multiplier * 2.0 * float(clip)

    def _check_users(self, users) -> list[int]:
        if self._round is None:
            raise PrivacyError("release_sum before open_round: the round's release is not in the ledger")
        users = [int(u) for u in users]
        if len(set(users)) != len(users) or not set(users) <= self._users:
            raise PrivacyError("release_sum: the rows must be distinct users of the opened round")
        over = [u for u in users if self._count[u] >= self.releases_per_user]
        if over:
            raise PrivacyError(f"release_sum: user {over[0]} would take part in more than "
                               f"{self.releases_per_user} releases of round {self._round}")
        self._count.update(users)
        return users

    def release_sum(self, per_user: torch.Tensor, users, clip: float) -> tuple[torch.Tensor, dict]:
        """sum_u clip_C(per_user[u]) + N(0, (z 2 C)^2 I) over the rows (users ``users`` of the opened round).

        Returns (noisy sum float64, stats: ``diag/clip_fraction`` is raw)."""
        self._check_users(users)
        clipped, norms = clip_per_user(per_user, clip)
        noisy = clipped.sum(0) + self.privacy.noise.gaussian(clipped.shape[1:], self.sigma(clip))
        return noisy, {"diag/clip_fraction": _fraction(norms, clip)}


class ClippedSums:
    """The non-private twin: the same clipped sums without noise; nothing is recorded."""

    mechanism = "none"
    private = False
    noise_multiplier = 0.0

    def open_round(self, round_idx: int, users, clips) -> None:
        return None

    def sigma(self, clip: float) -> float:
        return 0.0

    def release_sum(self, per_user: torch.Tensor, users, clip: float) -> tuple[torch.Tensor, dict]:
        clipped, norms = clip_per_user(per_user, clip)
        return clipped.sum(0), {"diag/clip_fraction": _fraction(norms, clip)}


def composed_sums(privacy, releases_per_user: int, composition: str = "gdp"):
    """The round's release for this privacy context: ``ComposedGaussianSums``, or ``ClippedSums`` if eps is null."""
    if composition not in COMPOSITIONS:
        raise ConfigError(f"algo.composition must be one of {COMPOSITIONS}, got {composition!r}")
    if not privacy.private:
        return ClippedSums()
    return ComposedGaussianSums(privacy, releases_per_user, composition)


def _fraction(norms: torch.Tensor, clip: float) -> float:
    return float((norms > clip).double().mean()) if len(norms) else 0.0
