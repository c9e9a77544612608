"""Banded Toeplitz factorizations for correlated noise across a stream of releases (DP-FTRL style).

The stream. A learner releases noisy sums x_1, x_2, ... (one per round for DP-PG, ``epochs x minibatches`` per
round and part for DP-PPO). A factorization is a lower-triangular Toeplitz matrix C with coefficients
c_0 = 1, c_1, ..., c_{b-1} on its first b diagonals (b = ``bands``, zero below). The matrix mechanism releases
C x + sigma z (z ~ N(0, I), one row per release, each row as wide as a release), which a learner reads as

    x_hat = C^{-1} (C x + sigma z) = x + sigma C^{-1} z,

one noisy sum per release whose noise is correlated across releases (``dppo.privacy.correlated`` draws it
recursively). With C = I (b = 1) this is independent noise. The workload a learner applies to the released
sums is A (lower-triangular Toeplitz with coefficients a_j): prefix sums for SGD (a_j = 1: the iterate is the
initial point minus lr times the sum of the released gradients) and, for SGD with momentum beta,
a_j = (1 - beta^{j+1}) / (1 - beta). Its noise is sigma A C^{-1} z, with the Toeplitz coefficients
g = a * h of A C^{-1} (h: the coefficients of C^{-1}, the power series 1 / c(x)), so the total squared error
over a stream of T releases is sigma^2 sum_{j<T} (T - j) g_j^2 per coordinate.

Sensitivity (replace-one, derived here and tested by brute force in tests/privacy/test_factorizations.py).
Replacing one user changes its clipped vector in each release it takes part in by some delta_i with
||delta_i|| <= 2 C_clip (``dppo.privacy.composed``). If the user takes part in the set S of releases
(columns of C), C x changes by sum_{i in S} C_i delta_i^T, whose squared Frobenius norm is

    sum_{i, j in S} <C_i, C_j> <delta_i, delta_j>  <=  (2 C_clip)^2  sum_{i, j in S} |<C_i, C_j>|.

For banded Toeplitz C, <C_i, C_j> = sum_k c_k c_{k+l} over the rows the two columns share (l = |i - j|);
columns near the end of a finite (or restarted) stream are truncated, so |<C_i, C_j>| <= g^_l =
sum_k |c_k c_{k+l}| in every case. With g*_l = max_{l' >= l} g^_l' (the non-increasing envelope;
g*_0 = g^_0 = ||c||^2 by Cauchy-Schwarz) and S sorted s_1 < ... < s_E, s_q - s_p >= q - p, hence

    sum_{i, j in S} |<C_i, C_j>|  <=  B_E(c) = E ||c||^2 + 2 sum_{l=1}^{E-1} (E - l) g*_l,

for every set S of E releases, every stream length and every restart of the stream. One participation
(DP-PG: each user in exactly one round, one release): B_1 = ||c||^2, the largest column norm of C squared,
exactly. E participations (DP-PPO: E = ``epochs`` releases of a part per user): exact (attained, with all
delta_i equal) when c >= 0 entrywise, g^ non-increasing and the E releases consecutive (one minibatch per
epoch) in the interior of the stream; an upper bound otherwise. The optimized factorizations below keep
c >= 0. The sensitivity is 2 C_clip sqrt(B_E(c)); the stream is then one Gaussian mechanism in each user
with mu = 2 C_clip sqrt(B_E) / sigma in Gaussian DP, and adaptively chosen inputs keep this for
lower-triangular C (Denisov et al. 2022, Thm 2.1).

Factorizations (``KINDS``):

- ``banded``: c_1..c_{b-1} >= 0 minimizing B_E(c) sum_j (T - j) g_j^2 (the workload's total squared error at a
  fixed (eps, delta), since sigma is proportional to sqrt(B_E)) for the planned horizon T (Choquette-Choo et al.
  2023, banded matrix factorization); the horizon only changes how good the noise is, never the guarantee.
- ``banded_sqrt``: the Toeplitz square root of the prefix-sum matrix, c_j = binom(2j, j) / 4^j, truncated to
  b bands (a baseline that needs no optimization; Fichtenberger et al. 2023, Henzinger et al. 2023).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy.optimize import minimize

from dppo.errors import ConfigError
# c_j = binom(2j, j) / 4^j, j < bands: the Toeplitz square root of the prefix-sum matrix (one home: the counters')
from dppo.privacy.counter_factorizations import sqrt_coefficients  # noqa: F401 - re-exported

KINDS = ("banded", "banded_sqrt")
MAX_HORIZON = 1024   # the optimization's horizon is capped here (the guarantee never depends on it)


def workload_coefficients(horizon: int, momentum: float = 0.0) -> np.ndarray:
    """a_j, j < horizon: 1 (prefix sums, SGD) or (1 - beta^{j+1}) / (1 - beta) (SGD with momentum beta)."""
    j = np.arange(int(horizon), dtype=np.float64)
    beta = float(momentum)
    return np.ones_like(j) if beta == 0 else (1.0 - beta ** (j + 1)) / (1.0 - beta)


def inverse_coefficients(c, horizon: int) -> np.ndarray:
    """h_j, j < horizon: the Toeplitz coefficients of C^{-1}, i.e. the power series 1 / c(x) (c_0 = 1):
    h_0 = 1, h_t = -sum_{k=1}^{min(b-1, t)} c_k h_{t-k}."""
    c = np.asarray(c, dtype=np.float64)
    if c[0] != 1.0:
        raise ConfigError(f"a factorization's first coefficient must be 1, got {c[0]}")
    h = np.zeros(int(horizon))
    h[0] = 1.0
    for t in range(1, int(horizon)):
        k = min(len(c) - 1, t)
        h[t] = -float(np.dot(c[1:k + 1], h[t - 1::-1][:k]))
    return h


def gram_envelope(c) -> np.ndarray:
    """g*_l, l < len(c): the non-increasing envelope of g^_l = sum_k |c_k c_{k+l}| (module docstring)."""
    a = np.abs(np.asarray(c, dtype=np.float64))
    g = np.array([float(np.dot(a[:len(a) - l], a[l:])) for l in range(len(a))])
    return np.maximum.accumulate(g[::-1])[::-1]


def participation_norm_sq(c, participations: int) -> float:
    """B_E(c) = E ||c||^2 + 2 sum_{l=1}^{E-1} (E - l) g*_l: the bound on sum_{i,j in S} |<C_i, C_j>| over every
    set S of E = ``participations`` releases (module docstring)."""
    E = int(participations)
    if E < 1:
        raise ConfigError(f"participations must be >= 1, got {participations}")
    g = gram_envelope(c)
    return float(E * g[0] + 2 * sum((E - l) * g[l] for l in range(1, min(E, len(g)))))


def stream_sensitivity(c, clip: float, participations: int = 1) -> float:
    """Replace-one l2 sensitivity of C x for a user in ``participations`` releases clipped to ``clip``:
    2 clip sqrt(B_E(c))."""
    return 2.0 * float(clip) * math.sqrt(participation_norm_sq(c, participations))


def prefix_error_variances(c, horizon: int, momentum: float = 0.0) -> np.ndarray:
    """Per coordinate and for unit sigma, the variance of the workload's noise after each release t < horizon:
    sum_{j <= t} g_j^2 with g = a * h (the coefficients of A C^{-1})."""
    h = inverse_coefficients(c, horizon)
    g = np.convolve(workload_coefficients(horizon, momentum), h)[:int(horizon)]
    return np.cumsum(g ** 2)


def marginal_variances(c, horizon: int) -> np.ndarray:
    """Var of release t's own noise (C^{-1} z)_t for unit sigma, t < horizon: sum_{j <= t} h_j^2."""
    return np.cumsum(inverse_coefficients(c, horizon) ** 2)


