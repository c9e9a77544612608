"""The releases of a mean of per-user vectors, one sum per user and round (DP-PG): the Gaussian sum, with noise
correlated across rounds as an option (``dppo.privacy.correlated``), its multi-pass (Poisson) variant, and the
plain mean of the non-private twin; ``sum_mechanism`` picks one from the privacy context, so the learner's
update is the same code either way. Per-user clipping and what every release shares: ``dppo.privacy.release``."""
from __future__ import annotations

import torch

from dppo.errors import ConfigError
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.correlated import CorrelatedNoise, NoiseStream, correlation_of, stream_fields
from dppo.privacy.factorizations import stream_sensitivity
from dppo.privacy.release import FUSED_MARGIN, Release, clip_per_user, clip_scale  # noqa: F401 - re-exported


class ClippedSumRelease(Release):
    """What DP-PG's releases share (``dppo.privacy.release.Release``): the release from the sum of the m users'
    vectors already scaled by ``clip_scale``'s factors (a clipped sum formed elsewhere: the fused path of
    ``dppo.policies.per_user_grads``), with the same sensitivity, noise and record as ``release_mean``
    (``_from_clipped_sum``)."""

    def release_clipped_sum(self, clipped_sum: torch.Tensor, norms: torch.Tensor, round_idx: int
                            ) -> tuple[torch.Tensor, dict]:
        if self.shards is not None:
            raise ValueError("a sharded release gathers the clipped rows: use release_mean")
        return self._from_clipped_sum(clipped_sum.double(), norms, round_idx)


class GaussianSumPrivatizer(ClippedSumRelease):
    """Releases the mean of m clipped per-user vectors with Gaussian noise: (eps, delta)-DP per call.

    Replace-one sensitivity of the *sum*: two users' clipped vectors u, u' differ by at most
    ||u - u'|| <= 2 C, so sigma = analytic_gaussian_sigma(eps, delta, 2 C) (Balle & Wang 2018). The
    ledger's ``noise_multiplier`` is sigma / sensitivity = sigma / (2 C), the standard multiplier of
    a Gaussian mechanism; ``clip`` records C.
    """

    mechanism = "gaussian_sum"
    private = True

    def __init__(self, privacy, max_grad_norm: float):
        self.privacy = privacy
        self.max_grad_norm = float(max_grad_norm)

    def sensitivity(self) -> float:
        return 2.0 * self.max_grad_norm

    def sigma(self, eps: float | None = None) -> float:
        return analytic_gaussian_sigma(eps or self.privacy.eps, self.privacy.delta, self.sensitivity())

    def noise_std(self, clip: float | None = None, part=None) -> float:
        """sigma: every release draws fresh N(0, sigma^2 I)."""
        return self.sigma()

    def release_mean(self, per_user: torch.Tensor, round_idx: int, *, sigma: float | None = None,
                     extra: dict | None = None) -> tuple[torch.Tensor, dict]:
        """Clip rows to C, sum, add N(0, sigma^2 I), divide by m; records the release. Returns (mean, stats)."""
        clipped, norms = clip_per_user(per_user, self.max_grad_norm)
        if self.shards is not None:
            return self.shards.release(clipped, norms, lambda c, n: self._release(c, n, round_idx, sigma, extra))
        return self._release(clipped, norms, round_idx, sigma, extra)

    def _from_clipped_sum(self, total, norms, round_idx) -> tuple[torch.Tensor, dict]:
        return self._release_sum(total, norms, int(norms.shape[0]), round_idx, None, None)  # sensitivity 2C

    def _release(self, clipped, norms, round_idx, sigma, extra) -> tuple[torch.Tensor, dict]:
        return self._release_sum(clipped.sum(0), norms, clipped.shape[0], round_idx, sigma, extra)

    def _release_sum(self, total, norms, m, round_idx, sigma, extra) -> tuple[torch.Tensor, dict]:
        sigma = self.sigma() if sigma is None else sigma
        noise = self.privacy.noise.gaussian(total.shape, sigma)
        self.privacy.release(self.mechanism, round=round_idx, users=m, eps=self.privacy.eps,
                             delta=self.privacy.delta, sigma=sigma, sensitivity=self.sensitivity(),
                             noise_multiplier=sigma / self.sensitivity(), adjacency="replace_one",
                             dim=int(total.shape[0]), clip=self.max_grad_norm, **(extra or {}))
        stats = {"privacy/noise_multiplier": sigma / self.sensitivity(),
                 "diag/clip_fraction": float((norms > self.max_grad_norm).double().mean()) if m else 0.0,
                 "privacy/noise_std": sigma / max(m, 1)}
        return (total + noise) / max(m, 1), stats


