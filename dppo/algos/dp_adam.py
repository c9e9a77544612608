"""Adam with the noise variance taken out of its second moment (DP-AdamBC; Tang et al., AAAI 2024).

A private release adds N(0, s^2) to every coordinate of the mean gradient (s = ``privacy/noise_std``, public),
so Adam's second moment estimates E[g_j^2] + s^2: where the signal is weak the denominator is about s and
Adam acts as SGD with step lr / s. DP-AdamBC divides by sqrt(max(v_hat - s^2, floor)) instead, with
floor = (``floor_fraction`` s)^2 bounding the step on coordinates whose estimate falls below the noise.
Post-processing of the released means (s is public): no privacy cost. With s = 0 (the non-private twin) it
is Adam (bias-corrected moments, eps added to the denominator).
"""
from __future__ import annotations

import math

import torch


class AdamBC(torch.optim.Optimizer):
    """Adam minus the release's noise variance ``noise_var`` (set before each ``step``) in the second moment."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, floor_fraction: float = 0.1):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.noise_var = 0.0
        self.floor_fraction = float(floor_fraction)

    @torch.no_grad()
    def step(self, closure=None):
        floor = self.floor_fraction ** 2 * self.noise_var
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                v_hat = v / (1 - b2 ** t)
                denom = (v_hat - self.noise_var).clamp_min(floor).sqrt_().add_(group["eps"])
                p.addcdiv_(m, denom, value=-group["lr"] / (1 - b1 ** t))
        return None