def relative_error(c, horizon: int, participations: int = 1, momentum: float = 0.0) -> float:
    """RMS over the stream of the workload's noise std at a fixed (eps, delta), relative to independent noise
    (c = [1]) for the same participations: sqrt(B_E(c) sum_t var_t(c) / (B_E(1) sum_t var_t(1)))."""
    ours = participation_norm_sq(c, participations) * prefix_error_variances(c, horizon, momentum).sum()
    base = participation_norm_sq([1.0], participations) * prefix_error_variances([1.0], horizon, momentum).sum()
    return math.sqrt(ours / base)


def _loss_torch(free: torch.Tensor, horizon: int, participations: int, A: torch.Tensor) -> torch.Tensor:
    """B_E(c) sum_j (T - j) g_j^2 / T for c = (1, free) >= 0 (then g^ is the Gram sequence itself)."""
    c = torch.cat([torch.ones(1, dtype=torch.float64), free])
    b, T, E = len(c), horizon, participations
    C = sum(c[k] * torch.diag(torch.ones(T - k, dtype=torch.float64), -k) for k in range(b))
    e0 = torch.zeros(T, 1, dtype=torch.float64)
    e0[0] = 1.0
    h = torch.linalg.solve_triangular(C, e0, upper=False)
    g = (A @ h)[:, 0]
    err = ((T - torch.arange(T, dtype=torch.float64)) * g ** 2).sum()
    gram = torch.stack([torch.dot(c[:b - l], c[l:]) for l in range(b)])
    env = gram.flip(0).cummax(0).values.flip(0)
    bound = E * gram[0] + 2 * sum((E - l) * env[l] for l in range(1, min(E, b)))
    return bound * err / T


