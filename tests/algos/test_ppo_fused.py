"""DP-PPO's fused clipped sums (``PPO.fused_sums``: the space's ``clipped_rows_sum`` for the actor, the engine's
``clipped_gradient_sum`` for the critic) against the materialised path (the rows of ``actor_gradients`` /
``critic_gradients`` clipped and summed in float64): the same sums and norms to float32 rounding, every user's
term of norm <= C, no per-user rows formed, a whole private round with the same released parameters, and when
the learner takes which path (``PPO.fuses``).

Stated tolerance: the engine computes in float32, so sums agree to 1e-5 of the sum's norm and norms to 1e-5
relative (``tests/policies/test_clipped_sum.py``); a round's parameters (Adam steps along released means) to
1e-4 of the parameter change (the fused factors' margin ``FUSED_MARGIN`` = 1e-5 moves each clipped term by
1e-5 of C on top of the rounding)."""
import pytest
import torch

from dppo.errors import ConfigError
from dppo.privacy.release import FUSED_MARGIN, clipped_total
from tests.algos.test_ppo import _learner, _perturb

REL = 1e-5   # float32 engine


def _minibatch(env_id, ent_coef, users=5, group_size=2, adv_scale=1.0):
    """A learner with a perturbed actor and critic (ratios away from 1, some clipped), its round targets with
    random advantages, and the actor's and critic's engine rows of all its users."""
    L = _learner(env_id, users=users, group_size=group_size, ent_coef=ent_coef, horizon=40)
    batch = L.collect(list(range(users)), 0)
    t = L.round_targets(batch)
    gen = torch.Generator().manual_seed(4)
    t["A"] = adv_scale * torch.randn(batch.mask.shape, dtype=torch.float64, generator=gen) * batch.mask
    _perturb(L.policy, 0.3)
    _perturb(L.critic, 0.3, seed=5)
    mb = torch.arange(users)
    # user u keeps the first 40 - 6 u steps of each episode (a prefix, as collected; Pendulum's are all 40 long)
    G, T = group_size, batch.mask.shape[1]
    keep = torch.arange(T)[None, :] < (40 - 6 * torch.arange(users)).repeat_interleave(G)[:, None]
    t["mask"] = t["mask"] & keep
    t["A"], t["returns"] = t["A"] * t["mask"], t["returns"] * t["mask"]
    t["steps_per_user"] = t["mask"].reshape(users, -1).sum(1).double().clamp_min(1)
    assert len(set(t["steps_per_user"].tolist())) > 1, "the users should have different step counts"
    return L, t, mb


def _clipped_reference(rows, scale):
    """The definition on the materialised rows: each row times its factor, summed in float64; and the norms."""
    n = rows.double().norm(dim=1)
    return (rows.double() * scale(n)[:, None]).sum(0), n


def _assert_close(got, want):
    (s, n), (s_ref, n_ref) = got, want
    assert s.dtype == n.dtype == torch.float64 and s.shape == s_ref.shape and n.shape == n_ref.shape
    assert float((s - s_ref).norm()) <= REL * float(s_ref.norm()), float((s - s_ref).norm() / s_ref.norm())
    assert bool(((n - n_ref).abs() <= REL * n_ref).all()), float(((n - n_ref).abs() / n_ref).max())


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])   # the MLP and the Gaussian policy
@pytest.mark.parametrize("ent_coef", [0.0, 0.05])
def test_the_fused_sums_equal_clipping_and_summing_the_materialised_rows(env_id, ent_coef, monkeypatch):
    """Actor and critic, users of different step counts, C at the median norm (about half the users clipped):
    the fused sum and norms equal the materialised rows clipped with the same factors (and with the release's
    own float64 clipping, to the factors' margin), without the rows ever being formed."""
    L, t, mb = _minibatch(env_id, ent_coef)
    inputs, w, user, _ = L.actor_rows(*L._actor_inputs(t, mb))
    rows_a, _ = L.actor_gradients(*L._actor_inputs(t, mb))
    rows_c = L.critic_gradients(*L._critic_inputs(t, mb))
    L.clip = float(rows_a.double().norm(dim=1).median())
    L.critic_clip = float(rows_c.double().norm(dim=1).median())

    def no_rows(*args, **kwargs):
        raise AssertionError("the fused path materialised the per-user gradients")

    monkeypatch.setattr("dppo.policies.per_user_grads.fused.per_user_gradients", no_rows)
    (a_sum, a_norms, frac), (c_sum, c_norms) = L.fused_sums(t, mb)
    assert 0 < frac < 1
    for (s, n), rows, C in (((a_sum, a_norms), rows_a, L.clip), ((c_sum, c_norms), rows_c, L.critic_clip)):
        want = _clipped_reference(rows, lambda x, C=C: L.release.clip_scale(x, C))
        _assert_close((s, n), want)
        assert 0 < int((want[1] > C).sum()) < len(mb)   # some users clipped, some not
        # the release's own clip of the rows (factor margin 1e-9): within the margin's 1e-5 of C per clipped user
        total, _ = clipped_total(rows, C)
        assert float((s - total).norm()) <= REL * float(total.norm()) + 2 * FUSED_MARGIN * C * len(mb)
    # the space's entry point, as PPO calls it, equals the engine's rows of the same objective clipped
    got = L.space.clipped_rows_sum(inputs, w, user, lambda x: L.release.clip_scale(x, L.clip), num_users=len(mb))
    _assert_close(got, (a_sum, a_norms))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_every_users_term_of_the_fused_actor_sum_has_norm_at_most_the_clip(env_id):
    """The sensitivity is unchanged: with every user clipped (large advantages, small C), user u's term of the
    fused sum (the same call with the other users' weights zeroed) has norm <= C, and the terms add up to the
    fused sum of all users."""
    L, t, mb = _minibatch(env_id, 0.05, adv_scale=100.0)
    inputs, w, user, _ = L.actor_rows(*L._actor_inputs(t, mb))
    C = 1e-3
    total, norms = L.space.clipped_rows_sum(inputs, w, user, lambda x: L.release.clip_scale(x, C), num_users=len(mb))
    assert bool((norms > C).all())
    terms = []
    for u in range(len(mb)):
        term, n = L.space.clipped_rows_sum(inputs, torch.where(user == u, w, 0.0), user,
                                           lambda x: L.release.clip_scale(x, C), num_users=len(mb))
        assert float(term.norm()) <= C, (u, float(term.norm()) / C - 1)
        assert float(n[u]) == pytest.approx(float(norms[u]), rel=REL)
        terms.append(term)
    assert float((torch.stack(terms).sum(0) - total).norm()) <= REL * float(total.norm())


