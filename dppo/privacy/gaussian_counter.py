"""Continual counting with Gaussian noise, (eps, delta)-DP through zCDP, vectorized over many streams.

Each stream receives one increment per time step ``t = 1..T`` and after every step the mechanism
releases a noisy prefix sum ``c~(t) = c(t) + e(t)``. Both counters below are *matrix mechanisms*
(Li et al. 2015; Denisov, McMahan et al. 2022): with ``A`` the T x T prefix-sum matrix factored as
``A = B C`` (both lower triangular), they release ``y = B (C x + z) = A x + B z`` with
``z ~ N(0, sigma^2 I)`` per stream. Only ``A x`` (the exact counts) and ``B z`` (noise that does not
depend on the data) are ever formed.

Privacy (replace-one-user adjacency, one user = one time step). If replacing the user of step t
changes the increment vector over all streams by ``Delta_t`` with ``||Delta_t||_2 <= Delta`` (the
caller's joint L2 sensitivity, derived next to the caller), ``C x`` changes by ``C[:, t] (x) Delta_t``,
whose Frobenius norm is at most ``Delta * kappa`` with ``kappa = max_t ||C[:, t]||_2``. ``C x + z`` is
then a Gaussian mechanism with sensitivity ``Delta kappa``: ``rho = (Delta kappa)^2 / (2 sigma^2)``-zCDP
(Bun & Steinke 2016, Prop. 1.6), and ``y`` is a post-processing (``B`` is invertible). Adaptively
chosen increments (later users react to released counts) do not change this for lower-triangular
factorizations with Gaussian noise (Denisov et al. 2022, Thm 2.1). The caller composes its statistic
sets in zCDP and converts with ``dppo.privacy.accountants.zcdp``.

* ``GaussianTreeCounter``: the binary tree (Dwork et al. 2010; Chan et al. 2011): ``C`` stacks the
  ``L = floor(log2 T) + 1`` levels of dyadic nodes, each step is in one node per level, so
  ``kappa = sqrt(L)``; the release at t sums the ``popcount(t)`` nodes of the dyadic decomposition of
  [1, t]: ``Var e(t) = popcount(t) sigma^2``.
* ``SqrtFactorizationCounter``: ``B ~= C ~= A^(1/2)`` (Fichtenberger et al. 2023; Henzinger et al. 2023;
  exact ``A^(1/2)`` has Toeplitz coefficients ``binom(2k, k) / 4^k``). To generate ``B z``
  incrementally with O(d) state per stream, the decoder ``B`` is lower-triangular Toeplitz with
  coefficients ``b_0 = 1``, ``b_k = sum_i w_i theta_i^k`` (a d-term exponential sum fitted to
  ``binom(2k, k) / 4^k`` with ``w >= 0``; a buffered-linear-Toeplitz decoder, Dvijotham et al. 2024),
  and the encoder is *exactly* ``C = B^{-1} A`` (a power-series inversion, computed once for T):
  ``kappa = ||C[:, 1]||_2`` (the first column is the longest; Toeplitz) and
  ``Var e(t) = sigma^2 sum_{k < t} b_k^2``, both exact for the factorization we run.

* ``OptimizedFactorizationCounter``: for few steps (a learner's block releases, T <= ``DENSE_MAX_STEPS``), a
  dense lower-triangular ``C`` (unit column norms: ``kappa = 1``) optimized for a weighted mean of the release
  stds ``||B[t, :]||`` (``optimized_factorization``), ``B = A C^{-1}``; noise ``e(t) = B[t, :t] z[:t]`` from the
  stored past ``z``. Sensitivity for the learner's participation (one episode = one user, in exactly one
  block) and the exact covariance ``sigma^2 B B^T``: the class docstring.

The factorizations (``kappa``, ``var_factor`` and the decoders) are computed in
``dppo.privacy.counter_factorizations``; this module runs them on streams.

Error. ``e(t)`` is exactly ``N(0, var(t))``; ``gaussian_union_quantile`` gives the quantile that holds
uniformly over N releases w.p. ``1 - beta`` (union bound), so ``|e(t)| <= z_N sqrt(var(t))``.

Floating point. Releasing ``float(c + z)`` leaks the data through the low-order bits of the sum
(Mironov 2012: the set of representable values near ``c + z`` depends on ``c``; our audit measured it
for the Laplace tree). Here every increment is quantized to a power-of-two grid ``Lambda = 2^-16``
(rewards; counts are integers), so ``c(t)`` is an exact multiple of ``Lambda`` with fewer than 53
significant bits, and the release is ``c(t) + round_Lambda(e(t))``: an exact float addition of two
grid points, equal to ``round_Lambda(c(t) + e(t))`` - a post-processing of the real-valued Gaussian
mechanism. The data-dependent operation is exact, so the released bits carry nothing beyond the
ideal mechanism; the noise itself is the project's float64 Gaussian sampler (``privacy.noise``), data
independent. Rounding adds at most ``Lambda / 2`` to the error bound.
"""
from __future__ import annotations

