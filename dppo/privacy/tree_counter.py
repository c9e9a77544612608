"""Continual counting by the binary-tree mechanism (Dwork et al. 2010; Chan, Shi & Song 2011), with
Laplace noise, vectorized over many counter streams.

Each stream receives one increment ``x_t in [0, Delta]`` per time step ``t = 1..T`` (most are 0) and
after every step the mechanism releases a noisy prefix sum ``c~(t) ~= sum_{tau <= t} x_tau``.

Mechanism. The dyadic node at level ``j`` ending at time ``e`` (``e`` a multiple of ``2^j``) holds the
sum of the ``2^j`` increments it covers plus its own Laplace(b) noise, drawn once when the node
closes. ``c~(t)`` is the sum of the nodes of the dyadic decomposition of ``[1, t]`` (one per set bit
of ``t``), i.e. ``c~(t) = c(t) + sum_{j in bits(t)} z_j``: we store the exact count and the noise of
the currently used nodes, which gives the same outputs as storing the noisy nodes.

Sensitivity (replace-one-user adjacency, one user = one time step). Replacing the increment of one
step changes each stream's ``x_t`` by at most ``Delta`` and ``x_t`` enters exactly one node per level,
``L = floor(log2 T) + 1`` levels, so the l1 change of a stream's node values is at most ``L Delta``;
Laplace noise of scale ``b = L Delta / eps_stream`` makes the whole released sequence of that stream
``eps_stream``-DP (Laplace mechanism, post-processing). If one user can change at most ``k`` streams,
the set of streams is ``k eps_stream``-DP (basic composition) - the caller records that.

Error. At time ``t`` the error is a sum of ``popcount(t) <= L`` i.i.d. Laplace(b) variables, bounded
with probability ``1 - beta`` by ``laplace_sum_bound`` (a Chernoff bound using the Laplace moment
generating function ``E exp(s Z) = 1 / (1 - s^2 b^2)``), plus ``Lambda/2`` from snapping (below).

Floating point (snapping, Mironov 2012). Adding float Laplace noise to an integer count leaks through
the low-order bits of the result (our audit measured eps_LB = 3.8 at claimed eps = 1 on raw float64
outputs). So the *released* value is ``clamp(round_Lambda(c(t) + noise), 0 - B, B)`` with ``Lambda`` the
smallest power of two >= b and ``B = T Delta`` (the largest possible count; T users): multiples of a power of
two >= the noise scale, as in the snapping mechanism, whose analysis charges the float rounding of the
noisy sum an eps increase of order ``B 2^-52 / b`` (negligible here). The exact noisy value
``counts + noise_total`` stays internal; on CPU it is snapped in place into ``noisy_counts`` at every step (one
array the size of the streams), and ``released`` is all a learner may read.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from dppo.errors import ConfigError, PrivacyError
from dppo.privacy.calibration import laplace_scale
from dppo.privacy.noise import PIECE


def tree_levels(capacity: int) -> int:
    """Number of tree levels ``L = floor(log2 T) + 1`` needed for ``T`` steps (each step is in L nodes)."""
    if capacity < 1:
        raise ConfigError(f"the counter capacity (number of time steps) must be >= 1, got {capacity}")
    return int(capacity).bit_length()


def laplace_sum_bound(k: int, scale: float, beta: float) -> float:
    """``lambda`` with ``P(|Z_1 + ... + Z_k| > lambda) <= beta`` for i.i.d. ``Z_i ~ Laplace(scale)``.

    Chernoff: ``P(Y > lambda) <= exp(-s lambda) (1 - s^2 b^2)^(-k)`` for ``0 < s < 1/b``; with both tails
    and ``x = s b``: ``lambda = b min_x [ln(2/beta) - k ln(1 - x^2)] / x``.
    """
    if k <= 0:
        return 0.0
    if not 0 < beta < 1:
        raise ConfigError(f"beta must lie in (0, 1), got {beta}")
    log_term = math.log(2.0 / beta)
    f = lambda x: (log_term - k * math.log1p(-x * x)) / x
    res = minimize_scalar(f, bounds=(1e-9, 1 - 1e-12), method="bounded", options={"xatol": 1e-10})
    return float(scale * res.fun)


def tree_error_bound(eps_stream: float, capacity: int, beta: float, *, streams: int = 1,
                     sensitivity: float = 1.0) -> float:
    """High-probability error of the tree counter, uniform over ``streams`` streams and all ``t <= T``.

    Union bound over ``streams * T`` (stream, time) pairs, each error a sum of at most ``L`` Laplaces:
    ``P(exists stream, t: |c~(t) - c(t)| > bound) <= beta``.
    """
    L = tree_levels(capacity)
    b = laplace_scale(eps_stream, L * sensitivity)
    return laplace_sum_bound(L, b, beta / (streams * capacity))


class _PendingNoise:
    """Pre-drawn node noise of a ``TreeCounter`` (``chunk`` rows, next row ``pos``) and the number of
    steps ``reserve`` announced that are not taken yet."""

    __slots__ = ("chunk", "pos", "planned")

    def __init__(self):
        self.chunk, self.pos, self.planned = None, 0, 0


class TreeCounter(torch.nn.Module):
    """Binary-tree continual counters for ``num_streams`` streams at once (state in buffers).

    Args:
        num_streams: number of independent counter streams.
        capacity: maximum number of time steps ``T`` (fixes the number of levels and so the noise).
        eps_stream: per-stream privacy; ``None`` turns the noise off (exact counts).
        sensitivity: ``Delta``, the largest increment of one stream in one step (increments are
            clipped to ``[0, Delta]``).
        noise: a ``dppo.privacy.noise.NoiseSource`` (required when ``eps_stream`` is set).
        max_chunk: largest number of noise values drawn at once (noise for several future steps is
            drawn in one call to cut per-step overhead; see ``reserve``).
        users: the largest number of users over all steps (``add`` puts several in one step); the
            released values are clamped to ``[-users Delta, users Delta]``. Default: ``capacity``.
    """

    def __init__(self, num_streams: int, capacity: int, eps_stream: float | None = None, *,
                 sensitivity: float = 1.0, noise=None, max_chunk: int = 1 << 22, snap: bool = True,
                 users: int | None = None):
        super().__init__()
        self.num_streams = int(num_streams)
        self.capacity = int(capacity)
        self.levels = tree_levels(capacity)
        self.sensitivity = float(sensitivity)
        self.eps_stream = None if eps_stream is None else float(eps_stream)
        if self.eps_stream is not None and noise is None:
            raise ConfigError("a private TreeCounter needs a NoiseSource")
        self.noise = noise
        # b = L * Delta / eps_stream: each increment enters L nodes (module docstring)
        self.scale = None if eps_stream is None else laplace_scale(self.eps_stream, self.levels * self.sensitivity)
        self.max_chunk = int(max_chunk)
        # snapping grid and clamp (module docstring): Lambda = 2^ceil(log2 b), B = T * Delta
        self.snap_grid = None if (self.scale is None or not snap) else 2.0 ** math.ceil(math.log2(self.scale))
        self.clamp_bound = (self.capacity if users is None else int(users)) * self.sensitivity
        n = self.num_streams
        self.register_buffer("counts", torch.zeros(n, dtype=torch.float64))
        self.register_buffer("t", torch.zeros((), dtype=torch.long))
        self.register_buffer("pending", torch.zeros(n, dtype=torch.float64))       # the open step (``add``)
        self.register_buffer("pending_users", torch.zeros((), dtype=torch.long))
        if self.scale is not None:
            self.register_buffer("noisy_counts", torch.zeros(n, dtype=torch.float64))
            self.register_buffer("level_noise", torch.zeros(self.levels, n, dtype=torch.float64))
            self.register_buffer("noise_total", torch.zeros(n, dtype=torch.float64))
        # pre-drawn noise for the next steps, consumed row by row, and the steps announced by reserve()
        # and not yet taken; a plain object, since torch.nn.Module.__setattr__ is slow on every step
        self._pending = _PendingNoise()

    @property
    def private(self) -> bool:
        return self.scale is not None

    @property
    def snap_error(self) -> float:
        """Largest change snapping makes to a released count: Lambda / 2 (0 without snapping)."""
        return 0.0 if self.snap_grid is None else self.snap_grid / 2

    @property
    def released(self) -> torch.Tensor:
        """The released counts ``c~(t)`` of every stream, snapped to the grid and clamped (the exact
        counts when the noise is off)."""
        if self.scale is None:
            return self.counts
        if self.snap_grid is None:
            return self.noisy_counts
        views = self._numpy_views()
        if views is not None:       # on CPU the release is snapped in place at every step (``_advance``)
            return self.noisy_counts
        g, bound = self.snap_grid, self.clamp_bound
        return torch.clamp(torch.round(self.noisy_counts / g) * g, -bound, bound)

    def error_bound(self, beta: float, uniform: bool = True) -> float:
        """Error bound holding w.p. ``1 - beta``: for one (stream, t) pair, or (``uniform``) for all
        streams and all ``t <= T`` at once. 0 when the noise is off."""
        if not self.private:
            return 0.0
        if uniform:
            return tree_error_bound(self.eps_stream, self.capacity, beta, streams=self.num_streams,
                                    sensitivity=self.sensitivity) + self.snap_error
        return laplace_sum_bound(self.levels, self.scale, beta) + self.snap_error

    def reserve(self, steps: int) -> None:
        """Announce ``steps`` upcoming steps so their node noise can be drawn in few calls; also
        recomputes the running noise total exactly (it is updated incrementally between calls).

        Call it at a round boundary with the round's number of steps: the chunk is then used up by
        the round's end, so checkpoints taken between rounds hold no pre-drawn noise.
        """
        pending = self._pending
        pending.planned = int(steps)
        pending.chunk, pending.pos = None, 0
        if self.private and self.num_streams > self.max_chunk:     # in place: no copy of the levels
            self.noise_total.zero_()
            t = int(self.t)
            for j in range(self.levels):
                if (t >> j) & 1:
                    self.noise_total.add_(self.level_noise[j])
        elif self.private:
            self.noise_total.copy_(self._exact_noise_total())

    def _exact_noise_total(self) -> torch.Tensor:
        t = int(self.t)
        rows = [j for j in range(self.levels) if (t >> j) & 1]
        if not rows:
            return torch.zeros_like(self.noise_total)
        return self.level_noise[rows].sum(0)

    def _numpy_views(self) -> dict | None:
        """NumPy views of the buffers on CPU (same memory; NumPy's per-call overhead is ~5x lower than
        torch's on these small per-step updates), rebuilt whenever a buffer was replaced; None off CPU."""
        bufs = self._buffers
        key = tuple([b.data_ptr() for b in bufs.values()])
        if self.__dict__.get("_views_key") != key:
            if self.counts.device.type != "cpu":
                return None
            self._views = {k: b.numpy() for k, b in bufs.items()}
            self._views_key = key
        return self._views

    def _next_noise(self, out: np.ndarray | None = None):
        """The next step's node noise; with more than ``max_chunk`` streams (CPU), drawn in pieces into ``out``
        (the state's row of the closing node)."""
        pending = self._pending
        n = self.num_streams
        if out is not None:
            for a in range(0, n, PIECE):
                b = min(n, a + PIECE)
                out[a:b] = self.noise.laplace((b - a,), self.scale).numpy()
            return out
        if pending.chunk is None or pending.pos >= pending.chunk.shape[0]:
            rows = max(1, min(pending.planned, self.max_chunk // max(1, self.num_streams)))
            chunk = self.noise.laplace((rows, self.num_streams), self.scale).to(self.counts.device)
            pending.chunk = chunk.numpy() if self.counts.device.type == "cpu" else chunk
            pending.pos = 0
        z = pending.chunk[pending.pos]
        pending.pos += 1
        return z

    def _user_increment(self, index, values) -> tuple[list, np.ndarray]:
        """One user's distinct stream indices and increments clipped to ``[0, Delta]``."""
        idx = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        if len(idx) != len(set(idx)):
            raise PrivacyError("a stream received two increments in one step; each user may add at most "
                               "Delta to a stream")
        cap = self.sensitivity
        if values is None:
            vals = np.full(len(idx), min(1.0, cap))
        else:
            vals = values.tolist() if isinstance(values, torch.Tensor) else values
            vals = np.minimum(np.maximum(np.asarray(vals, dtype=np.float64), 0.0), cap)   # clip to [0, Delta]
        return idx, vals

    def _next_t(self, views) -> int:
        t = (int(views["t"]) if views is not None else int(self.t)) + 1
        if t > self.capacity:
            raise PrivacyError(f"the tree counter was built for {self.capacity} steps; step {t} would break "
                               f"its privacy calibration")
        return t

    def step(self, index, values=None) -> None:
        """Feed one time step holding one user: ``values`` (default 1) added to streams ``index``, 0 to all
        others; then refresh ``released``.

        Args:
            index: distinct stream indices (list or LongTensor).
            values: increments, clipped to ``[0, Delta]``.

        Raises:
            PrivacyError: more than ``capacity`` steps (the noise was calibrated for ``T`` steps), a
                stream repeated within the step (its increment could exceed ``Delta``), or users left in
                the open step of ``add``.
        """
        views = self._numpy_views()
        if int(views["pending_users"] if views is not None else self.pending_users):
            raise PrivacyError("users were added to the open step; release it with close_step()")
        t = self._next_t(views)
        idx, vals = self._user_increment(index, values)
        self._advance(views, t, idx, vals)

    def add(self, index, values=None) -> None:
        """Add one user's increment (clipped to ``[0, Delta]`` on its own) to the open time step;
        ``close_step`` releases it. Replacing one of the step's users changes each stream's step increment
        by at most ``Delta``, so the calibration is that of one user per step (each user in one step only)."""
        idx, vals = self._user_increment(index, values)
        self.pending.index_add_(0, torch.tensor(idx, dtype=torch.long, device=self.pending.device),
                                torch.as_tensor(vals, dtype=torch.float64, device=self.pending.device))
        self.pending_users.add_(1)

    def close_step(self) -> None:
        """Release the open step (the users ``add``-ed since the last release) as one counter time step."""
        views = self._numpy_views()
        t = self._next_t(views)
        nz = torch.nonzero(self.pending).flatten()
        vals = self.pending[nz].clone()
        self.pending.zero_()
        self.pending_users.zero_()
        self._advance(views, t, nz.tolist(), vals.cpu().numpy())

    @property
    def steps_done(self) -> int:
        """Released time steps so far."""
        return int(self.t)

    def _advance(self, views, t: int, idx: list, vals: np.ndarray) -> None:
        """Add the (clipped) step increment, move the tree to step t and refresh the release."""
        cpu = views is not None
        if cpu:
            views["counts"][np.asarray(idx, dtype=np.int64)] += vals
            views["t"][()] = t
        else:
            self.counts.index_add_(0, torch.tensor(idx, device=self.counts.device),
                                   torch.tensor(vals, dtype=torch.float64, device=self.counts.device))
            self.t.fill_(t)
        if not self.private:
            return
        i = (t & -t).bit_length() - 1          # level of the node closing at t (lowest set bit)
        if cpu:
            levels, total = views["level_noise"], views["noise_total"]
            if i > 0 and self.num_streams > self.max_chunk:     # no temporary the size of the streams
                for j in range(i):
                    total -= levels[j]
                levels[:i] = 0.0
            elif i > 0:                         # its children (levels < i) leave the decomposition
                total -= levels[:i].sum(0)
                levels[:i] = 0.0
            if self.num_streams > self.max_chunk:   # level i is empty here (a higher node's close zeroed it)
                total += self._next_noise(out=levels[i])
            else:
                levels[i] = z = self._next_noise()
                total += z
            noisy = views["noisy_counts"]
            np.add(views["counts"], total, out=noisy)
            if self.snap_grid is not None:      # the release, in place (round half to even, as torch.round)
                g, bound = self.snap_grid, self.clamp_bound
                np.divide(noisy, g, out=noisy)
                np.round(noisy, out=noisy)
                np.multiply(noisy, g, out=noisy)
                np.maximum(noisy, -bound, out=noisy)
                np.minimum(noisy, bound, out=noisy)
        else:
            z = self._next_noise()
            if i > 0:
                self.noise_total.sub_(self.level_noise[:i].sum(0))
                self.level_noise[:i].zero_()
            self.level_noise[i].copy_(z)
            self.noise_total.add_(z)
            torch.add(self.counts, self.noise_total, out=self.noisy_counts)
        self._pending.planned = max(0, self._pending.planned - 1)
