"""The native ICU-Sepsis vector env: its transition and start-state laws are the tables', each patient's episode
is a function of its own seed alone, partial resets, NEXT_STEP autoreset, truncation and the terminate strategy.

The law checks compare counts with Bernstein's inequality: a cell of probability p among n independent draws
is off by more than t with probability at most 2 exp(-t^2 / (2 (n p (1 - p) + t / 3))); t is set so that this
is DELTA = 1e-9 per cell, so a correct law fails one of the (at most a few thousand) cells checked in this
file with probability below 1e-5 over the choice of seeds (the draws are deterministic given the seeds).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dppo.envs.icu_sepsis_vector import ICUSepsisVectorEnv, seed_keys, splitmix64, uniforms

DELTA = 1e-9


def toy_tables(S=7, A=3, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(S) * 0.3, size=(S, A))
    P[P < 0.02] = 0.0                       # some zero cells, which must never be drawn
    P /= P.sum(-1, keepdims=True)
    R = (rng.random((S, A, S)) < 0.2).astype(np.float64)
    admissible = rng.random((S, A)) < 0.7
    d0 = rng.dirichlet(np.ones(S))
    d0[[1, S - 2, S - 1]] = 0.0             # no start in a terminal state
    return dict(P=P, R=R, d0=d0 / d0.sum(), admissible=admissible, terminal=[S - 2, S - 1], death=S - 2)


def assert_law(counts: np.ndarray, p: np.ndarray) -> None:
    """Every cell's count within the Bernstein bound of n p (DELTA per cell); zero-probability cells empty."""
    n = counts.sum()
    var = n * p * (1 - p)
    c = math.log(2 / DELTA)
    t = c / 3 + np.sqrt((c / 3) ** 2 + 2 * var * c)
    bad = np.flatnonzero((np.abs(counts - n * p) > t) | ((p == 0) & (counts > 0)))
    assert not len(bad), [(int(j), int(counts[j]), float(n * p[j]), float(t[j])) for j in bad[:5]]


def next_state_counts(t: dict, s: int, a: int, n: int, seed0: int = 10_000, **kw) -> np.ndarray:
    env = ICUSepsisVectorEnv(n, tables=t, **kw)
    env.reset_seeds(range(seed0, seed0 + n))
    env.states[:] = s                        # every patient in state s, all taking action a
    obs, *_ = env.step(np.full(n, a))
    return np.bincount(obs, minlength=t["P"].shape[0])


def run_slot(env: ICUSepsisVectorEnv, slot: int, steps: int, rule) -> list[tuple]:
    """Step ``env`` with ``rule(obs)`` for every sub-env and record sub-env ``slot``'s (obs, r, term, trunc)."""
    obs = env.states.copy()
    out = []
    for _ in range(steps):
        obs, r, te, tr, _ = env.step(rule(obs))
        out.append((int(obs[slot]), float(r[slot]), bool(te[slot]), bool(tr[slot])))
    return out


