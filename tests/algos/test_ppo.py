"""PPO / DP-PPO (dppo/algos/ppo.py): each per-user gradient against plain autograd of that user's own
objective, GAE against a naive loop, the user-level independence of the releases, the round's ledger,
and the config path (twin, resume)."""
import math

import pytest
import torch

from dppo.algos.ppo import PPO, gae, normalize_per_user
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.gym_env import GymEnvFactory
from dppo.errors import ConfigError
from dppo.policies.gaussian import GaussianMLPPolicy
from dppo.policies.mlp import MLPPolicy
from dppo.privacy import NoiseSource, PrivacyContext

TOL = dict(rtol=1e-4, atol=1e-6)


def _learner(env_id="CartPole-v1", eps=None, users=4, group_size=1, horizon=30, **kw):
    torch.manual_seed(0)
    env = GymEnvFactory(env_id, horizon=horizon)
    cont = env_id.startswith("Pendulum")
    policy = (GaussianMLPPolicy if cont else MLPPolicy)(env.observation_space, env.action_space, hidden_sizes=(8,))
    privacy = PrivacyContext(eps, 1e-5, noise=NoiseSource(0))
    kw.setdefault("critic_hidden_sizes", (8,))
    kw.setdefault("max_grad_norm", 1.0)
    return PPO(policy, env, privacy, OnePassUserSampler(users, seed=0), seed=0, rounds=5,
               reward_bound=16.3 if cont else 1.0, group_size=group_size, **kw)


def _perturb(module, scale=0.3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def _naive_actor(learner, obs, actions, mask, A, logp_old, group_size):
    """Row u: autograd of J_u = mean over user u's steps of min(rho A, clip(rho) A) + ent_coef H."""
    policy, eps_c = learner.policy, learner.clip_range
    rows = []
    for u in range(mask.shape[0] // group_size):
        sl = slice(u * group_size, (u + 1) * group_size)
        keep = mask[sl].reshape(-1)
        o, a = obs[sl].flatten(0, 1)[keep], actions[sl].flatten(0, 1)[keep]
        adv, old = A[sl].reshape(-1)[keep].float(), logp_old[sl].reshape(-1)[keep].float()
        policy.zero_grad()
        ratio = torch.exp(policy.log_prob(o, a) - old)
        surr = torch.minimum(ratio * adv, ratio.clamp(1 - eps_c, 1 + eps_c) * adv)
        if getattr(policy, "continuous", False):
            _, log_std = policy.mean_and_log_std(o)
            ent = log_std.sum(-1)              # the Gaussian entropy up to a constant
        else:
            lp = torch.log_softmax(policy.logits(o), -1)
            ent = -(lp.exp() * lp).sum(-1)
        J = (surr + learner.ent_coef * ent).mean()
        grads = torch.autograd.grad(J, [p for p in policy.parameters() if p.requires_grad])
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows).double()


@pytest.mark.parametrize("env_id,group_size,ent_coef", [("CartPole-v1", 1, 0.0), ("CartPole-v1", 2, 0.05),
                                                        ("Pendulum-v1", 1, 0.05), ("Pendulum-v1", 2, 0.0)])
def test_actor_per_user_gradients_equal_autograd_of_each_users_clipped_surrogate_plus_entropy(env_id, group_size,
                                                                                          ent_coef):
    """The engine's rows (surrogate weights rho A [not clipped], exact entropy rows) give, per user, the
    gradient of that user's own objective (ratios away from 1, some clipped)."""
    L = _learner(env_id, users=3, group_size=group_size, ent_coef=ent_coef)
    batch = L.collect([0, 1, 2], 0)
    with torch.no_grad():
        logp_old = L.policy.log_prob(batch.obs.flatten(0, 1), batch.actions.flatten(0, 1)).reshape(batch.mask.shape)
    _perturb(L.policy, 0.3)
    A = torch.randn(batch.mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * batch.mask
    n_u = batch.grouped(batch.lengths).sum(1).double()
    got, frac = L.actor_gradients(batch.obs, batch.actions, batch.mask, A, logp_old.double(), n_u, group_size)
    want = _naive_actor(L, batch.obs, batch.actions, batch.mask, A, logp_old, group_size)
    assert 0 < frac < 1
    torch.testing.assert_close(got.double(), want, **TOL)


def test_critic_per_user_gradients_equal_autograd_of_minus_each_users_value_loss():
    L = _learner(users=3, group_size=2)
    batch = L.collect([0, 1, 2], 0)
    _perturb(L.critic, 0.3)
    returns = torch.randn(batch.mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 20
    n_u = batch.grouped(batch.lengths).sum(1).double()
    got = L.critic_gradients(batch.obs, batch.mask, returns, n_u, 2)
    c = L.value_scale
    rows = []
    for u in range(3):
        keep = batch.mask[2 * u:2 * u + 2].reshape(-1)
        o = batch.obs[2 * u:2 * u + 2].flatten(0, 1)[keep]
        R = returns[2 * u:2 * u + 2].reshape(-1)[keep].float()
        loss = 0.5 * ((L.critic.value(o) - R / c) ** 2).mean()
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(-loss, list(L.critic.parameters()))]))
    torch.testing.assert_close(got.double(), torch.stack(rows).double(), **TOL)


