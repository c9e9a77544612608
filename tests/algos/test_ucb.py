"""UBEV / PUCB: planning against a naive per-state implementation, privacy bookkeeping, regret, resume."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from dppo.algos.ucb import PUCB, UBEV, _backward
from dppo.data.sampler import OnePassUserSampler
from dppo.envs.tabular import TabularMDP, random_mdp, riverswim
from dppo.errors import ConfigError, PrivacyError
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ctx(eps, seed=0):
    return PrivacyContext(eps, accountant=make_accountant("basic"), noise=NoiseSource(seed))


def _naive_ubev_q(l, n, m, S, A, H, delta):
    """UBEV's planning written literally, one (h, s, a) at a time (Dann et al. 2017, Alg. 1)."""
    Q = np.zeros((H, S, A))
    V = np.zeros(S)
    for h in reversed(range(H)):        # 1-based step h+1, so the width factor is H - (h + 1)
        Vn = np.zeros(S)
        for s in range(S):
            for a in range(A):
                c = n[h, s, a]
                if c == 0:
                    Q[h, s, a] = 1 + V.max()
                    continue
                phi = math.sqrt((2 * math.log(math.log(max(math.e, c))) + math.log(18 * S * A * H / delta)) / c)
                v_next = sum(m[h, s, a, s2] * V[s2] for s2 in range(S)) / c
                Q[h, s, a] = min(1, l[h, s, a] / c + phi) + min(V.max(), v_next + (H - (h + 1)) * phi)
            Vn[s] = Q[h, s].max()
        V = Vn
    return Q


def _naive_privq(l, n, m, S, A, H, E, T, beta_p):
    """PrivQ (Vietri et al. 2020, Alg. 3) one (h, s, a) at a time, with Q~ projected on [0, inf)."""
    Q = np.zeros((H, S, A))
    V = np.zeros(S)
    for h in reversed(range(H)):
        Vn = np.zeros(S)
        for s in range(S):
            for a in range(A):
                c = n[h, s, a]
                if c >= 2 * E and c > 0:
                    phi = math.sqrt(2 * math.log(T / beta_p) / max(c - E, 1))
                    psi = (1 + S * H) * (3 * E / c + 2 * E * E / (c * c))
                    conf = (H + 1) * phi + psi
                    q = max(0.0, (l[h, s, a] + sum(m[h, s, a, s2] * V[s2] for s2 in range(S))) / c)
                else:
                    conf, q = H, 0.0
                Q[h, s, a] = min(H, q + conf)
            Vn[s] = Q[h, s].max()
        V = Vn
    return Q


def _run(learner, rounds):
    out = []
    for r in range(rounds):
        out.append(learner.train_round(r))
    return out