def test_the_generator_is_splitmix64_and_its_uniforms_lie_in_0_1():
    # the reference splitmix64 output on state 0 + golden (its first output from seed 0)
    assert int(splitmix64(np.array([0x9E3779B97F4A7C15], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF
    keys = seed_keys(range(1000))
    u = uniforms(np.repeat(keys, 50), np.tile(np.arange(50, dtype=np.uint64), 1000))
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.01
    with pytest.raises(ValueError):
        seed_keys([-1])


@pytest.mark.parametrize("strategy", ["mean", "terminate"])
def test_the_next_state_law_is_the_tables_row(strategy):
    t = toy_tables()
    for s, a in [(0, 0), (2, 1), (4, 2), (3, 0)]:
        counts = next_state_counts(t, s, a, 100_000, inadmissible_action_strategy=strategy)
        if strategy == "terminate" and not t["admissible"][s, a]:
            assert counts[t["death"]] == counts.sum()
        else:
            assert_law(counts, t["P"][s, a])


def test_the_start_state_law_is_d0():
    t = toy_tables()
    env = ICUSepsisVectorEnv(200_000, tables=t)
    assert_law(np.bincount(env.reset_seeds(range(200_000)), minlength=7), t["d0"])


def test_the_package_laws():
    pytest.importorskip("icu_sepsis")
    from dppo.envs.icu_sepsis_vector import package_tables

    t = package_tables()
    S = t["P"].shape[0]
    env = ICUSepsisVectorEnv(100_000)
    assert_law(np.bincount(env.reset_seeds(range(7, 100_007)), minlength=S), np.asarray(t["d0"], float))
    for s, a in [(0, 0), (100, 12), (350, 24), (600, 5)]:
        env.reset_seeds(range(s * 1000, s * 1000 + 100_000))
        env.states[:] = s
        obs, r, *_ = env.step(np.full(100_000, a))
        assert_law(np.bincount(obs, minlength=S), t["P"][s, a])
        assert np.array_equal(r, t["R"][s, a, obs])


@pytest.mark.parametrize("strategy", ["mean", "terminate"])
def test_a_patients_episodes_depend_only_on_its_seed(strategy):
    t = toy_tables()
    rule = lambda obs: (2 * obs + 1) % 3  # noqa: E731 - a fixed action rule on the observations
    kw = dict(tables=t, max_episode_steps=6, inadmissible_action_strategy=strategy)
    seed, steps = 4242, 80

    alone = ICUSepsisVectorEnv(1, **kw)
    alone.reset_seeds([seed])
    want = run_slot(alone, 0, steps, rule)
    assert any(te for _, _, te, _ in want) and any(tr for *_, tr in want)   # autoresets of both kinds happen

    big = ICUSepsisVectorEnv(9, **kw)                  # another slot, another batch size, other neighbours
    big.reset_seeds([1, 2, 3, 4, 5, seed, 6, 7, 8])
    assert run_slot(big, 5, steps, rule) == want

    other = ICUSepsisVectorEnv(4, **kw)                # after a partial reset into a running batch
    other.reset_seeds([11, 12, 13, 14])
    run_slot(other, 0, 13, rule)
    obs, info = other.reset(seed=[0, 0, seed, 0], options={"reset_mask": np.array([False, False, True, False])})
    assert info == {} and obs[2] == alone.reset_seeds([seed])[0]
    assert run_slot(other, 2, steps, rule) == want

    different = ICUSepsisVectorEnv(1, **kw)
    different.reset_seeds([seed + 1])
    assert run_slot(different, 0, steps, rule) != want


def test_partial_reset_restarts_only_the_masked_sub_envs():
    t = toy_tables()
    rule = lambda obs: obs % 3  # noqa: E731
    a, b = ICUSepsisVectorEnv(6, tables=t, max_episode_steps=50), ICUSepsisVectorEnv(6, tables=t, max_episode_steps=50)
    seeds = [20, 21, 22, 23, 24, 25]
    a.reset_seeds(seeds)
    b.reset_seeds(seeds)
    for _ in range(4):
        a.step(rule(a.states))
        b.step(rule(b.states))
    a.prev_done[1] = True                            # a pending autoreset that the partial reset clears
    b.prev_done[1] = True
    mask = np.array([False, True, False, True, False, False])
    before = a.states.copy()
    obs, _ = a.reset(seed=[0, 77, 0, 78, 0, 0], options={"reset_mask": mask})
    fresh = ICUSepsisVectorEnv(2, tables=t).reset_seeds([77, 78])
    assert np.array_equal(obs[~mask], before[~mask]) and np.array_equal(obs[mask], fresh)
    assert np.array_equal(a.steps[mask], [0, 0]) and not a.prev_done[1]
    for _ in range(30):                              # the unmasked sub-envs go on exactly as without the reset
        oa, ra, ta, ua, _ = a.step(rule(a.states))
        ob, rb, tb, ub, _ = b.step(rule(b.states))
        for x, y in [(oa, ob), (ra, rb), (ta, tb), (ua, ub)]:
            assert np.array_equal(x[~mask], y[~mask])

    c = ICUSepsisVectorEnv(3, tables=t)              # an int seed: sub-env i from seed + i; an empty mask: no-op
    c.reset(seed=5)
    state = c.states.copy()
    assert np.array_equal(c.reset(seed=9, options={"reset_mask": np.zeros(3, bool)})[0], state)
    obs, _ = c.reset(seed=9, options={"reset_mask": np.array([False, False, True])})
    assert obs[2] == ICUSepsisVectorEnv(1, tables=t).reset_seeds([11])[0] and np.array_equal(obs[:2], state[:2])
    with pytest.raises(ValueError):
        c.reset(seed=9, options={"reset_mask": np.array([1, 0, 1])})


def test_next_step_autoreset_and_truncation():
    t = toy_tables()
    env = ICUSepsisVectorEnv(64, tables=t, max_episode_steps=5)
    env.reset_seeds(range(64))
    steps = np.zeros(64, dtype=int)
    done_prev = np.zeros(64, dtype=bool)
    seen_term = seen_trunc = False
    for _ in range(40):
        prev = env.states.copy()
        obs, r, te, tr, _ = env.step(np.zeros(64, dtype=np.int64))
        # a sub-env that ended on the previous step starts afresh: no reward, no termination, step count 0
        assert not te[done_prev].any() and not tr[done_prev].any() and (r[done_prev] == 0).all()
        assert not np.isin(obs[done_prev], t["terminal"]).any()
        steps = np.where(done_prev, 0, steps + 1)
        live = ~done_prev
        assert np.array_equal(r[live], t["R"][prev[live], 0, obs[live]])
        assert np.array_equal(te[live], np.isin(obs[live], t["terminal"]))
        assert np.array_equal(tr, (steps >= 5) & ~te)   # truncated exactly at the limit, unless terminated
        seen_term |= te.any()
        seen_trunc |= tr.any()
        done_prev = te | tr
    assert seen_term and seen_trunc


def test_the_terminate_strategy_sends_inadmissible_actions_to_death():
    t = toy_tables()
    s, a = map(int, np.argwhere(~t["admissible"][:5])[0])
    env = ICUSepsisVectorEnv(10, tables=t, inadmissible_action_strategy="terminate")
    env.reset_seeds(range(10))
    env.states[:] = s
    obs, r, te, tr, _ = env.step(np.full(10, a))
    assert (obs == t["death"]).all() and te.all() and not tr.any() and (r == t["R"][s, a, t["death"]]).all()
    with pytest.raises(ValueError):
        ICUSepsisVectorEnv(2, tables=t, inadmissible_action_strategy="raise")
    with pytest.raises(ValueError):
        env.step(np.full(10, 3))


def test_the_native_env_runs_the_rollout_and_each_patient_follows_its_seed():
    pytest.importorskip("icu_sepsis")
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.envs.rollout import RolloutEngine
    from dppo.policies.auto import auto_policy

    native = GymEnvFactory("icu_sepsis:Sepsis/ICU-Sepsis-v2")
    pi = auto_policy(native.observation_space, native.action_space, hidden_sizes=[8])
    seeds = list(range(500, 540))
    u = torch.rand(len(seeds), 500, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = RolloutEngine(native).run(pi, seeds, u, reward_bound=None)
    b = RolloutEngine(native).run(pi, seeds[25:], u[25:], reward_bound=None)   # the same patients, fewer
    assert a.mask.sum() > 0
    for field in ("obs", "actions", "rewards", "mask", "terminated", "final_obs"):
        x, y = getattr(a, field)[25:], getattr(b, field)
        width = min(x.shape[1], y.shape[1]) if x.dim() > 1 else None
        assert torch.equal(x[:, :width] if width else x, y[:, :width] if width else y), field
