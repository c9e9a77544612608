"""The fused clipped sum (``dppo.policies.per_user_grads.fused``) and the materialised path (clipping the rows of
``per_user_gradients``) both equal the definition computed independently: one ordinary backward pass per user
(its rows only), each user's gradient clipped, summed. Norms and sum, for every norm method, users of unequal
lengths (one without rows), padded and flat layouts, Linear / Embedding / norm / fallback / root-parameter mixes,
a layer called twice and tied weights."""
import pytest
import torch
from torch import nn

from dppo.policies.mlp import MLPPolicy
from dppo.policies.per_user_grads import NORM_METHODS, clipped_gradient_sum, per_user_gradients
from dppo.privacy.release import clip_scale
from tests.policies.test_per_user_grads import CASES, brute_force

REL = {torch.float64: 1e-10, torch.float32: 1e-5}  # stated tolerance: float rounding, relative to the sum's norm


def brute_force_flat(model, inputs: tuple, w, user, m):
    """One ordinary backward per user of sum over its flat rows r of w_r model(row r): (m, P) float64."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for u in range(m):
        sel = user == u
        if not bool(sel.any()):
            rows.append(torch.zeros(sum(p.numel() for p in params), dtype=torch.float64))
            continue
        grads = torch.autograd.grad((model(*(t[sel] for t in inputs)) * w[sel]).sum(), params, allow_unused=True)
        rows.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double()
                               for g, p in zip(grads, params)]))
    return torch.stack(rows)


def reference(per_user: torch.Tensor, scale):
    """The definition: each materialised row scaled by its factor, summed (float64)."""
    g = per_user.double()
    n = g.norm(dim=1)
    return (g * scale(n)[:, None]).sum(0), n


def assert_equal_to_reference(got, expect, dtype):
    (s, n), (s_ref, n_ref) = got, expect
    assert s.dtype == n.dtype == torch.float64 and s.shape == s_ref.shape and n.shape == n_ref.shape
    assert float((s - s_ref).norm()) <= REL[dtype] * float(s_ref.norm()), float((s - s_ref).norm() / s_ref.norm())
    assert bool(((n - n_ref).abs() <= REL[dtype] * n_ref.clamp_min(1e-12)).all())


class Mixed(nn.Module):
    """Embedding -> Linear -> LayerNorm -> a Linear without bias -> one Linear applied twice -> a root gain."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 5)
        self.l1 = nn.Linear(5, 48)
        self.ln = nn.LayerNorm(48)
        self.l2 = nn.Linear(48, 3, bias=False)
        self.shared = nn.Linear(3, 3)
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 3))

    def forward(self, tok, a):
        h = self.ln(torch.tanh(self.l1(self.emb(tok)))).mean(1)
        z = self.shared(torch.tanh(self.shared(self.l2(h)))) * self.gain
        return torch.log_softmax(z, -1).gather(-1, a[:, None]).squeeze(-1)


@pytest.mark.parametrize("norms", NORM_METHODS)
def test_fused_sum_and_norms_equal_clipping_the_materialised_rows_flat_users_of_unequal_lengths(norms):
    torch.manual_seed(0)
    net = Mixed().double()
    N, m = 60, 7
    g = torch.Generator().manual_seed(1)
    user = torch.randint(0, m, (N,), generator=g)
    user[user == 3] = 4  # user 3 has no rows
    tok, a = torch.randint(0, 7, (N, 4), generator=g), torch.randint(0, 3, (N,), generator=g)
    w = torch.randn(N, generator=g, dtype=torch.float64)
    brute = brute_force_flat(net, (tok, a), w, user, m)
    C = 0.5 * float(brute.norm(dim=1).median())  # about half the users clipped

    def scale(n):
        return clip_scale(n, C)

    expect = reference(brute, scale)
    got = clipped_gradient_sum(net, (tok, a), w, scale, user, num_users=m, norms=norms)
    assert_equal_to_reference(got, expect, torch.float64)
    assert float(got[1][3]) == 0.0
    assert_equal_to_reference(reference(per_user_gradients(net, (tok, a), w, user, num_users=m), scale), expect,
                              torch.float64)  # the materialised path