def test_gae_equals_a_naive_loop_with_bootstrap_only_for_truncated_episodes():
    gen = torch.Generator().manual_seed(0)
    N, T, gamma, lam = 4, 7, 0.9, 0.8
    lengths = torch.tensor([7, 3, 5, 1])
    mask = torch.arange(T)[None] < lengths[:, None]
    r = torch.randn(N, T, generator=gen, dtype=torch.float64) * mask
    v = torch.randn(N, T, generator=gen, dtype=torch.float64)
    boot = torch.tensor([2.0, 0.0, -1.0, 0.5], dtype=torch.float64)   # 0: a terminal state
    got = gae(r, v, mask, boot, gamma, lam)
    for i in range(N):
        n = int(lengths[i])
        adv, nxt_adv = [0.0] * n, 0.0
        for t in reversed(range(n)):
            v_next = float(boot[i]) if t == n - 1 else float(v[i, t + 1])
            delta = float(r[i, t]) + gamma * v_next - float(v[i, t])
            nxt_adv = delta + gamma * lam * nxt_adv
            adv[t] = nxt_adv
        assert got[i, :n].tolist() == pytest.approx(adv, rel=1e-12, abs=1e-12)
        assert float(got[i, n:].abs().sum()) == 0.0


def test_the_explore_bonus_adds_exactly_its_discounted_per_step_range_growth_to_the_value_targets():
    """MountainCar, zero-initialised critic, lambda 1: R_t(c) - R_t(0) = c * sum_k gamma^k inc_{t+k}, with inc the
    per-step state-range bonus (dppo.algos.core.range_bonus_steps) recomputed here by a loop over the steps."""
    from dppo.algos.core import range_bonus_steps
    learners = [_learner("MountainCar-v0", users=3, horizon=40, gae_lambda=1.0, explore_bonus=c,
                         critic_normalize_obs=True) for c in (0.0, 10.0)]
    batch = learners[0].collect([0, 1, 2], 0)
    R0, R1 = (lrn.round_targets(batch)["returns"] for lrn in learners)
    space = learners[0].env.observation_space
    inc = range_bonus_steps(batch, space.low, space.high)
    assert float(inc.sum(1).min()) > 0          # every rollout covers some range
    gamma = learners[0].gamma
    for i in range(R0.shape[0]):
        n = int(batch.mask[i].sum())
        want, run = [0.0] * n, 0.0
        for t in reversed(range(n)):
            run = float(inc[i, t]) + gamma * run
            want[t] = 10.0 * run
        assert (R1[i, :n] - R0[i, :n]).tolist() == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_advantage_normalization_uses_each_users_own_steps_only():
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = torch.ones(6, 5, dtype=torch.bool)
    mask[1, 3:] = False
    A = A * mask
    for mode in ("scale", "standardize"):
        out = normalize_per_user(A, mask, users=3, mode=mode)
        B = A.clone()
        B[2:4] *= 100.0           # another user's advantages change ...
        out_b = normalize_per_user(B, mask, users=3, mode=mode)
        torch.testing.assert_close(out[:2], out_b[:2])   # ... user 0's are unchanged
        a = A[:2][mask[:2]]
        want = (a - a.mean()) / (a - a.mean()).pow(2).mean().sqrt() if mode == "standardize" else a / a.pow(2).mean().sqrt()
        torch.testing.assert_close(out[:2][mask[:2]], want, rtol=1e-6, atol=1e-8)
    assert torch.equal(normalize_per_user(A, mask, 3, "none"), A)