@functools.lru_cache(maxsize=64)
def _optimized(bands: int, horizon: int, participations: int, momentum: float) -> tuple[float, ...]:
    a = workload_coefficients(horizon, momentum)
    A = torch.from_numpy(np.tril(a[np.subtract.outer(np.arange(horizon), np.arange(horizon)).clip(0)]))
    x0 = sqrt_coefficients(bands)[1:]

    def fun(x):
        free = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        loss = _loss_torch(free, horizon, participations, A)
        loss.backward()
        return float(loss.detach()), free.grad.numpy().copy()

    res = minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=[(0.0, None)] * len(x0),
                   options={"maxiter": 200, "ftol": 1e-12})
    best = res.x if res.fun <= fun(x0)[0] else x0
    return (1.0, *map(float, best))


def factorization(kind: str, bands: int, horizon: int = MAX_HORIZON, participations: int = 1,
                  momentum: float = 0.0) -> np.ndarray:
    """The coefficients c (c_0 = 1, len ``bands``) of the factorization ``kind`` (module docstring) for a stream
    of ``horizon`` releases (capped at ``MAX_HORIZON``), each user in ``participations`` of them, and the
    workload of SGD (``momentum`` 0) or SGD with momentum."""
    if kind not in KINDS:
        raise ConfigError(f"privacy.noise_correlation must be one of none, {', '.join(KINDS)}; got {kind!r}")
    if int(bands) < 1:
        raise ConfigError(f"privacy.bands must be >= 1, got {bands}")
    if not 0 <= float(momentum) < 1:
        raise ConfigError(f"the momentum of the noise's workload must lie in [0, 1), got {momentum}")
    horizon = max(2, min(int(horizon), MAX_HORIZON))
    bands = min(int(bands), horizon)
    if kind == "banded_sqrt" or bands == 1:
        return sqrt_coefficients(bands)
    c = np.array(_optimized(bands, horizon, int(participations), float(momentum)))
    # C^{-1}'s coefficients stay bounded past the horizon iff c(x) has no zero in the closed unit disc; positive
    # non-increasing coefficients (the square root's) always qualify (Enestrom-Kakeya)
    return c if is_stable(c) else sqrt_coefficients(bands)


def is_stable(c) -> bool:
    """True when every zero of c(x) = sum_k c_k x^k lies outside the closed unit disc (the recursion of
    ``NoiseStream`` does not grow)."""
    c = np.trim_zeros(np.asarray(c, dtype=np.float64), "b")
    return len(c) == 1 or bool(np.abs(np.roots(c[::-1])).min() > 1.0 + 1e-9)
