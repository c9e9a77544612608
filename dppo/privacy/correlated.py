"""Correlated noise across rounds: the matrix-factorization (DP-FTRL style) option of the Gaussian sum releases.

What changes. With independent noise every release adds fresh N(0, sigma^2 I), so after T releases an SGD
iterate carries noise of std sqrt(T) sigma. Here release t adds sigma (C^{-1} z)_t instead, with z iid N(0, I)
from the run's ``NoiseSource`` (the OS CSPRNG unless seeded noise is asked for) and C a banded lower-triangular
Toeplitz factorization (``dppo.privacy.factorizations``): the noise of the prefix sums the optimizer forms
partly cancels. ``NoiseStream`` draws it recursively, w_t = z_t - sum_{k=1}^{b-1} c_k w_{t-k}, keeping the last
b - 1 noise vectors (O(b d) memory, never the T x d matrix).

Guarantee. The released stream x + sigma C^{-1} z is a post-processing of C x + sigma z, one Gaussian mechanism
whose replace-one sensitivity for a user in E releases is 2 C_clip sqrt(B_E(c)) (derived and bounded for every
participation pattern, stream length and restart in ``dppo.privacy.factorizations``), adaptive inputs included
for lower-triangular C (Denisov et al. 2022). So the whole stream is mu-GDP in each user with
mu = sensitivity / sigma, and sigma = analytic_gaussian_sigma(eps, delta, sensitivity) makes every user's
guarantee exactly (eps, delta) (mu-GDP is (eps, delta)-DP on the analytic Gaussian curve; ``composed``'s
docstring). DP-PPO's parts (actor, critic) are two such streams, interleaved: in release order their joint
factorization is still lower-triangular, and with part p's noise sigma_p = Delta_p / (sqrt(w_p) mu) the
user's mu^2 = sum_p w_p mu^2 = mu^2.

Ledger convention. The stream is one mechanism, but its users arrive round by round (one-pass: each user
takes part in the releases of one round only). Each round records ONE entry, before its first noisy sum
leaves, that states the guarantee of the whole stream for that round's users: (eps, delta), ``sigma``,
``sensitivity`` (the stream's, 2 C_clip sqrt(B_E)), ``noise_multiplier = sigma / sensitivity``, ``gdp_mu`` and
the factorization. Later releases add nothing for them: the entry already covers every release of the stream
(their data enters those rows of C x too). The parallel accountant's max over rounds then prints (eps, delta)
for every user, as it does for independent noise; the ``gdp`` or ``basic`` accountant, which compose every
entry, print an upper bound.

Resume. The noise history is not checkpointed. A resumed run (crash or extension) starts a new stream at its
first round: block-diagonal C, each block a truncation of the same banded Toeplitz matrix, which the bound
B_E covers; the new block's rows touch only the new rounds' users (fresh with secure noise: the lost attempt's
users are burned) and its noise is independent of the old block's, so every user stays in one Gaussian
mechanism of sensitivity <= 2 C_clip sqrt(B_E). With seeded noise a crash replays the same users, who would
be released again with other noise (the old stream's history is gone): refused in one line.

The release: ``dppo.privacy.composed.ComposedGaussianSums`` with ``Correlated`` noise (DP-PG: one part, each user in one release;
DP-PPO: two parts, each user in ``epochs`` releases of each), picked by ``composed_sums`` when the context
carries a ``CorrelatedNoise`` (``privacy.noise_correlation``).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy.factorizations import KINDS, factorization

CORRELATIONS = ("none", *KINDS)


@dataclass(frozen=True)
class CorrelatedNoise:
    """The correlated-noise option of a run's releases (``privacy.noise_correlation``, ``privacy.bands``).

    Attributes:
        kind: ``banded`` (coefficients optimized for the workload) or ``banded_sqrt`` (the square root of the
            prefix-sum matrix truncated to ``bands``); ``dppo.privacy.factorizations``.
        bands: b, the number of nonzero diagonals of C (1: independent noise).
        momentum: the workload's momentum (0: prefix sums, SGD; beta: SGD with momentum beta).
        rounds: the planned rounds (for DP-PPO's stream horizon, rounds x epochs; utility only).
    """

    kind: str = "banded"
    bands: int = 8
    momentum: float = 0.0
    rounds: int | None = None

    def __post_init__(self):
        factorization(self.kind, 1)  # checks the kind
        if int(self.bands) < 1:
            raise ConfigError(f"privacy.bands must be >= 1, got {self.bands}")
        if not 0 <= float(self.momentum) < 1:
            raise ConfigError(f"the correlated noise's momentum must lie in [0, 1), got {self.momentum}")

    def coefficients(self, horizon: int, participations: int = 1):
        return factorization(self.kind, self.bands, horizon, participations, self.momentum)


def correlation_of(privacy) -> CorrelatedNoise | None:
    """The context's correlated-noise option (``privacy.noise_correlation``, set by the builder), or None."""
    spec = getattr(privacy, "noise_correlation", None)
    if spec is not None and not isinstance(spec, CorrelatedNoise):
        raise ConfigError(f"privacy.noise_correlation must be a CorrelatedNoise, got {type(spec).__name__}")
    return spec


class NoiseStream:
    """Unit-scale correlated noise (C^{-1} z)_t, drawn recursively with the last b - 1 vectors kept."""

    def __init__(self, coefficients, noise):
        self.c = [float(x) for x in coefficients]
        self.noise = noise
        self.history: deque = deque(maxlen=max(len(self.c) - 1, 1))
        self.position = 0
        self.start_round: int | None = None
        self.sigma: float | None = None
        self._h: deque = deque(maxlen=max(len(self.c) - 1, 1))   # C^{-1}'s last coefficients: the marginal std
        self._var = 0.0

    def begin(self, round_idx: int, privacy) -> None:
        """Called before each round's first draw: fixes where this stream (block) starts (module docstring)."""
        if self.position:
            return
        if int(round_idx) > 0 and not privacy.noise.secure:
            raise PrivacyError(f"correlated noise cannot resume a seeded run mid-stream (round {round_idx}): the "
                               "replayed users would be released again with other noise; rerun it from the start")
        self.start_round = int(round_idx)

    def scaled(self, shape, sigma: float) -> torch.Tensor:
        """sigma w_t; a stream keeps one sigma (x + sigma C^{-1} z is the mechanism accounted)."""
        if self.sigma is None:
            self.sigma = float(sigma)
        elif float(sigma) != self.sigma:
            raise PrivacyError(f"a correlated noise stream keeps one sigma: it began with {self.sigma}, got {sigma}")
        return self.draw(shape) * self.sigma

    def draw(self, shape) -> torch.Tensor:
        """w_t = z_t - sum_{k=1}^{b-1} c_k w_{t-k} of the given shape (float64), unit sigma."""
        w = self.noise.gaussian(tuple(shape), 1.0)
        if self.history and self.history[-1].shape != w.shape:
            raise PrivacyError(f"a correlated noise stream changed shape from {tuple(self.history[-1].shape)} "
                               f"to {tuple(w.shape)}")
        for k, prev in enumerate(reversed(self.history), start=1):
            if k < len(self.c) and self.c[k]:
                w = w - self.c[k] * prev
        h = 1.0 if not self.position else -sum(self.c[k] * prev for k, prev in enumerate(reversed(self._h), start=1))
        if len(self.c) > 1:
            self.history.append(w)
            self._h.append(h)
        self._var += h * h
        self.position += 1
        return w

    def marginal_std(self) -> float:
        """The std of the last draw's coordinates (unit sigma): sqrt(sum_{j <= t} h_j^2), public."""
        return math.sqrt(self._var)