def test_a_projected_actor_space_has_no_fused_path_and_the_round_falls_back_to_the_rows():
    from dppo.policies.spaces import make_space

    L = _learner(users=3, fused=True)
    L.space = make_space(L.policy, subspace="full", dim=4)
    t = L.round_targets(L.collect([0, 1, 2], 0))
    assert L.fused_sums(t, torch.arange(3)) is None
    d_actor, _, diag = L.release_minibatch(t, torch.arange(3), [0, 1, 2])
    assert d_actor.shape == (4,) and 0 <= diag["diag/clip_fraction"] <= 1


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_private_round_fused_gives_the_materialised_rounds_parameters(env_id):
    """One DP-PPO round (seeded noise, the same users and episodes; 2 epochs x 2 minibatches, C about the median
    norm) with ``fused`` on and off: the same ledger, and the same actor and critic to 1e-4 of their change."""
    runs = []
    for fused in (True, False):
        L = _learner(env_id, eps=3.0, users=6, group_size=2, epochs=2, minibatches=2, ent_coef=0.01,
                     max_grad_norm=0.05, critic_max_grad_norm=0.05, fused=fused)
        start = [p.detach().clone() for p in (*L.policy.parameters(), *L.critic.parameters())]
        stats = L.train_round(0)
        end = [p.detach().clone() for p in (*L.policy.parameters(), *L.critic.parameters())]
        runs.append((start, end, stats, L.privacy.ledger.entries))
    (s0, e0, st0, led0), (s1, e1, st1, led1) = runs
    assert led0 == led1
    assert all(torch.equal(a, b) for a, b in zip(s0, s1))
    assert st1["diag/clip_fraction"] > 0 and st0["diag/clip_fraction"] == st1["diag/clip_fraction"]
    change = torch.cat([(e - s).reshape(-1) for e, s in zip(e1, s1)])
    gap = torch.cat([(a - b).reshape(-1) for a, b in zip(e0, e1)])
    assert float(change.norm()) > 0
    assert float(gap.norm()) <= 1e-4 * float(change.norm()), float(gap.norm() / change.norm())


def test_by_default_a_minibatch_is_fused_only_when_its_rows_would_not_fit_in_memory(monkeypatch):
    """``fused`` null: small networks' rows are materialised (cheaper); a minibatch whose rows exceed
    ``PER_USER_MEMORY`` (here made tiny) takes the fused path; ``fused=false`` never, nor a minibatch with none of
    this rank's users (under torchrun every rank forms its own users' sum, fused or not)."""
    from dppo.algos import ppo

    L = _learner(users=4)
    assert L.fused is None and not L.fuses(4) and not L.fuses(0)
    monkeypatch.setattr(ppo, "PER_USER_MEMORY", 1)
    assert L.users_per_block() == 1 and L.fuses(2) and not L.fuses(1)
    assert not _learner(users=4, fused=False).fuses(4)
    always = _learner(users=4, fused=True)
    assert always.fuses(1) and not always.fuses(0)
    with pytest.raises(ConfigError, match="algo.fused"):
        _learner(users=4, fused="auto")
