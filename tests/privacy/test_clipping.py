import pytest
import torch

from dppo.algos.core import group_advantages
from dppo.policies.per_user_grads import per_user_gradients
from dppo.envs.gym_env import GymEnvFactory
from dppo.policies.mlp import MLPPolicy
from dppo.errors import PrivacyError
from dppo.privacy import PrivacyContext
from dppo.privacy.calibration import analytic_gaussian_sigma
from dppo.privacy.composed import ComposedGaussianSums, composed_sums
from dppo.privacy.release import clip_per_user


def test_clipped_per_user_norms_are_bounded():
    g = torch.randn(50, 30) * torch.logspace(-2, 2, 50)[:, None]
    clipped, norms = clip_per_user(g, 1.5)
    assert (clipped.norm(dim=1) <= 1.5 + 1e-9).all()
    small = norms <= 1.5
    assert torch.allclose(clipped[small], g[small].double())  # rows under the bound are untouched


def test_clipping_never_modifies_its_input_and_float32_rows_clip_like_float64():
    g64 = torch.randn(6, 40, dtype=torch.float64) * 3
    before = g64.clone()
    c64, n64 = clip_per_user(g64, 1.0)
    assert torch.equal(g64, before)  # float64 rows are the caller's: scaled out of place
    g32 = g64.float()
    c32, n32 = clip_per_user(g32, 1.0)  # its float64 copy is scaled in place
    assert torch.equal(g32, before.float()) and c32.dtype == torch.float64
    assert torch.equal(c32, clip_per_user(g32.double(), 1.0)[0]) and torch.equal(n32, g32.double().norm(dim=1))


def test_non_finite_rows_are_neutralised():
    g = torch.tensor([[float("nan"), 1.0], [float("inf"), 0.0], [3.0, 4.0]])
    clipped, _ = clip_per_user(g, 1.0)
    assert torch.isfinite(clipped).all() and (clipped.norm(dim=1) <= 1.0 + 1e-9).all()


def dp_pg_round(privacy, rows, round_idx, clip):
    """DP-PG's round through its release (the composed release's k = 1 case): (noisy mean, stats, release)."""
    rel = composed_sums(privacy, parts={"actor": (1, 1.0)})
    users = list(range(rows.shape[0]))
    rel.open_round(round_idx, users, (clip,), dim=rows.shape[1])
    total, stats = rel.release_sum(rows, users, clip, part="actor")
    return total / len(users), stats, rel


def test_dp_pg_release_uses_replace_one_sensitivity_and_records_the_round_when_it_opens():
    priv = PrivacyContext(3.0, 1e-5)
    rel = composed_sums(priv, parts={"actor": (1, 1.0)})
    assert type(rel) is ComposedGaussianSums and rel.mechanism == "gaussian_sum" and rel.releases_per_user == 1
    rel.open_round(7, [10, 11, 12, 13], (0.5,), dim=10)
    (entry,) = priv.ledger.entries   # accounted when the round opens, before any noisy sum exists
    assert entry["mechanism"] == "gaussian_sum" and entry["sensitivity"] == 1.0 and entry["round"] == 7
    assert entry["users"] == 4 and entry["sigma"] == analytic_gaussian_sigma(3.0, 1e-5, 1.0)
    assert priv.spent() == (3.0, 1e-5)
    assert entry["noise_multiplier"] == pytest.approx(entry["sigma"] / entry["sensitivity"], rel=1e-15)
    assert entry["adjacency"] == "replace_one" and entry["clip"] == 0.5 and entry["dim"] == 10
    out, stats = rel.release_sum(torch.ones(4, 10), [10, 11, 12, 13], 0.5, part="actor")
    assert out.shape == (10,) and len(priv.ledger.entries) == 1
    assert stats["diag/clip_fraction"] == 1.0       # raw: how many of this round's users were clipped
    with pytest.raises(PrivacyError, match="more than 1 releases"):   # one sum per user and round
        rel.release_sum(torch.ones(1, 10), [10], 0.5, part="actor")


def test_noise_has_the_calibrated_scale():
    priv = PrivacyContext(1.0, 1e-5)
    out, _, rel = dp_pg_round(priv, torch.zeros(1, 20000), 0, 1.0)
    assert rel.sigma(1.0, "actor") == analytic_gaussian_sigma(1.0, 1e-5, 2.0)
    assert out.std().item() == pytest.approx(rel.sigma(1.0, "actor"), rel=0.03)


def _user_grads(obs, actions, rewards, mask, policy, G=2):
    """Users are consecutive blocks of G rollouts; group advantages from each block's own returns."""
    m = obs.shape[0] // G
    A, _ = group_advantages((rewards * mask).sum(1).reshape(m, G), std=True)
    A = A.reshape(-1, 1) * mask
    flat = lambda x: x.reshape(m, G * x.shape[1], *x.shape[2:])  # noqa: E731
    return clip_per_user(per_user_gradients(policy, (flat(obs), flat(actions)), flat(A)).double(), 1.0)[0]


def test_changing_one_user_leaves_other_users_clipped_gradients_unchanged():
    torch.manual_seed(0)
    env = GymEnvFactory("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space)
    m, T = 10, 12  # 5 users x 2 rollouts
    obs = torch.randn(m, T, 4)
    actions = torch.randint(0, 2, (m, T))
    rewards = torch.rand(m, T, dtype=torch.float64)
    mask = torch.ones(m, T, dtype=torch.bool)
    mask[1, 8:] = False
    base = _user_grads(obs, actions, rewards, mask, policy)
    obs2, rewards2, actions2 = obs.clone(), rewards.clone(), actions.clone()
    obs2[4:6] = torch.randn(2, T, 4) * 10  # user 2's whole group
    rewards2[4] = -1.0
    actions2[4:6] = 1 - actions2[4:6]
    changed = _user_grads(obs2, actions2, rewards2, mask, policy)
    others = [0, 1, 3, 4]
    assert torch.allclose(base[others], changed[others], atol=1e-12)
    assert not torch.allclose(base[2], changed[2])