def test_ubev_planning_matches_naive_implementation():
    mdp = random_mdp(S=4, A=3, H=5, seed=0)
    ubev = UBEV(mdp, privacy=_ctx(None), seed=1, episodes=12, episodes_per_round=12)
    ubev.train_round(0)
    l, n, m = (np.array(x) for x in ubev.released_stats())
    assert (n == 0).any() and (n >= 3).any()         # both branches are exercised
    np.testing.assert_allclose(ubev.q_values(), _naive_ubev_q(l, n, m, 4, 3, 5, 0.05), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bound,eps", [("reference", 100.0), ("tree", 30.0)])
def test_pucb_planning_matches_naive_privq(bound, eps):
    mdp = random_mdp(S=3, A=2, H=3, seed=2)
    pucb = PUCB(mdp, privacy=_ctx(eps), seed=0, episodes=3000, episodes_per_round=3000,
                count_error_bound=bound)
    pucb.train_round(0)
    l, n, m = (np.array(x) for x in pucb.released_stats())
    gate = n >= 2 * pucb.E
    assert gate.any() and (~gate).any()
    naive = _naive_privq(l, n, m, 3, 2, 3, pucb.E, 3000, pucb.beta_prime)
    np.testing.assert_allclose(pucb.q_values(), naive, rtol=1e-10, atol=1e-10)


def test_pucb_with_every_count_below_2E_plans_the_constant_H():
    mdp = random_mdp(S=3, A=2, H=3, seed=2)
    pucb = PUCB(mdp, privacy=_ctx(1.0), seed=0, episodes=200, episodes_per_round=200)
    pucb.train_round(0)
    l, n, m = (np.array(x) for x in pucb.released_stats())
    assert (n < 2 * pucb.E).all() and pucb.gate_open_fraction() == 0.0
    naive = _naive_privq(l, n, m, 3, 2, 3, pucb.E, 200, pucb.beta_prime)
    np.testing.assert_array_equal(pucb.q_values(), naive)
    np.testing.assert_array_equal(naive, np.full((3, 3, 2), 3.0))


def test_numpy_and_torch_backward_induction_agree():
    g = torch.Generator().manual_seed(0)
    H, S, A = 4, 5, 3
    m = torch.randint(0, 5, (H, S, A, S), generator=g).double()
    n = m.sum(-1)
    r = torch.rand(H, S, A, generator=g, dtype=torch.float64)
    bonus = torch.rand(H, S, A, generator=g, dtype=torch.float64)
    inv = 1 / n.clamp_min(1)
    for mode in ("ubev", "pucb"):
        qt = _backward(torch, m, inv, bonus, r, mode=mode, cap=float(H))
        qn = _backward(np, m.numpy(), inv.numpy(), bonus.numpy(), r.numpy(), mode=mode, cap=float(H))
        np.testing.assert_allclose(qt.numpy(), qn, rtol=1e-13)


def _reference_ubev_q(l, n, m, S, A, H, delta):
    """UBEV's plan exactly as the generic (vectorized, un-cached) code computes it."""
    nn = np.where(n > 0, n, 1.0)
    lnln = np.log(np.log(np.where(n > math.e, n, math.e)))
    phi = np.sqrt((2 * lnln + math.log(18 * S * A * H / delta)) / nn)
    phi = np.where(n > 0, phi, 1e30)
    r_part = np.minimum(l / nn + phi, 1.0)
    width = np.arange(H - 1, -1, -1, dtype=np.float64).reshape(H, 1, 1) * phi
    return _backward(np, m, 1.0 / nn, width, r_part, mode="ubev")


@pytest.mark.parametrize("S,A,H", [(6, 2, 20), (4, 3, 5), (3, 1, 4), (5, 6, 3), (70, 2, 3)])
def test_ubev_fast_plan_is_bit_identical_to_the_generic_induction(S, A, H):
    """The CPU planner (count-indexed phi table, preallocated buffers) gives the same floats as the
    generic code, including counts far beyond the table's first size (it grows) and n = 0."""
    mdp = random_mdp(S=S, A=A, H=H, seed=3)
    ubev = UBEV(mdp, privacy=_ctx(None), seed=0, episodes=10, episodes_per_round=10)
    g = torch.Generator().manual_seed(S * 100 + A)
    for scale in (3, 40, 300_000):          # small counts, then counts that force the table to grow
        m = torch.randint(0, scale, (H, S, A, S), generator=g).double()
        m[torch.rand(H, S, A, generator=g) < 0.3] = 0.0         # unvisited pairs
        n = m.sum(-1)
        l = torch.floor(torch.rand(H, S, A, generator=g, dtype=torch.float64) * (n + 1))
        k = H * S * A
        ubev.stats.counts.copy_(torch.cat([l.reshape(-1), n.reshape(-1), m.reshape(-1)]))
        ref = _reference_ubev_q(l.numpy(), n.numpy(), m.numpy(), S, A, H, 0.05)
        assert (n == 0).any() and (scale < 300_000 or n.max() > 4096)   # n = 0 and a grown table
        np.testing.assert_array_equal(ubev.q_values(), ref)
        np.testing.assert_array_equal(ubev.q_values(), ref)        # again: buffers reused, same result


@pytest.mark.parametrize("algo", ["ubev", "pucb"])
def test_torch_planning_path_runs_the_same_episodes(algo, monkeypatch):
    """The tensor path (used off CPU) forced on CPU: same policies, hence the same regret."""
    def make():
        cls = UBEV if algo == "ubev" else PUCB
        return cls(riverswim(5), privacy=_ctx(None), seed=2, episodes=300, episodes_per_round=100)   # PUCB: gates open

    a, b = make(), make()
    monkeypatch.setattr(b, "_xp", lambda: torch)
    monkeypatch.setattr(b, "_view", lambda t: t)
    ra, rb = _run(a, 3), _run(b, 3)
    assert isinstance(b.q_values(), torch.Tensor) and isinstance(a.q_values(), np.ndarray)
    np.testing.assert_allclose(b.q_values().numpy(), a.q_values(), rtol=1e-12, atol=1e-12)
    assert [r["regret/cumulative"] for r in rb] == pytest.approx([r["regret/cumulative"] for r in ra], rel=1e-12)


def test_ubev_phi_table_equals_the_formula_for_every_count():
    ubev = UBEV(riverswim(20), privacy=_ctx(None), seed=0, episodes=10)
    ubev.q_values()
    planner = ubev._planner
    planner.n.fill(70_000.0)
    ubev.q_values()                                               # grows the table past 70,000
    counts = np.arange(planner.table.size, dtype=np.float64)
    for chunk in np.array_split(counts, 997):                     # formula on small arrays, as in a plan
        nn = np.where(chunk > 0, chunk, 1.0)
        direct = np.sqrt((2 * np.log(np.log(np.where(chunk > math.e, chunk, math.e))) + planner.log_term) / nn)
        direct = np.where(chunk > 0, direct, 1e30)
        np.testing.assert_array_equal(planner.table[chunk.astype(np.intp)], direct)
    planner.n.fill(0.0)


def test_pucb_released_counts_equal_the_torch_snapping_formula():
    pucb = PUCB(riverswim(5), privacy=_ctx(2.0), seed=0, episodes=500, episodes_per_round=250)
    pucb.train_round(0)
    st = pucb.stats
    g, b = st.snap_grid, st.clamp_bound
    assert torch.equal(st.released, torch.clamp(torch.round(st.noisy_counts / g) * g, -b, b))


@pytest.mark.parametrize("algo,eps,expected", [("ubev", None, 3352.501763466624),
                                               ("pucb", 1.0, 3353.342905215252)])
def test_riverswim_regret_reproduces_the_reference_grid(algo, eps, expected):
    """Seed 0, T = 1000 cells of runs/reference/tabular.md (scripts/reproduce_tabular.py's run_one):
    speed work must not change a single decision."""
    common = dict(privacy=_ctx(eps), sampler=OnePassUserSampler(1000, seed=0), seed=0, episodes=1000,
                  episodes_per_round=1000)
    learner = UBEV(riverswim(20), **common) if algo == "ubev" else PUCB(riverswim(20), **common)
    learner.train_round(0)
    assert float(torch.cumsum(learner.episode_regret, 0)[-1]) == pytest.approx(expected, rel=1e-12)


def test_pucb_ledger_and_noise_scale_follow_the_privacy_derivation():
    H, T, eps = 20, 2000, 1.0
    ctx = _ctx(eps)
    pucb = PUCB(riverswim(H), privacy=ctx, seed=0, episodes=T, episodes_per_round=1000)
    pucb.train_round(0)
    entries = ctx.ledger.entries
    assert [e["counter_set"] for e in entries] == ["rewards", "visits", "transitions"]
    assert all(e["eps"] == pytest.approx(eps / 3) for e in entries)
    assert ctx.spent()[0] == pytest.approx(eps)
    eps_stream = eps / (6 * H)                         # eps/3 per set, 2H streams changed per user
    levels = int(math.floor(math.log2(T))) + 1
    assert pucb.stats.scale == pytest.approx(levels / eps_stream)
    pucb.train_round(1)
    assert len(ctx.ledger) == 3                       # one entry per set for the whole run, not per node


def test_reference_error_bound_formula():
    pucb = PUCB(riverswim(4), privacy=_ctx(2.0), seed=0, episodes=100)
    S, A, H, T, bp = 6, 2, 4, 100, 0.025
    expected = (3 / 2.0) * (2 * H) * math.log((2 * S * A * H + S * S * A * H) / bp) * math.log(T) ** 2.5
    # plus the snapping error Lambda/2: b = L / eps_stream = 7 * 12 = 84 -> Lambda = 128
    assert pucb.E == pytest.approx(expected + 64.0)


def test_pucb_without_eps_plans_on_exact_counts():
    pucb = PUCB(riverswim(5), privacy=_ctx(None), seed=0, episodes=300, episodes_per_round=300)
    pucb.train_round(0)
    assert pucb.E == 0 and not pucb.stats.private
    _, n, _ = pucb.released_stats()
    assert n.sum() == 300 * 5 and (n == np.round(n)).all()


def test_cumulative_regret_equals_visit_weighted_gaps_on_a_bandit():
    """H = 1, one state: the regret of episode t is R* - R[a_t]; rebuild it from the visit counts."""
    R = torch.tensor([[0.2, 0.5, 0.9]], dtype=torch.float64)
    bandit = TabularMDP(torch.ones(1, 3, 1, dtype=torch.float64), R, 1, torch.ones(1, dtype=torch.float64))
    ubev = UBEV(bandit, privacy=_ctx(None), seed=0, episodes=400, episodes_per_round=400)
    metrics = ubev.train_round(0)
    _, n, _ = ubev.released_stats()
    expected = float((np.array(n[0, 0]) * (0.9 - R[0].numpy())).sum())
    assert metrics["regret/cumulative"] == pytest.approx(expected)
    assert ubev.summary()["cumulative_regret"] == pytest.approx(expected)


def test_each_episode_takes_one_fresh_user():
    sampler = OnePassUserSampler(10)
    ubev = UBEV(riverswim(5), privacy=_ctx(None), sampler=sampler, seed=0, episodes=250, episodes_per_round=100)
    _run(ubev, ubev.num_rounds)
    assert ubev.num_rounds == 3 and len(sampler.used) == 250 and ubev.episodes_done == 250
    sampler.next_index = 0                       # even a rewound cursor skips every used user
    assert sampler.take(1) == [250]
    with pytest.raises(PrivacyError):
        sampler.claim([0])


def test_counter_capacity_is_the_number_of_episodes():
    pucb = PUCB(riverswim(3), privacy=_ctx(1.0), seed=0, episodes=50, episodes_per_round=50)
    pucb.train_round(0)
    with pytest.raises(PrivacyError):
        pucb.stats.step([0])


def test_resume_from_state_dict_matches_uninterrupted_run():
    def make(ctx):
        return PUCB(riverswim(6), privacy=ctx, seed=3, episodes=300, episodes_per_round=100)

    ctx_a = _ctx(5.0, seed=4)
    a = make(ctx_a)
    full = _run(a, 3)
    ctx_b = _ctx(5.0, seed=4)
    b = make(ctx_b)
    _run(b, 2)
    state = {"learner": b.state_dict(), "privacy": ctx_b.state_dict()}
    ctx_c = _ctx(5.0, seed=99)
    c = make(ctx_c)
    c.load_state_dict(state["learner"])
    ctx_c.load_state_dict(state["privacy"])
    last = c.train_round(2)
    assert last == full[2]
    assert torch.equal(c.stats.released, a.stats.released)


def test_same_seed_same_run_and_different_seed_differs():
    def regret(seed):
        u = UBEV(random_mdp(5, 2, 4, seed=0), privacy=_ctx(None), seed=seed, episodes=200, episodes_per_round=200)
        return u.train_round(0)["regret/cumulative"]

    assert regret(1) == regret(1) and regret(1) != regret(2)


def test_frozenlake_and_taxi_have_exact_regret():
    gym = pytest.importorskip("gymnasium")
    from dppo.envs.tabular import from_gym

    for env_id, H in (("FrozenLake-v1", 20), ("Taxi-v4", 3)):
        mdp = from_gym(gym.make(env_id), horizon=H)
        u = UBEV(mdp, privacy=_ctx(None), seed=0, episodes=20, episodes_per_round=20)
        m = u.train_round(0)
        assert u.H == H and m["regret/cumulative"] >= -1e-9
        assert m["regret/per_episode"] <= mdp.to_native_regret(mdp.optimal_value()) + 1e-9


def test_tables_too_large_for_memory_are_a_config_error():
    gym = pytest.importorskip("gymnasium")
    with pytest.raises(ConfigError, match="horizon"):
        PUCB(gym.make("Taxi-v4"), privacy=_ctx(1.0), episodes=10)   # H = 200: S^2 A H = 3e8 streams


def test_model_free_env_reports_regret_as_unavailable():
    gym = pytest.importorskip("gymnasium")

    class Walk(gym.Env):
        observation_space = gym.spaces.Discrete(3)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.s = 0
            return 0, {}

        def step(self, a):
            self.s = min(2, self.s + a)
            return self.s, float(self.s == 2), self.s == 2, False, {}

    env = Walk()
    env.spec = None
    from dppo.envs.tabular import GymTabularEnv

    pucb = PUCB(GymTabularEnv(env, horizon=4), privacy=_ctx(1.0), seed=0, episodes=30, episodes_per_round=30)
    m = pucb.train_round(0)
    assert "regret/cumulative" not in m and pucb.summary()["cumulative_regret"] is None
    assert 0 <= m["diag/return"] <= 4


def test_config_errors_are_one_line():
    with pytest.raises(ConfigError):
        UBEV(riverswim(3), privacy=_ctx(1.0), episodes=10)
    with pytest.raises(ConfigError):
        PUCB(riverswim(3), privacy=_ctx(1.0), episodes=10, count_error_bound="guess")
    with pytest.raises(ConfigError):
        UBEV(riverswim(3), privacy=_ctx(None), episodes=10, episodes_per_round=0)


def test_cli_pucb_riverswim_writes_summary(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "train.py", "algo=pucb", "eps=1", "env=riverswim", "episodes=300",
           "algo.episodes_per_round=100", "progress=false", "eval_episodes=5", f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_done"] == 3 and summary["users_seen"] == 300
    assert summary["epsilon_spent"] == pytest.approx(1.0) and summary["accountant"] == "basic"
    assert summary["cumulative_regret"] > 0 and len(summary["ledger"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ubev", "pucb"])
def test_regret_is_sublinear_on_a_small_mdp(algo):
    """Second-half regret well below first-half regret (linear regret would make them equal)."""
    mdp = random_mdp(S=2, A=2, H=2, seed=5)
    T = 20000
    if algo == "ubev":
        learner = UBEV(mdp, privacy=_ctx(None), seed=0, episodes=T, episodes_per_round=1000)
    else:
        # a large eps keeps the privacy term (which decays like E/n) small at this T; at eps = 50 the
        # psi~ bonus still pushes both actions to the cap H at h = 1 after 2e4 episodes (ties)
        learner = PUCB(mdp, privacy=_ctx(200.0), seed=0, episodes=T, episodes_per_round=1000,
                       count_error_bound="tree")
    _run(learner, learner.num_rounds)
    reg = learner.episode_regret
    first, second = float(reg[: T // 2].sum()), float(reg[T // 2:].sum())
    assert second < 0.5 * first
