"""The factorizations ``A = B C`` of the T x T prefix-sum matrix that the Gaussian continual counters run.

What each counter of ``dppo.privacy.gaussian_counter`` needs from its factorization, computed once per
capacity T (cached): the sensitivity multiplier ``kappa = max_t ||C[:, t]||_2`` and the release variances
``var_factor[t-1] = ||B[t-1, :]||^2`` (in units of sigma^2), both of the factorization that runs.

* the binary tree: ``Var e(t) = popcount(t) sigma^2`` (``tree_var_factor``; ``kappa = sqrt(levels)``);
* the square root ``B ~= C ~= A^(1/2)`` with an exponential-sum decoder (``sqrt_decoder``: ``b_k = sum_i
  w_i theta_i^k`` fitted to ``binom(2k, k) / 4^k``, so the noise is generated with O(d) state per stream)
  and the exact encoder ``C = B^{-1} A`` (``sqrt_factorization``);
* a dense lower-triangular factorization optimized for few steps (``optimized_factorization``,
  T <= ``DENSE_MAX_STEPS``).

The privacy argument (why ``kappa`` is the sensitivity multiplier) is the counters' module docstring.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy.optimize import nnls

from dppo.errors import ConfigError


# ---- the square-root factorization with an exponential-sum decoder ---------------------------------
def sqrt_coefficients(T: int) -> np.ndarray:
    """Toeplitz coefficients of ``A^(1/2)``: ``binom(2k, k) / 4^k``, k < T (``(1 - x)^(-1/2)``)."""
    k = np.arange(1, max(1, T), dtype=np.float64)
    return np.concatenate([[1.0], np.cumprod((2 * k - 1) / (2 * k))])[:T]


def _power_series_inverse(b: np.ndarray) -> np.ndarray:
    """``g`` with ``(b * g) mod x^T = 1`` (Newton iteration ``g <- g (2 - b g)``, FFT products)."""
    from scipy.signal import fftconvolve   # here: scipy.signal takes a second to import, and few runs need it

    T = b.size
    g = np.array([1.0 / b[0]])
    n = 1
    while n < T:
        n = min(2 * n, T)
        e = fftconvolve(b[:n], g)[:n]
        e[0] -= 2.0
        g = -fftconvolve(g, e)[:n]
    return g


@functools.lru_cache(maxsize=8)
def sqrt_decoder(T: int, terms_per_octave: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Fitted decoder ``(theta, w)``: ``b_k = sum_i w_i theta_i^k`` (k >= 1) ~= ``binom(2k,k)/4^k`` for
    k < T, relative least squares on log-spaced k, ``w >= 0`` (NNLS). Time scales ``tau_i`` from 1/2 to
    4T, ``terms_per_octave`` per factor 2; ``theta_i = exp(-1/tau_i)``."""
    octaves = math.log2(8 * max(T, 2))
    tau = 0.5 * 2.0 ** (np.arange(int(math.ceil(octaves * terms_per_octave)) + 1) / terms_per_octave)
    theta = np.exp(-1.0 / tau)
    k = np.unique(np.round(np.geomspace(1, max(T - 1, 1), 400)).astype(np.int64))
    target = sqrt_coefficients(int(k[-1]) + 1)[k]
    M = theta[None, :] ** k[:, None] / target[:, None]
    w, _ = nnls(M, np.ones(k.size), maxiter=50 * theta.size)
    keep = w > 0
    return theta[keep], w[keep]


@functools.lru_cache(maxsize=8)
def sqrt_factorization(T: int) -> dict:
    """The factorization the ``SqrtFactorizationCounter`` runs for capacity T (computed once per T):
    decoder ``theta, w``; ``b`` (k < T); ``var_factor[t-1] = sum_{k<t} b_k^2``; encoder column ``c``
    (``C = B^{-1} A``, first column) and ``kappa = ||c||_2``."""
    theta, w = sqrt_decoder(T)
    b = np.empty(T)
    b[0] = 1.0
    if T > 1:
        k = np.arange(1, T, dtype=np.float64)
        acc = np.zeros(T - 1)
        for th, wi in zip(theta, w):
            acc += wi * np.exp(k * math.log(th))
        b[1:] = acc
    c = np.cumsum(_power_series_inverse(b))          # B^{-1} applied to the all-ones column of A
    return {"theta": theta, "w": w, "b": b, "var_factor": np.cumsum(b * b), "c": c,
            "kappa": float(math.sqrt(float(np.dot(c, c))))}


