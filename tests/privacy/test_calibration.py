import math

import pytest
from scipy.stats import norm

from dppo.errors import ConfigError
from dppo.privacy.calibration import (analytic_gaussian_sigma, classic_gaussian_sigma, exp_mech_beta,
                                      laplace_scale)


def delta_of_gaussian(eps, sigma, sens):
    """Balle & Wang Thm 8, written independently with scipy's normal CDF."""
    return norm.cdf(sens / (2 * sigma) - eps * sigma / sens) - math.exp(eps) * norm.cdf(
        -sens / (2 * sigma) - eps * sigma / sens)


@pytest.mark.parametrize("eps,expected", [(1.0, 3.731), (3.0, 1.391), (5.0, 0.892)])
def test_sigma_matches_reference_values(eps, expected):
    assert round(analytic_gaussian_sigma(eps, 1e-5, 1.0), 3) == expected


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0, 5.0, 10.0])
@pytest.mark.parametrize("sens", [0.5, 2.0])
def test_sigma_gives_claimed_eps(eps, sens):
    sigma = analytic_gaussian_sigma(eps, 1e-5, sens)
    assert delta_of_gaussian(eps, sigma, sens) == pytest.approx(1e-5, rel=1e-6)
    assert delta_of_gaussian(eps, 0.99 * sigma, sens) > 1e-5  # it is the smallest such sigma


def test_analytic_needs_less_noise_than_classic():
    ratios = [classic_gaussian_sigma(e, 1e-5) / analytic_gaussian_sigma(e, 1e-5) for e in (1, 3, 5)]
    assert ratios == pytest.approx([1.30, 1.16, 1.09], abs=0.05)


def test_laplace_and_exponential_mechanism_scales():
    assert laplace_scale(0.5, 2.0) == 4.0
    assert exp_mech_beta(2.0, 8.0) == 0.125


@pytest.mark.parametrize("eps,delta", [(0, 1e-5), (-1, 1e-5), (1, 0), (1, 1), (float("inf"), 1e-5)])
def test_invalid_privacy_parameters_are_rejected(eps, delta):
    with pytest.raises(ConfigError):
        analytic_gaussian_sigma(eps, delta, 1.0)