@pytest.mark.parametrize("norms", NORM_METHODS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_sum_equals_the_materialised_rows_on_padded_users(name, norms):
    """The engine's cases (MLP, log-linear root parameters, Gaussian, tokens with the torch.func fallback)."""
    policy, (obs, actions, weights) = CASES[name]
    brute = brute_force(policy, obs, actions, weights)

    def scale(n):
        return clip_scale(n, 0.7 * float(brute.norm(dim=1).median()))

    expect = reference(brute, scale)
    got = clipped_gradient_sum(policy, (obs, actions), weights, scale, norms=norms)
    assert_equal_to_reference(got, expect, torch.float64)
    assert_equal_to_reference(reference(per_user_gradients(policy, (obs, actions), weights), scale), expect,
                              torch.float64)  # the materialised path


def test_float32_mlp_space_and_the_pg_round_use_the_fused_sum(monkeypatch):
    """FullSpace of a float32 MLP: ``clipped_user_sum`` = the clipped rows of ``user_gradients`` to 1e-5, both
    = one backward per user (float32 rounding: 1e-5 of the sum's norm), and DP-PG's released direction = the
    materialised release with the same (seeded) noise."""
    from dppo.algos.pg import PolicyGradient
    from dppo.data.sampler import OnePassUserSampler
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.policies.spaces import make_space
    from dppo.privacy import NoiseSource, PrivacyContext
    from dppo.privacy.accountants import make_accountant

    torch.manual_seed(0)
    env = GymEnvFactory("CartPole-v1", horizon=30)
    policy = MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(32, 32))
    space = make_space(policy, subspace="full", dim=None)

    def learner():
        privacy = PrivacyContext(4.0, 1e-5, accountant=make_accountant("parallel"), noise=NoiseSource(5, secure=False))
        return PolicyGradient(policy, env, privacy, OnePassUserSampler(8, seed=0), space=space, seed=0, rounds=1,
                              reward_bound=1.0, max_grad_norm=0.3, group_size=3, advantage="to_go")

    fused, plain = learner(), learner()
    batch = fused.collect(list(range(8)), 0)
    A, _ = fused.step_advantages(batch)
    rows = space.user_gradients(batch, A)
    G = batch.group_size
    brute = brute_force(policy, batch.grouped(batch.obs).flatten(1, 2), batch.grouped(batch.actions).flatten(1, 2),
                        batch.grouped(A).flatten(1, 2) / G)

    def no_rows(*args, **kwargs):
        raise AssertionError("the fused path materialised the per-user gradients")

    monkeypatch.setattr("dppo.policies.per_user_grads.fused.per_user_gradients", no_rows)
    scale = lambda n: fused.release.clip_scale(n, 0.3)  # noqa: E731 - the release's factors at C = 0.3
    got = space.clipped_user_sum(batch, A, scale)
    assert_equal_to_reference(got, reference(rows, scale), torch.float32)
    assert_equal_to_reference(got, reference(brute, scale), torch.float32)
    users = list(range(8))
    direction, stats = fused.update_direction(batch, A, 0, users)
    clipped = (rows * scale(rows.norm(dim=1))[:, None]).sum(0)
    plain.release.open_round(0, users, (0.3,))
    expect, _ = plain.release.release_clipped_sum(clipped, rows.norm(dim=1), users, 0.3, part="actor")  # same noise
    expect = expect / 8
    assert float((direction - expect).norm()) <= 1e-5 * float(expect.norm())
    assert fused.privacy.ledger.entries[-1]["dim"] == space.dim and 0 < stats["diag/clip_fraction"] <= 1
    assert make_space(policy, subspace="full", dim=4).clipped_user_sum(batch, A, scale) is None


class _TiedHead(nn.Module):
    """An embedding and an output layer sharing one weight (an LM head tied to its embeddings)."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(7, 5), nn.Linear(5, 7, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return torch.log_softmax(self.head(torch.tanh(self.emb(x))), -1)[..., 0]


@pytest.mark.parametrize("norms", NORM_METHODS)
def test_a_tied_weights_norm_includes_the_cross_term_of_its_two_uses(norms):
    """A parameter used by two modules: ||g_u|| is the norm of the summed parts (per-layer norms would miss
    the cross term and clip too little), so the sum and norms equal clipping one backward per user."""
    torch.manual_seed(0)
    model = _TiedHead().double()
    x, w = torch.randint(0, 7, (5, 3)), torch.randn(5, 3, dtype=torch.float64)
    rows = brute_force_flat(model, (x.reshape(-1),), w.reshape(-1), torch.arange(5).repeat_interleave(3), 5)
    scale = lambda n: clip_scale(n, 0.5)
    total, n = clipped_gradient_sum(model, (x,), w, scale, norms=norms)
    torch.testing.assert_close(n, torch.linalg.vector_norm(rows, dim=1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(total, rows.T @ scale(n), rtol=1e-10, atol=1e-12)