import bisect
import math

import numpy as np
import torch
from scipy.special import ndtri
from scipy.stats import chi2

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy.counter_factorizations import optimized_factorization, sqrt_factorization, tree_var_factor
from dppo.privacy.counter_factorizations import DENSE_MAX_STEPS, sqrt_coefficients, sqrt_decoder  # noqa: F401 - re-exported
from dppo.privacy.noise import PIECE

GRID = 2.0 ** -16          # release / increment grid (module docstring, floating point)


def gaussian_union_quantile(beta: float, releases: float) -> float:
    """``z`` with ``P(max_i |Z_i| > z) <= beta`` for ``releases`` standard normals (two-sided union bound)."""
    if not 0 < beta < 1:
        raise ConfigError(f"beta must lie in (0, 1), got {beta}")
    return float(-ndtri(beta / (2.0 * max(1.0, float(releases)))))


def chi_union_quantile(beta: float, releases: float, dof: int) -> float:
    """``q`` with ``P(exists i: ||Z_i||_2 > q) <= beta`` for ``releases`` standard normal vectors of ``dof``
    coordinates each (union bound; ``||Z_i||_2^2`` is chi-square with ``dof`` degrees of freedom). For
    ``dof = 1`` this is ``gaussian_union_quantile``. A bound on the norm holds for every direction at once:
    ``|<Z_i, u>| <= q ||u||_2`` for all ``u``, including directions chosen after seeing the noise."""
    if not 0 < beta < 1:
        raise ConfigError(f"beta must lie in (0, 1), got {beta}")
    if dof == 1:
        return gaussian_union_quantile(beta, releases)
    return float(math.sqrt(chi2.isf(beta / max(1.0, float(releases)), int(dof))))


def sigma_for_rho(rho: float, sensitivity: float, kappa: float) -> float:
    """Node noise ``sigma`` making the counter ``rho``-zCDP: ``rho = (Delta kappa)^2 / (2 sigma^2)``."""
    if rho <= 0:
        raise ConfigError(f"rho must be > 0, got {rho}")
    return float(sensitivity * kappa / math.sqrt(2.0 * rho))


