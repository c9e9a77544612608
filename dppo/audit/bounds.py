"""From distinguisher scores to a lower bound on eps: threshold test, Clopper-Pearson, (eps, delta) conversion.

A mechanism M is (eps, delta)-DP only if every test S on its output obeys, for neighbours D, D',
    P[M(D') in S] <= e^eps P[M(D) in S] + delta   and   P[M(D) in S^c] <= e^eps P[M(D') in S^c] + delta.
With S = {score > t}, FPR alpha = P[M(D) in S] and FNR beta = P[M(D') not in S] this reads
    eps >= log((1 - delta - beta) / alpha)   and   eps >= log((1 - delta - alpha) / beta)
(Kairouz, Oh & Viswanath 2015; Jagielski, Ullman & Oprea 2020). Replacing alpha and beta by
Clopper-Pearson upper confidence bounds turns the empirical rates into a bound that holds with the
stated confidence; the threshold is chosen on one half of the trials and evaluated on the other, so
the choice cannot overfit the evaluation half.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as beta_dist

from dppo.errors import ConfigError


def clopper_pearson_upper(k, n: int, level: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bound p_hi with P[p <= p_hi] >= level for k successes in n trials.

    p_hi is the ``level`` quantile of Beta(k + 1, n - k) (Clopper & Pearson 1934), and 1 when k = n.
    """
    k = np.asarray(k, dtype=np.float64)
    full = k >= n
    safe_k = np.where(full, n - 1, k)
    return np.where(full, 1.0, beta_dist.ppf(level, safe_k + 1, n - safe_k))


def eps_from_rates(alpha, beta, delta: float) -> np.ndarray:
    """eps lower bound max(log((1 - delta - beta) / alpha), log((1 - delta - alpha) / beta), 0) (module docstring)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where((1 - delta - beta > 0) & (alpha > 0), np.log(np.clip(1 - delta - beta, 1e-300, None))
                         - np.log(np.clip(alpha, 1e-300, None)), np.where(1 - delta - beta > 0, np.inf, -np.inf))
        second = np.where((1 - delta - alpha > 0) & (beta > 0), np.log(np.clip(1 - delta - alpha, 1e-300, None))
                          - np.log(np.clip(beta, 1e-300, None)), np.where(1 - delta - alpha > 0, np.inf, -np.inf))
    return np.maximum(np.maximum(first, second), 0.0)


@dataclass
class ThresholdAudit:
    """Outcome of one audit: the bound and the counts it rests on (evaluation half only).

    Attributes:
        eps_lb: lower bound on eps at ``delta``, valid with probability >= ``confidence``.
        threshold, sign: the test is ``sign * score > threshold`` (chosen on the selection half).
        false_pos, n_null: positives among the evaluation half's trials on D.
        false_neg, n_alt: negatives among the evaluation half's trials on D'.
        alpha_hi, beta_hi: Clopper-Pearson upper bounds on FPR and FNR.
        delta, confidence: as used.
    """

    eps_lb: float
    threshold: float
    sign: int
    false_pos: int
    n_null: int
    false_neg: int
    n_alt: int
    alpha_hi: float
    beta_hi: float
    delta: float
    confidence: float


def _candidate_thresholds(scores: np.ndarray) -> np.ndarray:
    """Quantiles of the pooled scores, dense in both tails (where (eps, delta) tests live)."""
    tail = np.logspace(-6, np.log10(0.5), 120)
    levels = np.unique(np.concatenate([tail, 1 - tail, np.linspace(0.01, 0.99, 99)]))
    return np.unique(np.quantile(scores, levels))


def _rates(null: np.ndarray, alt: np.ndarray, thresholds: np.ndarray, sign: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts (false positives among null, false negatives among alt) of ``sign * score > t`` for each t."""
    null_s, alt_s = np.sort(sign * null), np.sort(sign * alt)
    fp = null_s.size - np.searchsorted(null_s, thresholds, side="right")
    fn = np.searchsorted(alt_s, thresholds, side="right")
    return fp, fn


def threshold_audit(null_scores, alt_scores, delta: float, confidence: float = 0.95,
                    selection_level: float = 0.9999) -> ThresholdAudit:
    """eps lower bound from a threshold test on scalar scores of trials on D (null) and D' (alt).

    The first half of each score array picks the threshold and orientation that maximize the bound
    on that half, computed with the stricter Clopper-Pearson level ``selection_level`` (it damps the
    winner's curse of far-tail thresholds whose selection-half counts were lucky); the second half
    alone is evaluated. The two rates each get a one-sided
    Clopper-Pearson bound at level 1 - (1 - confidence) / 2 (the upper ends of two-sided
    ``confidence`` intervals), so by a union bound the pair, and hence eps_lb, holds with
    probability >= ``confidence``.

    Args:
        null_scores: (n0,) scores of independent runs on D.
        alt_scores: (n1,) scores of independent runs on D'.
        delta: the mechanism's claimed delta.
        confidence: joint confidence of the bound.

    Raises:
        ConfigError: fewer than 4 trials on a side, non-finite scores, or a bad confidence.
    """
    null = np.asarray(null_scores, dtype=np.float64).reshape(-1)
    alt = np.asarray(alt_scores, dtype=np.float64).reshape(-1)
    if null.size < 4 or alt.size < 4:
        raise ConfigError("an audit needs at least 4 trials on each input")
    if not (np.isfinite(null).all() and np.isfinite(alt).all()):
        raise ConfigError("audit scores must be finite")
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must lie in (0, 1), got {confidence}")
    level = 1 - (1 - confidence) / 2
    h0, h1 = null.size // 2, alt.size // 2
    sel_null, ev_null, sel_alt, ev_alt = null[:h0], null[h0:], alt[:h1], alt[h1:]
    thresholds = _candidate_thresholds(np.concatenate([sel_null, sel_alt]))
    best = (-1.0, 0.0, 1)
    for sign in (1, -1):
        ts = sign * thresholds
        fp, fn = _rates(sel_null, sel_alt, ts, sign)
        eps = eps_from_rates(clopper_pearson_upper(fp, h0, selection_level),
                             clopper_pearson_upper(fn, h1, selection_level), delta)
        i = int(np.argmax(eps))
        if eps[i] > best[0]:
            best = (float(eps[i]), float(ts[i]), sign)
    _, t, sign = best
    fp, fn = _rates(ev_null, ev_alt, np.array([t]), sign)
    a_hi = float(clopper_pearson_upper(fp[0], ev_null.size, level))
    b_hi = float(clopper_pearson_upper(fn[0], ev_alt.size, level))
    eps_lb = float(eps_from_rates(a_hi, b_hi, delta))
    return ThresholdAudit(eps_lb=eps_lb if math.isfinite(eps_lb) else 0.0, threshold=t, sign=sign,
                          false_pos=int(fp[0]), n_null=int(ev_null.size), false_neg=int(fn[0]),
                          n_alt=int(ev_alt.size), alpha_hi=a_hi, beta_hi=b_hi, delta=float(delta),
                          confidence=float(confidence))
