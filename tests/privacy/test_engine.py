"""dppo.make_private: the per-user gradients it releases are each user's own (an independent per-user backward
pass), clipped to the part's clip, noised at the one release's sigma and divided by the public count; the round's
ledger entry is the release's; whatever the loop hands in (a loader repeating users, a loss not one per user, a
step before a round, a user past its steps, a module mixing users) is refused in one line."""
import math

import pytest
import torch
from torch import nn

import dppo
from dppo.errors import ConfigError, PrivacyError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.composed import composed_sums


def _setup(eps=3.0, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return model, *dppo.make_private(module=model, optimizer=opt, eps=eps, max_grad_norm=0.5, noise_seed=5, **kw)[1:]


def _losses(model, x):
    return (model(x).squeeze(-1) - 1.0) ** 2        # row i: user i's loss from its own x_i only


def test_a_step_moves_the_parameters_by_the_clipped_noised_mean_of_each_users_own_gradient():
    model, opt, rounds = _setup(users_per_round=4, rounds=1)
    users = next(iter(rounds))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    before = [p.detach().clone() for p in model.parameters()]
    rows = []
    for i in range(4):                                # independent: one backward pass per user
        g = torch.autograd.grad(_losses(model, x[i:i + 1])[0], list(model.parameters()))
        rows.append(torch.cat([t.reshape(-1) for t in g]).double())
    rows = torch.stack(rows)
    clipped = rows * torch.clamp(0.5 * (1 - 1e-9) / rows.norm(dim=1), max=1.0)[:, None]
    reference = composed_sums(PrivacyContext(3.0, 1e-5, noise=NoiseSource(5)), releases_per_user=1)
    reference.open_round(0, users, (0.5,))
    noisy, _ = reference.release_sum(rows, users)     # the same noise draw (same seed, same first draw)
    opt.step(_losses(model, x), users)
    after = torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, model.parameters())]).double()
    assert torch.allclose(after, noisy / 4, atol=1e-6)
    assert not torch.allclose(noisy, clipped.sum(0))  # noise was added
    assert opt.privacy_spent() == pytest.approx((3.0, 1e-5))
    (entry,) = opt.engine.privacy.ledger.entries
    assert entry == reference.privacy.ledger.entries[0]


def test_the_twin_steps_along_the_clipped_mean_without_noise_and_has_no_guarantee():
    model, opt, rounds = _setup(eps=None, users_per_round=2, rounds=1)
    users = next(iter(rounds))
    x = torch.randn(2, 3)
    opt.step(_losses(model, x), users)
    assert opt.privacy_spent() == (math.inf, 1.0) and not opt.engine.privacy.ledger.entries


def test_a_loader_that_repeats_a_user_is_refused_when_its_round_starts():
    _, opt, rounds = _setup(data_loader=[[0, 1], [2, 3], [1, 4]])
    it = iter(rounds)
    next(it), next(it)
    with pytest.raises(PrivacyError, match="names user 1 again .it was in round 0."):
        next(it)


def test_bad_steps_are_refused_in_one_line():
    model, opt, rounds = _setup(users_per_round=3)
    with pytest.raises(PrivacyError, match="before a round started"):
        opt.step(_losses(model, torch.randn(3, 3)), [0, 1, 2])
    users = next(iter(rounds))
    with pytest.raises(PrivacyError, match="one loss per user"):
        opt.step(_losses(model, torch.randn(3, 3)).sum(), users)
    with pytest.raises(PrivacyError, match="distinct users of the opened round"):
        opt.step(_losses(model, torch.randn(3, 3)), [users[0]] * 3)
    opt.step(_losses(model, torch.randn(3, 3)), users)
    with pytest.raises(PrivacyError, match="more than 1 releases"):   # releases_per_user=1: one step per round
        opt.step(_losses(model, torch.randn(3, 3)), users)


def test_modules_that_mix_users_and_mismatched_parts_are_refused():
    bn = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    with pytest.raises(ConfigError, match="batch normalization"):
        dppo.make_private(module=bn, optimizer=torch.optim.SGD(bn.parameters(), lr=1), eps=1, max_grad_norm=1,
                          users_per_round=2)
    a, c = nn.Linear(2, 2), nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="max_grad_norm must name the parts"):
        dppo.make_private(module={"actor": a, "critic": c}, eps=1,
                          optimizer={"actor": torch.optim.SGD(a.parameters(), lr=1),
                                     "critic": torch.optim.SGD(c.parameters(), lr=1)},
                          max_grad_norm={"actor": 1.0}, users_per_round=2)
    with pytest.raises(ConfigError, match="the module's own trainable parameters"):
        dppo.make_private(module=a, optimizer=torch.optim.SGD(c.parameters(), lr=1), eps=1, max_grad_norm=1,
                          users_per_round=2)