class CorrelatedGaussianSum(GaussianSumPrivatizer):
    """DP-PG's release with correlated noise across rounds: one user in one release (module docstring).

    sigma = analytic_gaussian_sigma(eps, delta, 2 C ||c||): the stream is (eps, delta)-DP in every user."""

    mechanism = "correlated_gaussian_sum"

    def __init__(self, privacy, max_grad_norm: float, correlation: CorrelatedNoise, rounds: int):
        super().__init__(privacy, max_grad_norm)
        self.correlation = correlation
        self.coefficients = correlation.coefficients(rounds, participations=1)
        self.stream = NoiseStream(self.coefficients, privacy.noise)

    def sensitivity(self) -> float:
        """2 C max_i ||C_i|| = 2 C ||c|| (one participation, ``dppo.privacy.factorizations``)."""
        return stream_sensitivity(self.coefficients, self.max_grad_norm, 1)

    def noise_std(self, clip: float | None = None, part=None) -> float:
        """sigma times the std of the stream's last draw (the row norm of C^{-1}: ``NoiseStream.marginal_std``)."""
        return self.sigma() * self.stream.marginal_std()

    def _release_sum(self, total, norms, m, round_idx, sigma, extra) -> tuple[torch.Tensor, dict]:
        sigma = self.sigma() if sigma is None else sigma
        self.stream.begin(round_idx, self.privacy)
        self.privacy.release(self.mechanism, round=round_idx, users=m, eps=self.privacy.eps,
                             delta=self.privacy.delta, sigma=sigma, sensitivity=self.sensitivity(),
                             noise_multiplier=sigma / self.sensitivity(), gdp_mu=self.sensitivity() / sigma,
                             adjacency="replace_one", dim=int(total.shape[0]), clip=self.max_grad_norm,
                             **stream_fields(self.correlation, self.coefficients, self.stream), **(extra or {}))
        noise = self.stream.scaled(total.shape, sigma)
        std = sigma * self.stream.marginal_std()
        stats = {"privacy/noise_multiplier": sigma / self.sensitivity(),
                 "diag/clip_fraction": float((norms > self.max_grad_norm).double().mean()) if m else 0.0,
                 "privacy/noise_std": std / max(m, 1)}
        return (total + noise) / max(m, 1), stats