# ---- an optimized lower-triangular factorization for few steps (block releases) -------------------
DENSE_MAX_STEPS = 320       # the optimized factorization is dense: O(T^2) state, O(T^3) work per optimizer step (~3 s at 234)


@functools.lru_cache(maxsize=16)
def optimized_factorization(T: int, row_weights: tuple | None = None, iters: int = 400) -> dict:
    """A lower-triangular factorization ``A = B C`` of the T x T prefix-sum matrix that minimizes the weighted
    mean release std ``sum_t w_t ||B[t, :]||_2 / sum_t w_t`` at sensitivity multiplier ``kappa = 1``
    (``row_weights``: None = uniform). Derivation and the privacy argument:
    ``dppo.privacy.gaussian_counter.OptimizedFactorizationCounter``.

    Optimized with L-BFGS over a lower-triangular ``C`` whose columns are normalized to unit norm (every
    column at the largest norm is optimal: enlarging a shorter column only shrinks ``B = A C^{-1}``), from
    the exact square-root factorization. The result is *defined by* the decoder ``B`` it returns: the
    encoder ``C = B^{-1} A``, its largest column norm ``kappa`` and the release variances
    ``var_factor[t-1] = ||B[t-1, :]||^2`` are recomputed from that ``B`` (float64 triangular solve;
    ``kappa`` rounded up by a relative 1e-9 to cover the solve's rounding), so they are those of the
    factorization that runs, whatever the optimizer reached.
    """
    T = int(T)
    if T < 1 or T > DENSE_MAX_STEPS:
        raise ConfigError(f"the optimized factorization is for 1..{DENSE_MAX_STEPS} counter steps, got {T}; "
                          f"use block releases (algo.block_growth) or algo.counter=gaussian_sqrt")
    w = np.ones(T) if row_weights is None else np.asarray(row_weights, np.float64)
    if w.shape != (T,) or not (w >= 0).all() or not w.sum() > 0:
        raise ConfigError(f"row_weights must be {T} nonnegative weights, not all 0")
    A = np.tril(np.ones((T, T)))
    if T > 1:
        dt = torch.float64
        At = torch.tensor(A, dtype=dt)
        mask = torch.tril(torch.ones(T, T, dtype=dt))
        s = sqrt_coefficients(T)
        C0 = np.zeros((T, T))
        for k in range(T):
            C0[np.arange(k, T), np.arange(0, T - k)] = s[k]
        M = torch.tensor(C0, dtype=dt, requires_grad=True)
        wt = torch.tensor(w / w.sum(), dtype=dt)

        def loss():
            C = M * mask
            C = C / C.norm(dim=0, keepdim=True)
            Bm = torch.linalg.solve_triangular(C, At, upper=False, left=False)     # B C = A
            return (wt * Bm.norm(dim=1)).sum()

        opt = torch.optim.LBFGS([M], lr=1.0, max_iter=int(iters), history_size=50, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-10, tolerance_change=1e-12)

        def closure():
            opt.zero_grad()
            v = loss()
            v.backward()
            return v

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            opt.step(closure)
        finally:
            torch.set_num_threads(threads)
        with torch.no_grad():
            C = M * mask
            C = C / C.norm(dim=0, keepdim=True)
            B = torch.linalg.solve_triangular(C, At, upper=False, left=False).numpy()
        B = np.tril(B)
    else:
        B = np.ones((1, 1))
    from scipy.linalg import solve_triangular

    C = solve_triangular(B, A, lower=True)           # the encoder of the decoder that runs
    kappa = float(np.linalg.norm(C, axis=0).max()) * (1 + 1e-9)
    return {"B": B, "C": C, "kappa": kappa, "var_factor": (B * B).sum(1)}


def tree_var_factor(t: int) -> float:
    """Release variance of the Gaussian tree after t steps, in units of sigma^2: ``popcount(t)``."""
    return float(bin(int(t)).count("1"))
