"""The correlated-noise stream's audit (dppo/audit/correlated_noise.py): within its claim for one participation
(DP-PG) and E consecutive participations (DP-PPO), with power at eps 4, and a stream with halved noise caught."""
from __future__ import annotations

import pytest

from dppo.audit.correlated_noise import audit_correlated_noise


@pytest.mark.parametrize("participations", [1, 3])
def test_correlated_stream_bound_is_below_claim_and_has_power(participations):
    out = audit_correlated_noise(4.0, trials=200_000, participations=participations, seed=2)
    assert out.claimed_eps == pytest.approx(4.0, rel=1e-9) and out.delta == 1e-5   # the accountant's figure
    assert out.passed, (out.eps_lb, out.claimed_eps)
    assert out.eps_lb >= 0.5 * out.claimed_eps, out.eps_lb


@pytest.mark.parametrize("participations", [1, 3])
def test_correlated_stream_with_halved_noise_is_caught(participations):
    out = audit_correlated_noise(1.0, trials=200_000, participations=participations, seed=3, sigma_scale=0.5)
    assert not out.passed, (out.eps_lb, out.claimed_eps)


def test_truncated_square_root_stream_within_claim():
    out = audit_correlated_noise(1.0, trials=100_000, kind="banded_sqrt", bands=3, seed=4)
    assert out.passed, (out.eps_lb, out.claimed_eps)
