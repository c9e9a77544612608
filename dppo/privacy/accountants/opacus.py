"""Multi-pass accounting with Opacus' RDP / PRV accountants (users resampled across rounds)."""
from __future__ import annotations

from dppo.errors import ConfigError
from dppo.privacy.accountants.base import Accountant, register


class _OpacusAccountant(Accountant):
    """Wraps an Opacus accountant; each release must carry ``noise_multiplier`` and ``sample_rate``.

    Adjacency is Opacus' add/remove-one-user under Poisson sampling of users from a finite
    population (stated in the README); the noise multiplier is sigma / max_grad_norm.
    """

    opacus_name = "rdp"

    def __init__(self):
        from opacus.accountants import create_accountant

        self._acc = create_accountant(self.opacus_name)

    def step(self, release: dict) -> None:
        self._acc.step(noise_multiplier=float(release["noise_multiplier"]),
                       sample_rate=float(release["sample_rate"]))

    def spent(self, delta: float | None = None) -> tuple[float, float]:
        if delta is None:
            raise ConfigError("the multi-pass accountant needs a target delta")
        if not self._acc.history:
            return 0.0, 0.0
        return float(self._acc.get_epsilon(delta=delta)), float(delta)

    def state_dict(self) -> dict:
        return {"name": self.name, "history": [list(h) for h in self._acc.history]}

    def load_state_dict(self, state: dict) -> None:
        self._acc.history = [tuple(h) for h in state["history"]]


@register
class RDPAccountant(_OpacusAccountant):
    name = "rdp"
    opacus_name = "rdp"


@register
class PRVAccountant(_OpacusAccountant):
    name = "prv"
    opacus_name = "prv"


MAX_NOISE_MULTIPLIER = 50.0  # beyond this the noise swamps any clipped signal: refuse instead of searching


def multi_pass_noise_multiplier(eps: float, delta: float, sample_rate: float, steps: int,
                                accountant: str = "rdp") -> float:
    """Noise multiplier meeting (eps, delta) after ``steps`` Poisson-sampled Gaussian releases (Opacus)."""
    from opacus.accountants import create_accountant
    from opacus.accountants.utils import get_noise_multiplier

    probe = create_accountant(accountant)
    probe.history = [(MAX_NOISE_MULTIPLIER, sample_rate, steps)]
    if probe.get_epsilon(delta=delta) > eps:
        raise ConfigError(f"multi-pass eps={eps} cannot be met over {steps} rounds at sample rate {sample_rate:.3g} "
                          f"even with noise multiplier {MAX_NOISE_MULTIPLIER}; raise eps or population_size, "
                          f"or lower rounds")
    try:
        return float(get_noise_multiplier(target_epsilon=eps, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=accountant))
    except (ValueError, RuntimeError) as err:
        raise ConfigError(f"multi-pass eps={eps} cannot be met over {steps} rounds at sample rate "
                          f"{sample_rate:.3g} ({err}); raise eps or population_size, or lower rounds") from None


def multi_pass_first_release_epsilon(eps: float, delta: float, sample_rate: float, steps: int,
                                     accountant: str = "rdp") -> float:
    """eps spent by the first of ``steps`` Poisson-sampled Gaussian releases calibrated to (eps, delta)
    overall: what a budget cap (``privacy.max_epsilon``) must admit for the run to make any round."""
    from opacus.accountants import create_accountant

    z = multi_pass_noise_multiplier(eps, delta, sample_rate, steps, accountant)
    probe = create_accountant(accountant)
    probe.history = [(z, sample_rate, 1)]
    return float(probe.get_epsilon(delta=delta))
