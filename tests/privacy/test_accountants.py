import pytest
import torch

from dppo.errors import BudgetExhausted, ConfigError
from dppo.privacy import PrivacyContext
from dppo.privacy.accountants import make_accountant
from dppo.privacy.noise import NoiseSource


def test_parallel_composition_is_max_over_rounds_and_sum_within():
    acc = make_accountant("parallel")
    for r, eps in [(0, 1.0), (1, 2.0), (1, 0.5), (2, 1.5)]:
        acc.step({"round": r, "eps": eps, "delta": 1e-6})
    assert acc.spent() == (2.5, 2e-6)


def test_basic_composition_sums():
    acc = make_accountant("basic")
    for eps in (0.1, 0.2, 0.3):
        acc.step({"round": 0, "eps": eps, "delta": 0.0})
    assert acc.spent()[0] == pytest.approx(0.6)


def test_rdp_accountant_matches_opacus_directly():
    from opacus.accountants import RDPAccountant

    ref = RDPAccountant()
    acc = make_accountant("rdp")
    for _ in range(50):
        ref.step(noise_multiplier=1.1, sample_rate=0.01)
        acc.step({"noise_multiplier": 1.1, "sample_rate": 0.01})
    assert acc.spent(1e-5)[0] == pytest.approx(ref.get_epsilon(1e-5))


@pytest.mark.parametrize("name", ["parallel", "basic", "rdp"])
def test_accountant_state_round_trips(name):
    a, b = make_accountant(name), make_accountant(name)
    for r in range(3):
        a.step({"round": r, "eps": 1.0, "delta": 1e-6, "noise_multiplier": 1.0, "sample_rate": 0.1})
    b.load_state_dict(a.state_dict())
    assert a.spent(1e-5) == b.spent(1e-5)


def test_unknown_accountant_is_a_config_error():
    with pytest.raises(ConfigError):
        make_accountant("nope")


def test_budget_cap_refuses_release_without_recording():
    priv = PrivacyContext(1.0, 1e-5, accountant=make_accountant("basic"), max_epsilon=2.5)
    priv.release("m", round=0, users=1, eps=1.0, adjacency="replace_one")
    priv.release("m", round=1, users=1, eps=1.0, adjacency="replace_one")
    with pytest.raises(BudgetExhausted):
        priv.release("m", round=2, users=1, eps=1.0, adjacency="replace_one")
    assert len(priv.ledger) == 2 and priv.spent()[0] == 2.0


def test_seeded_noise_is_reproducible_and_secure_noise_has_right_scale():
    a, b = NoiseSource(3), NoiseSource(3)
    assert torch.equal(a.gaussian((5,), 1.0), b.gaussian((5,), 1.0))
    s = NoiseSource(0, secure=True)
    x = s.gaussian((40000,), 2.0)
    assert x.std().item() == pytest.approx(2.0, rel=0.03) and abs(x.mean().item()) < 0.05
    lap = s.laplace((40000,), 1.0)
    assert lap.abs().mean().item() == pytest.approx(1.0, rel=0.05)  # E|Laplace(b)| = b