class PoissonGaussianSumPrivatizer(ClippedSumRelease):
    """Multi-pass (opt-in) release: users Poisson-sampled at rate q from a finite population, clipped
    sum + N(0, (z C)^2 I) divided by the expected batch q N (Opacus' DP-SGD step).

    Adjacency is add/remove-one-user (Opacus' analysis), so the sum's sensitivity is C; the noise
    multiplier z is the smallest meeting (eps, delta) after ``rounds`` releases under the RDP/PRV
    accountant, which composes the ledger entries this records.
    """

    mechanism = "poisson_gaussian_sum"
    private = True

    def __init__(self, privacy, max_grad_norm: float, sample_rate: float, population_size: int, rounds: int):
        from dppo.privacy.accountants.opacus import multi_pass_noise_multiplier

        self.privacy = privacy
        self.max_grad_norm = float(max_grad_norm)
        self.sample_rate = float(sample_rate)
        self.expected_users = self.sample_rate * population_size
        self.noise_multiplier = multi_pass_noise_multiplier(privacy.eps, privacy.delta, self.sample_rate, rounds,
                                                            privacy.accountant.name)

    def noise_std(self, clip: float | None = None, part=None) -> float:
        """z C (the noise of the sum; the mean divides it by the expected batch q N)."""
        return self.noise_multiplier * self.max_grad_norm

    def release_mean(self, per_user: torch.Tensor, round_idx: int) -> tuple[torch.Tensor, dict]:
        """Clip rows to C, sum, add noise, divide by the expected batch size; records the release."""
        clipped, norms = clip_per_user(per_user, self.max_grad_norm)
        if self.shards is not None:
            return self.shards.release(clipped, norms, lambda c, n: self._release(c, n, round_idx))
        return self._release(clipped, norms, round_idx)

    def _from_clipped_sum(self, total, norms, round_idx) -> tuple[torch.Tensor, dict]:
        return self._release_sum(total, norms, round_idx)

    def _release(self, clipped, norms, round_idx) -> tuple[torch.Tensor, dict]:
        return self._release_sum(clipped.sum(0), norms, round_idx)

    def _release_sum(self, total, norms, round_idx) -> tuple[torch.Tensor, dict]:
        C = self.max_grad_norm
        sigma = self.noise_multiplier * C
        noise = self.privacy.noise.gaussian(total.shape, sigma)
        self.privacy.release(self.mechanism, round=round_idx, users=round(self.expected_users), eps=None, delta=None,
                             sigma=sigma, noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate,
                             sensitivity=C, adjacency="add_remove", dim=int(total.shape[0]), clip=C)
        stats = {"privacy/noise_multiplier": self.noise_multiplier,
                 "diag/clip_fraction": float((norms > C).double().mean()) if len(norms) else 0.0}
        return (total + noise) / self.expected_users, stats


class MeanRelease(ClippedSumRelease):
    """The non-private twin's "release": the mean of the per-user vectors clipped to the same C as the
    private release (the twins differ by the noise only); no noise, nothing recorded."""

    mechanism = "none"

    def __init__(self, max_grad_norm: float):
        self.max_grad_norm = float(max_grad_norm)

    def release_mean(self, per_user: torch.Tensor, round_idx: int) -> tuple[torch.Tensor, dict]:
        clipped, norms = clip_per_user(per_user, self.max_grad_norm)
        if self.shards is not None:
            return self.shards.release(clipped, norms, self._mean)
        return self._mean(clipped, norms)

    def _from_clipped_sum(self, total, norms, round_idx) -> tuple[torch.Tensor, dict]:
        return self._mean_of(total, norms)

    def _mean(self, clipped, norms) -> tuple[torch.Tensor, dict]:
        return self._mean_of(clipped.sum(0), norms)

    def _mean_of(self, total, norms) -> tuple[torch.Tensor, dict]:
        frac = float((norms > self.max_grad_norm).double().mean()) if len(norms) else 0.0
        return total / max(int(norms.shape[0]), 1), {"diag/clip_fraction": frac}


def sum_mechanism(privacy, max_grad_norm: float, sampler=None, rounds: int = 1):
    """The release of a mean of per-user vectors for this privacy context: the Gaussian sum (one pass; with
    ``privacy.noise_correlation`` its noise correlated across the ``rounds`` releases), its Poisson variant
    (``privacy.multi_pass``), or the plain mean when ``eps`` is null."""
    if not privacy.private:
        return MeanRelease(max_grad_norm)
    correlation = getattr(privacy, "noise_correlation", None)
    if privacy.multi_pass:
        if correlation is not None:
            raise ConfigError("privacy.noise_correlation needs one-pass users: set privacy.multi_pass=false or "
                              "privacy.noise_correlation=none")
        return PoissonGaussianSumPrivatizer(privacy, max_grad_norm, sampler.sample_rate, sampler.population_size,
                                            rounds)
    if correlation is not None:  # correlated noise across rounds (dppo.privacy.correlated)
        return CorrelatedGaussianSum(privacy, max_grad_norm, correlation_of(privacy), rounds)
    return GaussianSumPrivatizer(privacy, max_grad_norm)
