"""Multi-pass DP-PPO (privacy.multi_pass=true): Poisson-sampled users, one subsampled-Gaussian ledger entry per
round, the eps the run prints recomputed with Opacus' RDP accountant from the ledger, a round that draws nobody (its
sums are noise only, still accounted), and several minibatches: each user's minibatch a public draw of its own (no
neighbour moves it), each user in one minibatch per epoch moving each of its releases by at most C, the same ledger
and eps as one minibatch."""
import itertools

import pytest
import torch
from opacus.accountants import RDPAccountant as OpacusRDP

import dppo
from dppo.algos.ppo import PPO
from dppo.audit.dp_ppo import build_round
from dppo.data import streams
from dppo.data.sampler import PoissonUserSampler
from dppo.envs.gym_env import GymEnvFactory
from dppo.policies.mlp import MLPPolicy
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants.opacus import RDPAccountant
from dppo.privacy.composed import ComposedGaussianSums, Poisson

RUN = ["algo=dp_ppo", "eps=3", "privacy.multi_pass=true", "privacy.population_size=40", "users_per_round=8",
       "rounds=4", "privacy.secure_rng=false", "algo.minibatches=1", "algo.epochs=2", "env.horizon=30",
       "eval_episodes=2", "progress=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The run RUN with algo.minibatches 1 and 2 (summaries)."""
    out = {}
    for b in (1, 2):
        args = [a for a in RUN if not a.startswith("algo.minibatches")] + [f"algo.minibatches={b}"]
        out[b] = dppo.train(args, run_dir=str(tmp_path_factory.mktemp(f"mb{b}") / "run"))
    return out


def test_the_printed_eps_is_the_accountants_recomputed_from_the_ledger(runs):
    summary = runs[1]
    ledger = summary["ledger"]
    assert len(ledger) == 4 and {e["mechanism"] for e in ledger} == {"poisson_composed_gaussian_sum"}
    assert all(e["adjacency"] == "add_remove" and e["sample_rate"] == pytest.approx(0.2) for e in ledger)
    assert all(e["releases_per_user"] == 4 for e in ledger)   # 2 x epochs
    direct = OpacusRDP()
    direct.history = [(e["noise_multiplier"], e["sample_rate"], 1) for e in ledger]
    eps = direct.get_epsilon(1e-5)
    assert summary["epsilon_spent"] == pytest.approx(eps, rel=1e-9) and 2.8 < eps <= 3.0 + 1e-9


def test_two_minibatches_keep_the_ledger_and_the_eps_of_one(runs):
    """The same (q, z_round, k = 2 x epochs) every round, so the accountant's eps is the one of minibatches=1
    (``dppo.privacy.composed.Poisson``'s docstring derives it); the run steps twice per epoch and finishes."""
    one, two = runs[1], runs[2]
    assert two["ledger"] == one["ledger"]
    assert two["epsilon_spent"] == one["epsilon_spent"]
    direct = OpacusRDP()
    direct.history = [(e["noise_multiplier"], e["sample_rate"], 1) for e in two["ledger"]]
    assert two["epsilon_spent"] == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)
    assert two["policy_sha256"] != one["policy_sha256"]   # other steps: another policy
    assert torch.isfinite(torch.tensor(float(two["final_return"])))


def _multi_pass_learner(minibatches: int, epochs: int = 2, population: int = 8, **kw):
    privacy = PrivacyContext(1.0, 1e-5, accountant=RDPAccountant(), noise=NoiseSource(7, secure=False),
                             multi_pass=True, population_size=population)
    return build_round(1.0, 1e-5, users=4, epochs=epochs, minibatches=minibatches, privacy=privacy,
                       sampler=PoissonUserSampler(4, population, seed=0), rounds=1, **kw)


def _assignment(learner, round_idx: int, ids: list[int]) -> list[dict]:
    """Per epoch, {user id: its minibatch} from the learner's schedule of the sample ``ids``; checks that every
    sampled user is in exactly one minibatch and that each minibatch's positions are sorted."""
    out = []
    for epoch in learner.schedule(round_idx, ids):
        assert len(epoch) == learner.minibatches
        where = {}
        for j, mb in enumerate(epoch):
            assert torch.equal(mb, mb.sort().values)
            for i in mb.tolist():
                assert ids[i] not in where   # in one minibatch only
                where[ids[i]] = j
        assert sorted(where) == sorted(ids)   # every sampled user in one
        out.append(where)
    return out


def test_no_user_moves_another_users_minibatch():
    """Brute force over every sample S of a population of 8 and each neighbour S + {v} / S - {v}: every user in both
    has the same minibatch in every epoch of rounds 0 and 5, for 2 and 3 minibatches."""
    pop = range(8)
    for b in (2, 3):
        learner, _, _ = _multi_pass_learner(b, epochs=3, population=8)
        for r in (0, 5):
            cache = {}
            for size in range(9):
                for S in itertools.combinations(pop, size):
                    cache[S] = _assignment(learner, r, list(S))
            for S, got in cache.items():
                for v in pop:
                    nb = tuple(sorted(set(S) ^ {v}))
                    for a, c in zip(got, cache[nb]):
                        assert all(a[u] == c[u] for u in S if u != v), (b, r, S, v)