# ---- the counters ---------------------------------------------------------------------------------
class StreamRanges:
    """A per-stream value that is constant on contiguous ranges of streams (a group id, a noise multiplier):
    stream ``i`` with ``starts[g] <= i < starts[g + 1]`` has ``values[g]``. Held as G numbers instead of one
    number per stream, so a layout of 10^7 streams costs nothing here."""

    def __init__(self, starts, values, num_streams: int):
        self.starts = np.asarray(starts, np.int64)
        self.values = np.asarray(values)
        self.num_streams = int(num_streams)
        if self.starts.ndim != 1 or self.starts.size != self.values.size or self.starts.size == 0 \
                or self.starts[0] != 0 or (np.diff(self.starts) <= 0).any() or self.starts[-1] >= self.num_streams:
            raise ConfigError("stream ranges must start at 0 and increase strictly within the streams")
        self._bounds = self.starts.tolist()[1:]
        self._list = self.values.tolist()

    @classmethod
    def from_array(cls, per_stream) -> "StreamRanges | None":
        """The ranges of a per-stream array that is constant on contiguous runs; None if it has too many runs
        to be worth it (more than 1/8 of the streams)."""
        a = np.asarray(per_stream)
        if a.ndim != 1 or a.size == 0:
            return None
        starts = np.concatenate([[0], np.flatnonzero(a[1:] != a[:-1]) + 1])
        if starts.size > max(1, a.size // 8):
            return None
        return cls(starts, a[starts], a.size)

    def of(self, idx):
        """The value of every stream in ``idx`` (an integer array)."""
        return self.values[np.searchsorted(self.starts, idx, side="right") - 1]

    def of_one(self, i: int):
        return self._list[bisect.bisect_right(self._bounds, i)]

    def pieces(self, lo: int, hi: int):
        """``(a, b, value)`` for the ranges covering streams ``[lo, hi)``, clipped to it."""
        ends = self._bounds + [self.num_streams]
        for a, b, v in zip(self.starts.tolist(), ends, self._list):
            if b > lo and a < hi:
                yield max(a, lo), min(b, hi), v


class _GaussianCounter(torch.nn.Module):
    """Shared state and feeding of the Gaussian continual counters (CPU: NumPy views of the buffers).

    Args:
        num_streams: number of counter streams (all released with the same sigma).
        capacity: T, the number of steps the noise is calibrated for.
        sigma: per-unit noise ``sigma`` (``sigma_for_rho``); ``None`` = exact counts.
        noise: the privacy context's ``NoiseSource`` (required when ``sigma`` is set).
        groups: int array [num_streams], the group of every stream; ``group_mass`` [G]: the largest
            total increment of a group in one step. Each step's increments are clipped to
            ``[0, group_mass]`` and each group's sum scaled down to at most its mass, so any two
            valid increments differ by at most ``sqrt(sum_g 2 mass_g^2)`` in L2 (nonnegative vectors
            with ``||u||_1 <= M``: ``||u - u'||^2 <= ||u||^2 + ||u'||^2 <= 2 M^2``).
        stream_max: largest increment of one stream in one step (default: the largest group mass).
        stream_noise: optional per-stream multiplier ``c_i`` of the noise (node noise ``c_i sigma``; the
            caller's sensitivity must be the one of the data scaled by ``1 / c_i``); ``release_std`` is
            then the std of a stream with ``c_i = 1``.
    """

    kind = "gaussian"
    STORES_NOISE = True         # a ``noise_now`` buffer (the tree sums its levels into the release instead)

    def __init__(self, num_streams: int, capacity: int, sigma: float | None = None, *, noise=None,
                 groups=None, group_mass=None, stream_max: float | None = None, stream_noise=None,
                 max_chunk: int = 1 << 22):
        super().__init__()
        if capacity < 1:
            raise ConfigError(f"the counter capacity (number of time steps) must be >= 1, got {capacity}")
        self.num_streams, self.capacity = int(num_streams), int(capacity)
        self.sigma = None if sigma is None else float(sigma)
        if self.sigma is not None and noise is None:
            raise ConfigError("a private Gaussian counter needs a NoiseSource")
        self.noise = noise
        n = self.num_streams
        if groups is None:
            groups = StreamRanges([0], [0], n)
        elif not isinstance(groups, StreamRanges):
            groups = StreamRanges.from_array(np.asarray(groups, np.int64)) or np.asarray(groups, np.int64)
        self.groups = groups                # StreamRanges (contiguous groups, no per-stream array) or an array
        self.group_mass = np.array([1.0]) if group_mass is None else np.asarray(group_mass, np.float64)
        self.stream_max = float(self.group_mass.max() if stream_max is None else stream_max)
        self.max_chunk = int(max_chunk)
        self.stream_noise = None
        if stream_noise is not None:
            sn = stream_noise if isinstance(stream_noise, StreamRanges) else np.asarray(stream_noise, np.float64)
            vals = np.asarray(sn.values if isinstance(sn, StreamRanges) else sn, np.float64)
            if (not isinstance(sn, StreamRanges) and sn.shape != (n,)) or not (vals > 0).all() \
                    or not np.isfinite(vals).all():
                raise ConfigError(f"stream_noise must hold {n} positive finite multipliers")
            self.stream_noise = sn
        self.register_buffer("counts", torch.zeros(n, dtype=torch.float64))
        self.register_buffer("t", torch.zeros((), dtype=torch.long))
        self.register_buffer("pending", torch.zeros(n, dtype=torch.float64))       # the open step (``add``)
        self.register_buffer("pending_users", torch.zeros((), dtype=torch.long))
        if self.private:
            self.register_buffer("released_buf", torch.zeros(n, dtype=torch.float64))
            if self.STORES_NOISE:
                self.register_buffer("noise_now", torch.zeros(n, dtype=torch.float64))
        self._chunk, self._pos, self._planned = None, 0, 0

    @property
    def private(self) -> bool:
        return self.sigma is not None

    @property
    def kappa(self) -> float:
        """Largest column norm of the encoder C (the sensitivity multiplier)."""
        raise NotImplementedError

    def var_factor(self, t: int) -> float:
        """``Var e(t) / sigma^2`` of the release after t steps (0 at t = 0)."""
        raise NotImplementedError

    def release_std(self, t: int | None = None) -> float:
        """Exact standard deviation of the release error after t steps (default: now); 0 without noise."""
        if not self.private:
            return 0.0
        t = int(self._views()["t"]) if t is None else int(t)
        return self.sigma * math.sqrt(self.var_factor(t)) if t > 0 else 0.0

    def max_release_std(self) -> float:
        """Largest release standard deviation over t = 1..T."""
        raise NotImplementedError

    def error_bound(self, beta: float, releases: float, t: int | None = None) -> float:
        """``z_N std(t) + Lambda/2``: holds for all of ``releases`` releases with this std w.p. 1 - beta."""
        if not self.private:
            return 0.0
        return gaussian_union_quantile(beta, releases) * self.release_std(t) + GRID / 2

    def uniform_error_bound(self, beta: float, releases: float) -> float:
        """``z_N max_t std(t) + Lambda/2``: holds for ``releases`` releases at any t <= T w.p. 1 - beta."""
        if not self.private:
            return 0.0
        return gaussian_union_quantile(beta, releases) * self.max_release_std() + GRID / 2

    @property
    def released(self) -> torch.Tensor:
        """The released counts (exact counts when the noise is off)."""
        return self.released_buf if self.private else self.counts

    def reserve(self, steps: int) -> None:
        """Announce ``steps`` upcoming steps (their noise is drawn in few calls); call at round boundaries."""
        self._planned = int(steps)
        self._chunk, self._pos = None, 0

    def _views(self):
        bufs = self._buffers
        key = tuple(b.data_ptr() for b in bufs.values())
        if self.__dict__.get("_vkey") != key:
            if self.counts.device.type != "cpu":
                raise ConfigError("the Gaussian counters run on CPU (their state is small)")
            self._v = {k: b.numpy() for k, b in bufs.items()}
            self._vkey = key
        return self._v

    def _next_noise(self, out: np.ndarray) -> np.ndarray:
        """The next step's node noise ``z`` (one value per stream), written into ``out`` (a row of the state)."""
        d = self.__dict__               # plain attributes: skip torch.nn.Module.__setattr__ on every step
        n = self.num_streams
        if n > self.max_chunk:          # drawn in pieces straight into ``out`` (transients of PIECE values)
            for a in range(0, n, PIECE):
                b = min(n, a + PIECE)
                out[a:b] = self.noise.gaussian((b - a,), self.sigma).numpy()
            self._scale_streams(out, 0)
            return out
        if self._chunk is None or self._pos >= self._chunk.shape[0]:
            rows = max(1, min(self._planned, self.max_chunk // max(1, n)))
            d["_chunk"] = self.noise.gaussian((rows, n), self.sigma).numpy()
            self._scale_streams(self._chunk, 0)
            d["_pos"] = 0
        out[:] = self._chunk[self._pos]
        d["_pos"] = self._pos + 1
        return out

    def _scale_streams(self, noise: np.ndarray, lo: int) -> None:
        """Node noise ``c_i sigma`` (``stream_noise``; data independent), in place, on streams ``lo..``."""
        sn = self.stream_noise
        if sn is None:
            return
        if not isinstance(sn, StreamRanges):
            noise *= sn[lo:lo + noise.shape[-1]]
            return
        for a, b, c in sn.pieces(lo, lo + noise.shape[-1]):
            if c != 1.0:
                noise[..., a - lo:b - lo] *= c

    def clip_increment(self, idx, vals):
        """Enforce the sensitivity premise: values on the grid, in ``[0, min(mass, stream_max)]``, each
        group's sum <= its mass (scaled down if larger). Lists in, lists out for short steps (cheap)."""
        if isinstance(idx, list) and len(idx) <= 256:
            lists = self.__dict__.get("_lists")
            if lists is None:
                gr = self.groups
                lists = self._lists = (gr.of_one if isinstance(gr, StreamRanges) else gr.tolist().__getitem__,
                                       self.group_mass.tolist())
            group_of, mass = lists
            cap, floor, grid = self.stream_max, math.floor, GRID
            out, sums, groups = [], {}, {}
            for i, v in zip(idx, vals):
                g = groups[i] = group_of(i)
                v = min(max(float(v), 0.0), cap, mass[g])
                out.append(v)
                sums[g] = sums.get(g, 0.0) + v
            if any(sm > mass[g] for g, sm in sums.items()):
                out = [v * min(1.0, mass[groups[i]] / sums[groups[i]]) for i, v in zip(idx, out)]
            return [floor(v / grid) * grid for v in out]
        idx, vals = np.asarray(idx, np.int64), np.asarray(vals, np.float64)
        mass = self.group_mass
        g = self.groups.of(idx) if isinstance(self.groups, StreamRanges) else self.groups[idx]
        vals = np.minimum(np.maximum(vals, 0.0), np.minimum(mass[g], self.stream_max))
        sums = np.bincount(g, weights=vals, minlength=mass.size)
        scale = np.where(sums > mass, mass / np.maximum(sums, 1e-300), 1.0)
        vals = vals * scale[g]
        return np.floor(vals / GRID) * GRID          # down to the grid: stays within the mass

    def _user_increment(self, index, values) -> tuple[list, list]:
        """One user's (stream indices, clipped values); repeated streams are refused."""
        idx = index.tolist() if isinstance(index, (torch.Tensor, np.ndarray)) else list(index)
        if len(set(idx)) != len(idx):
            raise PrivacyError("a stream received two increments in one step; aggregate them first")
        if values is None:
            vals = [1.0] * len(idx)
        else:
            vals = values.tolist() if isinstance(values, (torch.Tensor, np.ndarray)) else list(values)
        return idx, self.clip_increment(idx, vals)

    def _next_t(self, v: dict) -> int:
        t = int(v["t"]) + 1
        if t > self.capacity:
            raise PrivacyError(f"the counter was built for {self.capacity} steps; step {t} would break its "
                               f"privacy calibration")
        return t

    def step(self, index, values=None) -> None:
        """Feed one time step holding one user (``values`` to streams ``index``, 0 elsewhere) and refresh
        ``released``."""
        v = self._views()
        if int(v["pending_users"]):
            raise PrivacyError("users were added to the open step; release it with close_step()")
        t = self._next_t(v)
        idx, vals = self._user_increment(index, values)
        v["counts"][idx] += np.asarray(vals, dtype=np.float64)
        v["t"][()] = t
        self._release(v, t)

    def add(self, index, values=None) -> None:
        """Add one user's increment to the open time step (clipped to the premise on its own); ``close_step``
        releases the step. A step may hold several users (a block of episodes): replacing one of them
        changes the step's summed increment by exactly what it changes that user's increment, so the
        sensitivity, ``kappa`` and the guarantee are those of one user per step; each user must enter
        one step only (the one-pass sampler)."""
        idx, vals = self._user_increment(index, values)
        v = self._views()
        v["pending"][idx] += np.asarray(vals, dtype=np.float64)     # grid points: exact sums
        v["pending_users"][()] += 1

    def close_step(self) -> None:
        """Release the open step (the users ``add``-ed since the last release) as one counter time step."""
        v = self._views()
        t = self._next_t(v)
        pend = v["pending"]
        nz = np.flatnonzero(pend)
        v["counts"][nz] += pend[nz]                  # exact (grid points)
        pend[nz] = 0.0
        v["pending_users"][()] = 0
        v["t"][()] = t
        self._release(v, t)

    @property
    def steps_done(self) -> int:
        """Released time steps so far."""
        return int(self._views()["t"])

    def _release(self, v: dict, t: int) -> None:
        if self.private:
            noise = self._advance_noise(v, t)
            out = v["released_buf"]
            np.divide(noise, GRID, out=out)
            np.round(out, out=out)
            out *= GRID
            out += v["counts"]                      # exact: both are grid points (module docstring)
            self.__dict__["_planned"] = max(0, self._planned - 1)      # (plain attribute, per step)

    def _advance_noise(self, v: dict, t: int) -> np.ndarray:
        """Draw step t's node noise (``_next_noise``) into the state; return the release noise ``e(t)`` (may be
        ``released_buf`` itself)."""
        raise NotImplementedError


class GaussianTreeCounter(_GaussianCounter):
    """Binary-tree continual counter with Gaussian node noise (module docstring): ``kappa = sqrt(L)``,
    ``Var e(t) = popcount(t) sigma^2``."""

    kind = "gaussian_tree"

    def __init__(self, num_streams: int, capacity: int, sigma: float | None = None, **kw):
        super().__init__(num_streams, capacity, sigma, **kw)
        self.levels = int(capacity).bit_length()
        if self.private:
            self.register_buffer("level_noise", torch.zeros(self.levels, self.num_streams, dtype=torch.float64))

    STORES_NOISE = False

    @property
    def noise_now(self) -> torch.Tensor:
        """The current release noise ``e(t)``: the sum of the levels (not stored)."""
        return self.level_noise.sum(0)

    @property
    def kappa(self) -> float:
        return math.sqrt(self.levels)

    def var_factor(self, t: int) -> float:
        return tree_var_factor(t)

    def max_release_std(self) -> float:
        return 0.0 if not self.private else self.sigma * math.sqrt(self.levels if self.capacity >= 2 ** self.levels - 1
                                                                    else self.levels - 1)

    def _advance_noise(self, v, t):
        i = (t & -t).bit_length() - 1               # the node closing at t; its children leave [1, t]
        levels = v["level_noise"]
        levels[:i] = 0.0
        self._next_noise(levels[i])
        return levels.sum(0, out=v["released_buf"])     # unused levels are 0: the sum over set bits of t


class SqrtFactorizationCounter(_GaussianCounter):
    """Square-root factorization counter (module docstring): ``e(t) = sum_{k<t} b_k z_{t-k}`` generated by
    ``d`` exponentially decaying buffers per stream, ``s_i(t) = theta_i (s_i(t-1) + z_{t-1})``,
    ``e(t) = z_t + sum_i w_i s_i(t)``; ``kappa`` is the exact column norm of ``C = B^{-1} A``."""

    kind = "gaussian_sqrt"

    def __init__(self, num_streams: int, capacity: int, sigma: float | None = None, **kw):
        super().__init__(num_streams, capacity, sigma, **kw)
        f = sqrt_factorization(self.capacity)
        self.theta, self.w = f["theta"], f["w"]
        self._kappa, self._var, self._b, self._c = f["kappa"], f["var_factor"], f["b"], f["c"]
        if self.private:
            d = self.theta.size
            self.register_buffer("decay_state", torch.zeros(d, self.num_streams, dtype=torch.float64))
            self.register_buffer("z_prev", torch.zeros(self.num_streams, dtype=torch.float64))
        self._theta_col = self.theta[:, None]

    @property
    def kappa(self) -> float:
        return self._kappa

    def var_factor(self, t: int) -> float:
        return float(self._var[int(t) - 1]) if t > 0 else 0.0

    def max_release_std(self) -> float:
        return 0.0 if not self.private else self.sigma * math.sqrt(float(self._var[-1]))

    def _advance_noise(self, v, t):
        s, zp = v["decay_state"], v["z_prev"]
        s += zp
        s *= self._theta_col
        np.dot(self.w, s, out=v["noise_now"])
        v["noise_now"] += self._next_noise(zp)      # z_t, kept as the next step's z_prev
        return v["noise_now"]


class OptimizedFactorizationCounter(_GaussianCounter):
    """A dense lower-triangular factorization optimized for the counter's few steps (``optimized_factorization``).

    Derivation. The counter releases ``y = A x + B z`` with ``A = B C`` lower triangular and ``z ~ N(0,
    sigma^2 I)`` per stream, i.e. a post-processing of ``C x + z``. Participation: one user = one episode, and
    the learner's block releases put every episode in exactly one counter step j (one-pass sampler; the
    schedule is public). Replacing the user of step j changes the increment matrix ``X`` [T, streams] in row j
    only, by ``Delta_j`` with ``||Delta_j||_2 <= Delta`` (the layout's joint L2 sensitivity), so ``C X``
    changes by the outer product ``C[:, j] Delta_j^T`` with Frobenius norm ``||C[:, j]||_2 ||Delta_j||_2 <=
    kappa Delta``, ``kappa = max_j ||C[:, j]||_2`` (1 up to rounding here: the optimizer normalizes every
    column). ``C X + Z`` is the Gaussian mechanism with L2 sensitivity ``Delta kappa``: ``rho = (Delta
    kappa)^2 / (2 sigma^2)`` zCDP; adaptively chosen increments keep it (lower-triangular ``C``, Denisov et al.
    2022, Thm 2.1). Error: ``e(t) = B[t, :t] z[:t]`` is exactly ``N(0, sigma^2 ||B[t, :]||^2)`` per stream
    (``var_factor``), independent across streams; its covariance over t is ``sigma^2 B B^T``.

    The weights say which releases matter: ``row_weights`` (None: uniform) concentrates the accuracy on
    them at the expense of the others (a learner can set 0 on releases whose counts cannot be read). State:
    the drawn ``z`` of every past step (``capacity x streams``), so it is for few steps (block releases).
    """

    kind = "gaussian_opt"

    def __init__(self, num_streams: int, capacity: int, sigma: float | None = None, *, row_weights=None, **kw):
        super().__init__(num_streams, capacity, sigma, **kw)
        self.row_weights = None if row_weights is None else tuple(float(x) for x in row_weights)
        if self.private:
            f = optimized_factorization(self.capacity, self.row_weights)
            self._B, self._kappa, self._var = f["B"], f["kappa"], f["var_factor"]
            self.register_buffer("z_hist", torch.zeros(self.capacity, self.num_streams, dtype=torch.float64))
        else:
            self._B, self._kappa, self._var = None, 1.0, None

    @property
    def kappa(self) -> float:
        return self._kappa

    def var_factor(self, t: int) -> float:
        return float(self._var[int(t) - 1]) if t > 0 and self._var is not None else 0.0

    def max_release_std(self) -> float:
        return 0.0 if not self.private else self.sigma * math.sqrt(float(self._var.max()))

    def _advance_noise(self, v, t):
        hist = v["z_hist"]
        self._next_noise(hist[t - 1])
        np.dot(self._B[t - 1, :t], hist[:t], out=v["noise_now"])
        return v["noise_now"]


COUNTERS = {"gaussian_tree": GaussianTreeCounter, "gaussian_sqrt": SqrtFactorizationCounter,
            "gaussian_opt": OptimizedFactorizationCounter}
GAUSSIAN_ALIASES = {"gaussian": "gaussian_sqrt"}     # the best Gaussian counter we have (smaller error than the tree)
