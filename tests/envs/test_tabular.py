"""TabularMDP: value iteration against brute force, seeded simulation, gym toy-text conversion."""
import itertools
import math

import gymnasium as gym
import pytest
import torch

from dppo.envs.tabular import GymTabularEnv, TabularMDP, from_gym, make_tabular, random_mdp, riverswim
from dppo.errors import ConfigError


def _brute_force_optimum(mdp: TabularMDP) -> float:
    """Max over every deterministic non-stationary policy of its exact value (tiny MDPs only)."""
    best = -1.0
    per_step = list(itertools.product(range(mdp.A), repeat=mdp.S))
    for choice in itertools.product(per_step, repeat=mdp.H):
        best = max(best, mdp.policy_value(torch.tensor(choice)))
    return best


def test_value_iteration_matches_brute_force_on_small_random_mdp():
    mdp = random_mdp(S=2, A=2, H=3, seed=3)
    assert mdp.optimal_value() == pytest.approx(_brute_force_optimum(mdp), abs=1e-12)


def test_riverswim_optimal_policy_swims_right_and_value_is_exact():
    mdp = riverswim(horizon=20)
    V, Q, pi = mdp.value_iteration()
    assert pi[0].tolist() == [1] * 6
    assert (mdp.P.sum(-1) - 1).abs().max() < 1e-12
    assert mdp.policy_value(pi) == pytest.approx(V[0, 0].item())
    # swimming left forever from state 0 collects 0.005 per step
    assert mdp.policy_value(torch.zeros(6, dtype=torch.long)) == pytest.approx(20 * 0.005)


def test_monte_carlo_return_matches_policy_value():
    mdp = random_mdp(S=5, A=3, H=6, seed=1)
    pi = torch.randint(0, 3, (6, 5), generator=torch.Generator().manual_seed(0))
    _, _, r = mdp.sample_episodes(pi, 40000, torch.Generator().manual_seed(1))
    sd = r.sum(1).std().item() / 200
    assert r.sum(1).mean().item() == pytest.approx(mdp.policy_value(pi), abs=4 * sd)


def test_stochastic_policy_value_is_mixture_of_action_values():
    mdp = random_mdp(S=4, A=2, H=1, seed=2)
    probs = torch.full((4, 2), 0.5, dtype=torch.float64)
    expected = float(mdp.p0 @ mdp.R.mean(-1))
    assert mdp.policy_value(probs) == pytest.approx(expected)


def test_fast_path_and_batched_sampling_agree_and_are_seeded():
    mdp = riverswim(horizon=15)
    pi = torch.randint(0, 2, (15, 6), generator=torch.Generator().manual_seed(5))
    states, actions, rewards = mdp.sample_episodes(pi, 4, torch.Generator().manual_seed(9))
    u = mdp.uniforms(4, torch.Generator().manual_seed(9))
    for i in range(4):
        st, ac, rw = mdp.episode_from_uniforms(pi.tolist(), u[i].tolist())
        assert st == states[i].tolist() and ac == actions[i].tolist() and rw == rewards[i].tolist()
    again = mdp.sample_episodes(pi, 4, torch.Generator().manual_seed(9))[0]
    assert torch.equal(again, states)


def test_zero_probability_transitions_are_never_sampled():
    mdp = riverswim(horizon=30)
    s, a, _ = mdp.sample_episodes(torch.ones(6, dtype=torch.long), 3000, torch.Generator().manual_seed(0))
    step = s[:, 1:] - s[:, :-1]
    assert step.abs().max() <= 1           # RiverSwim only moves to neighbours


def test_frozenlake_model_matches_real_gym_rollouts():
    env = gym.make("FrozenLake-v1")
    mdp = from_gym(env, horizon=100)
    V, _, pi = mdp.value_iteration()
    assert mdp.S == 16 and mdp.A == 4
    returns = []
    for ep in range(1500):
        obs, _ = env.reset(seed=ep)
        total = 0.0
        for h in range(100):
            obs, r, term, trunc, _ = env.step(int(pi[h, obs]))
            total += r
            if term or trunc:
                break
        returns.append(total)
    mean = sum(returns) / len(returns)
    value = mdp.to_native_return(mdp.policy_value(pi))
    assert mean == pytest.approx(value, abs=4 * (value * (1 - value) / len(returns)) ** 0.5)


def test_taxi_rewards_map_back_to_native_units():
    mdp = make_tabular(gym.make("Taxi-v4"), horizon=30)
    assert (mdp.reward_low, mdp.reward_high) == (-10.0, 20.0)
    assert mdp.S == 504  # 4 absorbing copies of the drop-off states
    # never moving (action 0 into the south wall or moving) costs -1 per step: native return >= -10 * H
    assert mdp.to_native_return(0.0) == pytest.approx(-300.0)
    assert -30 <= mdp.to_native_return(mdp.optimal_value()) <= 20


class _Corridor(gym.Env):
    """A model-free Discrete env: walk right (action 1) to reach reward 1 at state 3."""

    observation_space = gym.spaces.Discrete(4)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.s = 0
        return 0, {}

    def step(self, a):
        self.s = min(self.s + 1, 3) if a == 1 else max(self.s - 1, 0)
        return self.s, float(self.s == 3) * 5.0, self.s == 3, False, {}