def test_a_users_per_user_gradients_do_not_depend_on_the_other_users_of_its_minibatch():
    """User 0's actor and critic rows are the same whatever the other users' data (to float tolerance)."""
    L = _learner(users=3, group_size=1, ent_coef=0.01)
    b1 = L.collect([0, 1, 2], 0)
    b2 = L.collect([0, 7, 8], 0)
    out = []
    for b in (b1, b2):
        A = torch.ones(b.mask.shape, dtype=torch.float64) * b.mask
        with torch.no_grad():
            old = L.policy.log_prob(b.obs.flatten(0, 1), b.actions.flatten(0, 1)).reshape(b.mask.shape).double()
        n_u = b.lengths.double()
        ga, _ = L.actor_gradients(b.obs, b.actions, b.mask, A, old, n_u, 1)
        gc = L.critic_gradients(b.obs, b.mask, A * 3, n_u, 1)
        out.append((ga[0], gc[0]))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("fused", [True, False])
def test_a_private_round_records_one_composed_release_and_every_user_is_in_one_minibatch_per_epoch(fused):
    """Fused: every sum reaches the release as a clipped total (``release_clipped_sum``); not fused: as rows."""
    L = _learner(eps=3.0, users=6, epochs=3, minibatches=2, fused=fused)
    seen, other = [], []
    rows, totals = L.release.release_sum, L.release.release_clipped_sum

    def spy_rows(per_user, users, clip, part=None):
        (other if fused else seen).append((tuple(users), clip))
        return rows(per_user, users, clip, part=part)

    def spy_totals(total, norms, users, clip, part=None):
        (seen if fused else other).append((tuple(users), clip))
        assert len(norms) == len(users)
        return totals(total, norms, users, clip, part=part)

    L.release.release_sum, L.release.release_clipped_sum = spy_rows, spy_totals
    stats = L.train_round(0)
    assert not other
    entries = L.privacy.ledger.entries
    assert len(entries) == 1 and entries[0]["releases_per_user"] == 6 and entries[0]["users"] == 6
    assert L.privacy.spent()[0] == pytest.approx(3.0)
    assert len(seen) == 3 * 2 * 2      # epochs x minibatches x (actor, critic)
    for epoch in range(3):
        part = [set(u) for u, c in seen[4 * epoch:4 * epoch + 4:2]]
        assert set.union(*part) == set(range(6)) and sum(len(p) for p in part) == 6
    assert stats["privacy/noise_multiplier"] == pytest.approx(L.release.noise_multiplier)
    assert math.isfinite(stats["losses/actor_update_norm"])


def test_the_twin_runs_the_same_update_without_noise_or_ledger():
    L = _learner(eps=None, users=4)
    L.train_round(0)
    assert not L.privacy.ledger.entries and L.release.mechanism == "none"


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="minibatches"):
        _learner(users=2, minibatches=3)
    with pytest.raises(ConfigError, match="adv_norm"):
        _learner(adv_norm="batch")