def test_each_users_minibatch_is_uniform_and_a_function_of_its_own_key():
    """The draw of one user alone equals its draw among 20000 others, and about 1 / b of the users fall in each of
    the b minibatches (20000 users: sd 0.0035 for b = 2)."""
    ids = list(range(20_000))
    for b in (2, 3):
        draws = streams.user_minibatches(3, 1, 0, ids, b)
        assert all(int(streams.user_minibatches(3, 1, 0, [u], b)[0]) == int(draws[u]) for u in (0, 17, 19_999))
        for j in range(b):
            assert abs(float((draws == j).double().mean()) - 1 / b) < 0.02
    assert not torch.equal(streams.user_minibatches(3, 1, 0, ids[:64], 2), streams.user_minibatches(3, 1, 1, ids[:64], 2))


def _releases(learner, t, present: list[int]) -> list[tuple[torch.Tensor, torch.Tensor, set]]:
    """The round's (actor sum, critic sum, users) of every minibatch step of the sample ``present`` (a fresh seeded
    context: the same noise draws for every sample), all at the round's starting parameters; positions index t,
    the targets of users 0..3 (per-user, so those of a subset are its rows)."""
    learner.release.privacy = PrivacyContext(1.0, 1e-5, accountant=RDPAccountant(), noise=NoiseSource(11, secure=False),
                                             multi_pass=True, population_size=8)
    learner.release.open_round(0, present, (learner.clip, learner.critic_clip))
    out = []
    for epoch in learner.schedule(0, present):
        for mb in epoch:
            members = [present[i] for i in mb.tolist()]
            d_actor, d_critic, _ = learner.release_minibatch(t, torch.tensor(members, dtype=torch.long), members)
            out.append((d_actor, d_critic, set(members)))
    return out


@pytest.mark.parametrize("fused", [False, True])
def test_removing_a_user_moves_only_its_own_releases_and_each_by_at_most_C(fused):
    """minibatches=2, add/remove: for each user u of a sample of 4 (every vector over its clip norm, the worst
    case), the round's releases with and without u (the same noise) differ only in the 2 x epochs sums of u's
    minibatches, each by u's clipped vector (norm <= C, here about C); every other sum is unchanged."""
    learner, batch, _ = _multi_pass_learner(2, epochs=3)
    learner.fused = fused
    t = learner.round_targets(batch)
    everyone = [0, 1, 2, 3]
    full = _releases(learner, t, everyone)
    for u in everyone:
        without = _releases(learner, t, [v for v in everyone if v != u])
        assert len(without) == len(full) == learner.epochs * 2
        assert sum(u in members for _, _, members in full) == learner.epochs   # one minibatch per epoch
        for (a, c, members), (a2, c2, members2) in zip(full, without):
            assert members2 == members - {u}
            da, dc = float((a - a2).norm()), float((c - c2).norm())
            if u in members:
                assert 0.9 * learner.clip < da <= learner.clip * (1 + 1e-9)
                assert 0.9 * learner.critic_clip < dc <= learner.critic_clip * (1 + 1e-9)
            else:
                assert da <= 1e-12 and dc <= 1e-12


def _tiny_round_learner(minibatches: int = 1):
    """A seeded multi-pass DP-PPO on a 20-step CartPole (a 4-unit actor and critic), q N = 8 of 40 users."""
    torch.manual_seed(0)
    env = GymEnvFactory("CartPole-v1", horizon=20)
    policy = MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    privacy = PrivacyContext(3.0, 1e-5, accountant=RDPAccountant(), noise=NoiseSource(0, secure=False),
                             multi_pass=True, population_size=40)
    sampler = PoissonUserSampler(8, 40, seed=0)
    learner = PPO(policy, env, privacy, sampler, seed=0, rounds=4, max_grad_norm=1.0, group_size=1, epochs=2,
                  minibatches=minibatches, critic_hidden_sizes=(4,), reward_bound=1.0)
    return learner, policy, privacy, sampler


def test_a_multi_pass_round_with_two_minibatches_steps_twice_per_epoch_and_divides_by_q_N_over_b():
    learner, _, privacy, sampler = _tiny_round_learner(minibatches=2)
    assert isinstance(learner.release.sampling, Poisson) and learner.release.batch_size(3, 2) == 4.0   # q N / b
    users = sampler.next_round()
    stats = learner.update(learner.collect(users, 0), 0, users)
    steps = {int(s["step"]) for s in learner.optimizer.state.values()}
    assert steps == {4} and len(privacy.ledger) == 1   # epochs x minibatches Adam steps, one ledger entry
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())


def test_a_round_that_draws_nobody_releases_noise_only_and_is_accounted():
    learner, policy, privacy, _ = _tiny_round_learner()
    before = [p.detach().clone() for p in policy.parameters()]
    stats = learner.update(None, 0, [])
    # the entry records the expected count q N = 8 (public), not the realised 0 (private under add/remove)
    assert len(privacy.ledger) == 1 and privacy.ledger.entries[0]["users"] == 8
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))   # it stepped along the noise
    assert stats["losses/actor_update_norm"] > 0 and "diag/value_error" not in stats
