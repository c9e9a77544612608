"""ContextBits: rewards, exact values and indexing checked against brute-force enumeration."""
import itertools

import pytest
import torch

from dppo.envs.context_bits import ContextBitsMDP
from dppo.errors import ConfigError


def brute_reward(variant, masks, x, actions):
    """Outcome reward written directly from the definition (parity of masked bits)."""
    targets = [bin(m & x).count("1") % 2 for m in masks]
    matches = sum(int(a == t) for a, t in zip(actions, targets))
    return matches / len(masks) if variant == "easy" else float(matches == len(masks))


@pytest.mark.parametrize("variant", ["easy", "hard"])
def test_outcome_reward_matches_definition_on_every_context_and_action_sequence(variant):
    env = ContextBitsMDP(variant)
    masks = env.masks.tolist()
    xs, acts, want = [], [], []
    for x in range(64):
        for a in itertools.product([0, 1], repeat=4):
            xs.append(x)
            acts.append(a)
            want.append(brute_reward(variant, masks, x, a))
    got = env.outcome_reward(torch.tensor(xs), torch.tensor(acts))
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64))


def test_rho_is_the_product_bernoulli_distribution():
    probs = [0.1, 0.2, 0.3, 0.6, 0.7, 0.9]
    env = ContextBitsMDP("easy", bit_probs=probs)
    x = 0b101101
    want = 1.0
    for i, p in enumerate(probs):
        want *= p if (x >> i) & 1 else 1 - p
    assert env.rho.sum().item() == pytest.approx(1.0)
    assert env.rho[x].item() == pytest.approx(want)


@pytest.mark.parametrize("variant", ["easy", "hard"])
def test_q_star_satisfies_the_deterministic_bellman_equation(variant):
    """Q*_h(s, a) = r 1[h = H] + max_a' Q*_{h+1}(s', a'), with r the outcome reward, on every pair."""
    env = ContextBitsMDP(variant)
    q = env.q_star()
    H = env.H
    for sa in range(env.num_sa):
        h, x, acts = int(env.sa_step[sa]), int(env.sa_context[sa]), int(env.sa_actions[sa])
        if h == H - 1:
            a = [(acts >> j) & 1 for j in range(H)]
            want = brute_reward(variant, env.masks.tolist(), x, a)
        else:
            nxt = env.state_id(h + 1, torch.tensor(x), torch.tensor(acts)).item()
            want = float(q[nxt * 2: nxt * 2 + 2].max())
        assert q[sa].item() == pytest.approx(want)


@pytest.mark.parametrize("variant", ["easy", "hard"])
def test_optimal_value_is_one_and_the_target_policy_attains_it(variant):
    env = ContextBitsMDP(variant, bit_probs=[0.3, 0.5, 0.8, 0.2, 0.5, 0.6])
    assert env.optimal_value() == pytest.approx(1.0)
    greedy = env.q_star().view(env.num_states, 2).argmax(-1)
    assert env.policy_value(greedy) == pytest.approx(1.0)


def test_policy_value_of_always_zero_equals_enumerated_mean_reward():
    env = ContextBitsMDP("hard")
    zeros = torch.zeros(env.num_states, dtype=torch.long)
    want = sum(env.rho[x].item() * brute_reward("hard", env.masks.tolist(), x, (0, 0, 0, 0)) for x in range(64))
    assert env.policy_value(zeros) == pytest.approx(want)


def test_trajectory_ids_round_trip_through_rollout_and_trajectory_sa():
    env = ContextBitsMDP("easy")
    g = torch.Generator().manual_seed(0)
    policy = torch.randint(0, 2, (env.num_states,), generator=g)
    x = torch.arange(64)
    traj, _ = env.rollout(x, policy)
    sa, nxt = env.trajectory_sa(traj)
    # every visited pair is the policy's action in its state, and next states continue the prefix
    assert torch.equal(sa % 2, policy[sa // 2])
    for h in range(env.H - 1):
        assert torch.equal(env.sa_context[sa[:, h + 1]], x)
        assert torch.equal(sa[:, h + 1] // 2, nxt[:, h])


def test_bad_variant_and_bad_probabilities_are_config_errors():
    with pytest.raises(ConfigError):
        ContextBitsMDP("medium")
    with pytest.raises(ConfigError):
        ContextBitsMDP("easy", bit_probs=[0.5] * 5)
