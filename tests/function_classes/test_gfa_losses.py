"""The incrementally updated GFA losses against direct computation from the raw dataset."""
import torch

from dppo.envs.context_bits import ContextBitsMDP
from dppo.function_classes import ContextBitsClass, TensorClass
from dppo.function_classes.losses import BellmanErrorLoss, BellmanResidualLoss, trajectory_residuals


def residual_by_hand(table, env, traj_id):
    """G_f(tau) = sum_h f_h(s_h, a_h) - sum_{h>=2} max_a f_h(s_h, a), written step by step."""
    x, acts = traj_id >> env.H, traj_id & ((1 << env.H) - 1)
    total = 0.0
    for h in range(env.H):
        s = env.state_id(h, torch.tensor(x), torch.tensor(acts & ((1 << h) - 1))).item()
        a = (acts >> h) & 1
        total += table[s * 2 + a].item()
        if h > 0:
            total -= max(table[s * 2].item(), table[s * 2 + 1].item())
    return total


def test_trajectory_residuals_match_step_by_step_sums():
    env = ContextBitsMDP("easy")
    g = torch.Generator().manual_seed(0)
    fc = TensorClass(torch.rand(4, env.num_sa, generator=g), value_max=1.0)
    traj = torch.tensor([0, 17, 333, 1023])
    sa, nxt = env.trajectory_sa(traj)
    G = trajectory_residuals(fc, sa, nxt, 2)
    for f in range(4):
        for j, t in enumerate(traj.tolist()):
            assert abs(G[f, j].item() - residual_by_hand(fc.table[f], env, t)) < 1e-5


def test_residual_of_a_member_is_its_own_predicted_outcome_reward():
    """A member is the Q* of a deterministic MDP: its residual telescopes to that MDP's reward."""
    env = ContextBitsMDP("hard")
    fc = ContextBitsClass(env, size=30, seed=2)
    traj = torch.arange(0, 1024, 7)
    sa, nxt = env.trajectory_sa(traj)
    G = trajectory_residuals(fc, sa, nxt, 2)
    x, acts = traj >> 4, traj & 15
    bits = torch.stack([(acts >> h) & 1 for h in range(4)], 1)
    for i in range(30):
        other = ContextBitsMDP("hard", masks=fc.masks[i].tolist())
        assert torch.allclose(G[i], other.outcome_reward(x, bits) * float(fc.scales[i]), atol=1e-5)


def test_incremental_bellman_residual_loss_equals_the_sum_over_the_dataset():
    env = ContextBitsMDP("easy")
    fc = ContextBitsClass(env, size=40)
    g = torch.Generator().manual_seed(1)
    loss = BellmanResidualLoss(fc.size)
    data = []
    for _ in range(5):                                      # five batches, with repeated trajectories
        traj = torch.randint(0, 1024, (9,), generator=g)
        traj[1] = traj[0]
        r = torch.rand(9, generator=g, dtype=torch.float64)
        data += list(zip(traj.tolist(), r.tolist()))
        uniq, inv = torch.unique(traj, return_inverse=True)
        n = torch.zeros(len(uniq)).index_add_(0, inv, torch.ones(9))
        s = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, r)
        q = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, r * r)
        sa, nxt = env.trajectory_sa(uniq)
        loss.update(trajectory_residuals(fc, sa, nxt, 2), n, s, q)
    direct = torch.zeros(fc.size, dtype=torch.float64)
    for t, r in data:
        sa, nxt = env.trajectory_sa(torch.tensor([t]))
        direct += (trajectory_residuals(fc, sa, nxt, 2)[:, 0] - r) ** 2
    assert torch.allclose(loss.loss, direct, atol=1e-8)


def test_bellman_error_loss_with_inner_infimum_matches_brute_force():
    """L_BE(f) = sum_h E_h(f_h, f_{h+1}) - min_f' sum_h E_h(f'_h, f_{h+1}), summed over raw episodes."""
    H, S, A, F = 3, 4, 2, 6
    g = torch.Generator().manual_seed(5)
    table = torch.rand(F, H * S * A, generator=g, dtype=torch.float64)
    n = 25
    states = torch.randint(0, S, (n, H + 1), generator=g)
    actions = torch.randint(0, A, (n, H), generator=g)
    rewards = torch.rand(n, H, generator=g, dtype=torch.float64)
    stats = BellmanErrorLoss(H, S, A)
    stats.update(states[:10], actions[:10], rewards[:10])
    stats.update(states[10:], actions[10:], rewards[10:])
    got = stats.loss(table)

    def q(f, h, s, a):
        return table[f, (h * S + s) * A + a].item()

    def E(fp, f):                      # sum_h E_h(f'_h, f_{h+1})
        tot = 0.0
        for i in range(n):
            for h in range(H):
                s, a, r, s2 = states[i, h].item(), actions[i, h].item(), rewards[i, h].item(), states[i, h + 1].item()
                v = max(q(f, h + 1, s2, b) for b in range(A)) if h + 1 < H else 0.0
                tot += (q(fp, h, s, a) - r - v) ** 2
        return tot

    for f in range(F):
        want = E(f, f) - min(E(fp, f) for fp in range(F))
        assert abs(got[f].item() - want) < 1e-8
    assert (got >= -1e-9).all()


def test_context_bits_fast_residuals_equal_the_generic_computation_from_values():
    for variant in ("easy", "hard"):
        env = ContextBitsMDP(variant)
        fc = ContextBitsClass(env, size=300, seed=4)
        table = TensorClass(fc.values(torch.arange(env.num_sa)), value_max=fc.value_max)   # generic path
        traj = torch.arange(env.num_trajectories)
        sa, nxt = env.trajectory_sa(traj)
        assert torch.allclose(trajectory_residuals(fc, sa, nxt, 2), trajectory_residuals(table, sa, nxt, 2),
                              atol=1e-6)