def test_correlated_exploration_keeps_every_uniform_exactly_uniform_and_correlates_neighbours():
    """action_noise_corr = rho: z_t = Phi^-1(u_t) is a stationary AR(1) process, N(0, 1) at every t with
    lag-1 correlation rho (checked against its definition by a direct recursion on the same normals)."""
    L = _learner(action_noise_corr=0.9)
    u = L.collector.user_uniforms(torch.Generator().manual_seed(0), (4000, 40))
    e = torch.randn((4000, 40), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    z = torch.empty_like(e)
    z[:, 0] = e[:, 0]
    for t in range(1, 40):
        z[:, t] = 0.9 * z[:, t - 1] + math.sqrt(1 - 0.81) * e[:, t]
    torch.testing.assert_close(torch.special.ndtri(u), z, rtol=1e-6, atol=1e-6)
    assert float(z[:, -1].std()) == pytest.approx(1.0, abs=0.05)
    assert float((z[:, 1:] * z[:, :-1]).mean()) == pytest.approx(0.9, abs=0.03)
    white = _learner().collector.user_uniforms(torch.Generator().manual_seed(0), (3, 5))
    assert torch.equal(white, torch.rand((3, 5), generator=torch.Generator().manual_seed(0), dtype=torch.float64))


def test_user_horizon_cuts_the_users_episodes_and_bootstraps_them_while_evaluation_keeps_the_full_horizon():
    """user_horizon = 6 on a 30-step CartPole: every training episode has <= 6 steps, a 6-step episode is
    truncated (bootstrapped), not terminated; the collector's public rollouts (evaluation) keep horizon 30."""
    L = _learner(users=4, user_horizon=6)
    batch = L.collect(list(range(4)), 0)
    assert int(batch.lengths.max()) <= 6 and batch.mask.shape[-1] == 6
    full = batch.lengths == 6
    assert full.any() and not bool(batch.terminated[full].any())
    assert L.env.horizon == 30 and L.collector.engine.factory.horizon == 30
    assert L.collector.user_engine.factory.horizon == 6
    assert L.collector.public(L.policy, "eval", 0, 4).mask.shape[-1] > 6
    L.update(batch, 0, list(range(4)))
    with pytest.raises(ConfigError, match="user_horizon"):
        _learner(user_horizon=0)
    with pytest.raises(ConfigError, match="optimizer"):
        _learner(optimizer="rmsprop")


@pytest.mark.parametrize("overrides,match", [
    (["env=riverswim"], "tabular MDP"),
    (["policy.subspace=head"], "subspace=full"),
    (["algo.momentum=0.5"], "optimizer=sgd"),
    (["algo.adam_eps=1e-8", "algo.optimizer=sgd"], "optimizer=adam"),
])
def test_the_configuration_path_refuses_envs_ppo_cannot_learn_and_dead_keys_in_one_line(overrides, match, tmp_path):
    import dppo

    with pytest.raises(ConfigError, match=match):
        dppo.train(["algo=ppo", "rounds=1", "progress=false", *overrides], run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_ppo_defaults_live_in_the_learner_signature_and_the_twin_differs_only_by_eps():
    """conf/algo/dp_ppo.yaml names only the target; algo=ppo is the same learner with eps=null."""
    import dppo

    private, twin = dppo.make_config(["algo=dp_ppo"]), dppo.make_config(["algo=ppo"])
    assert dict(private.algo) == dict(twin.algo) == {"_target_": "dppo.algos.ppo.PPO"}
    assert private.eps == 5.0 and twin.eps is None
    assert PPO.defaults()["lr"] == 0.01 and PPO.defaults()["epochs"] == 4


def test_tail_average_makes_the_final_actor_the_mean_of_the_last_rounds_iterates():
    """average_last=3 (the base learner's tail averaging, as NPG's): rounds 0..4 run exactly as the last-iterate
    learner's (same seeded noise), and after round 4 the actor is the mean of its parameters after rounds 2, 3, 4."""
    plain = _learner(eps=3.0, average_last=0)
    iterates = []
    for r in range(5):
        plain.train_round(r)
        iterates.append(torch.cat([p.detach().double().reshape(-1) for p in plain.space.params]))
    averaged = _learner(eps=3.0, average_last=3)
    for r in range(5):
        averaged.train_round(r)
    final = torch.cat([p.detach().double().reshape(-1) for p in averaged.space.params])
    torch.testing.assert_close(final, torch.stack(iterates[2:]).mean(0), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(final, iterates[-1])