def test_env_without_model_gets_model_free_adapter_with_clipped_rewards():
    tab = make_tabular(_Corridor(), horizon=6)
    assert isinstance(tab, GymTabularEnv) and not tab.has_model and tab.S == 5
    st, ac, rw = tab.run_episode([[1] * 5 for _ in range(6)])
    assert st == [0, 1, 2, 4, 4, 4, 4]          # absorbing "episode over" state after termination
    assert rw == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]  # native 5 clipped to reward_high = 1


def test_non_discrete_env_is_a_config_error():
    with pytest.raises(ConfigError):
        make_tabular(gym.make("CartPole-v1"), horizon=10)


def test_batched_policy_values_match_one_by_one():
    mdp = random_mdp(S=4, A=3, H=5, seed=7)
    pis = torch.randint(0, 3, (6, 5, 4), generator=torch.Generator().manual_seed(1))
    batch = mdp.policy_value_batch(pis, chunk_elems=40)
    assert torch.allclose(batch, torch.tensor([mdp.policy_value(p) for p in pis], dtype=torch.float64))


def test_taxi_v3_is_refused_with_gymnasiums_replacement_named():
    """gymnasium 1.4 deprecates Taxi-v3 ("Please use `Taxi-v4` instead") without saying the dynamics are
    identical (v4 changed the rainy / fickle variants), so dppo does not substitute it silently."""
    from dppo.envs.gym_env import GymEnvFactory

    with pytest.raises(ConfigError, match="Taxi-v4"):
        GymEnvFactory("Taxi-v3", horizon=5)


def test_cli_taxi_v3_is_a_one_line_error_with_exit_code_2(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "train.py", "algo=ubev", "env.id=Taxi-v3", "env.horizon=5", "episodes=20",
           f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dppo: error:") and "Taxi-v4" in lines[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("S,chunk", [(5, 1 << 22), (5, 200), (12, 1 << 22)])
def test_batched_policy_values_with_repeats_equal_the_values_without(S, chunk):
    """Repeated policies are evaluated once; the values are bit-identical to evaluating every policy
    (checked against the product V^pi_0 @ p0 done on the whole batch, chunk by chunk)."""
    mdp = random_mdp(S=S, A=3, H=6, seed=1)
    g = torch.Generator().manual_seed(0)
    base = torch.randint(0, 3, (7, 6, S), generator=g)
    pols = base[torch.randint(0, 7, (301,), generator=g)]           # many repeats, in any order
    rows, step = torch.arange(S), max(1, chunk // (S * S))
    V = torch.zeros(301, S, dtype=torch.float64)
    for h in reversed(range(6)):
        a = pols[:, h, :]
        V = mdp.R[rows, a] + (mdp.P[rows, a] @ V.unsqueeze(-1)).squeeze(-1)
    expected = torch.cat([V[k0:k0 + step] @ mdp.p0 for k0 in range(0, 301, step)])
    assert torch.equal(mdp.policy_value_batch(pols, chunk_elems=chunk), expected)


def test_drifting_random_mdp_has_per_step_dynamics_and_exact_values():
    """drift > 0: P_h, R_h interpolate two MDPs (step 0 = the stationary MDP of the seed); value iteration
    against brute force, the batched values against per-policy evaluation, Monte Carlo against the value,
    both samplers agree on the same uniforms."""
    base, mdp = random_mdp(S=2, A=2, H=3, seed=3), random_mdp(S=2, A=2, H=3, seed=3, drift=1.0)
    assert base.stationary and not mdp.stationary and mdp.P.shape == (3, 2, 2, 2)
    assert torch.allclose(mdp.P[0], base.P) and not torch.allclose(mdp.P[2], base.P)
    assert torch.allclose(mdp.P[1], 0.5 * (mdp.P[0] + mdp.P[2]))
    assert mdp.optimal_value() == pytest.approx(_brute_force_optimum(mdp), abs=1e-12)
    assert torch.equal(random_mdp(S=2, A=2, H=3, seed=3, drift=0.0).P, base.P)
    big = random_mdp(S=5, A=3, H=6, seed=1, drift=1.0)
    pis = torch.randint(0, 3, (4, 6, 5), generator=torch.Generator().manual_seed(0))
    batch = big.policy_value_batch(pis)
    assert torch.allclose(batch, torch.tensor([big.policy_value(p) for p in pis], dtype=torch.float64))
    states, actions, rewards = big.sample_episodes(pis[0], 30000, torch.Generator().manual_seed(1))
    sd = rewards.sum(1).std().item() / math.sqrt(30000)
    assert rewards.sum(1).mean().item() == pytest.approx(big.policy_value(pis[0]), abs=4 * sd)
    u = big.uniforms(3, torch.Generator().manual_seed(1))
    for i in range(3):
        st, ac, rw = big.episode_from_uniforms(pis[0].tolist(), u[i].tolist())
        assert st == states[i].tolist() and ac == actions[i].tolist() and rw == rewards[i].tolist()
    with pytest.raises(ConfigError):
        random_mdp(drift=1.5)
