"""PG / DP-PG: the step's James-Stein shrinkage (``shrink``) against an independent computation."""
import torch

from dppo.algos.pg import shrinkage


def test_shrinkage_is_the_positive_part_james_stein_factor_of_the_released_mean():
    """(1 - d s^2 / ||g~||^2)_+: near 0 on pure noise (||g~||^2 ~ d s^2), near 1 with a signal far above the
    noise, exactly 1 without noise (the twin), and it lowers the mean squared error of the release."""
    gen = torch.Generator().manual_seed(0)
    d, s = 64, 0.1
    g = torch.randn(d, generator=gen, dtype=torch.float64)
    g = g / g.norm() * (0.5 * d) ** 0.5 * s  # signal energy half the noise energy
    noisy = g + s * torch.randn(2000, d, generator=gen, dtype=torch.float64)
    factors = torch.tensor([shrinkage(row, s) for row in noisy], dtype=torch.float64)
    want = (1 - d * s * s / noisy.pow(2).sum(1)).clamp_min(0)  # computed independently
    torch.testing.assert_close(factors, want)
    shrunk = factors[:, None] * noisy
    assert float((shrunk - g).pow(2).sum(1).mean()) < float((noisy - g).pow(2).sum(1).mean())
    pure = s * torch.randn(200, d, generator=gen, dtype=torch.float64)
    assert float(torch.tensor([shrinkage(row, s) for row in pure]).mean()) < 0.1
    ones = torch.full((d,), 1.0, dtype=torch.float64)
    assert abs(shrinkage(ones, s) - (1 - s * s)) < 1e-12  # ||g~||^2 = d: 1 - d s^2 / d
    assert shrinkage(g, 0.0) == 1.0
