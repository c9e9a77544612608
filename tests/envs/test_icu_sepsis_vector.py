"""The native ICU-Sepsis vector env draws each patient's transitions exactly as the package's single env does."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.utils import seeding

from dppo.envs.icu_sepsis_vector import ICUSepsisVectorEnv


def toy_tables(S=7, A=3, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(S) * 0.3, size=(S, A))
    R = (rng.random((S, A, S)) < 0.2).astype(np.float64)
    admissible = rng.random((S, A)) < 0.7
    return dict(P=P, R=R, d0=rng.dirichlet(np.ones(S)), admissible=admissible, terminal=[S - 2, S - 1],
                death=S - 2)


def single_env_episode(t: dict, seed: int, actions: list[int], strategy: str = "mean") -> list[tuple]:
    """The package's stepping, written independently: one ``Generator.choice`` per reset and per step."""
    rng = seeding.np_random(seed)[0]
    S = t["P"].shape[0]
    s = int(rng.choice(S, p=t["d0"]))
    out = [(s, 0.0, False)]
    for a in actions:
        if s in t["terminal"]:
            break
        nxt = int(rng.choice(S, p=t["P"][s, a]))
        if strategy == "terminate" and not t["admissible"][s, a]:
            nxt = t["death"]
        out.append((nxt, float(t["R"][s, a, nxt]), nxt in t["terminal"]))
        s = nxt
    return out


@pytest.mark.parametrize("strategy", ["mean", "terminate"])
def test_every_patient_follows_its_own_seed_exactly_as_the_single_env(strategy):
    t = toy_tables()
    seeds = [3, 17, 99, 123456, 7]
    rng = np.random.default_rng(1)
    actions = rng.integers(0, 3, size=(len(seeds), 30))
    vec = ICUSepsisVectorEnv(len(seeds), max_episode_steps=1000, inadmissible_action_strategy=strategy, tables=t)
    obs = vec.reset_seeds(seeds)
    got = [[(int(o), 0.0, False)] for o in obs]
    done = np.zeros(len(seeds), dtype=bool)
    for k in range(30):
        obs, rew, term, trunc, _ = vec.step(actions[:, k])
        for i in np.flatnonzero(~done):
            got[i].append((int(obs[i]), float(rew[i]), bool(term[i])))
        done |= term | trunc
        if done.all():
            break
    for i, s in enumerate(seeds):
        want = single_env_episode(t, s, list(actions[i]), strategy)
        assert got[i][:len(want)] == want


def test_the_native_env_matches_the_package_env_step_for_step():
    pytest.importorskip("icu_sepsis")
    from dppo.envs.gym_env import GymEnvFactory
    from dppo.envs.rollout import RolloutEngine
    from dppo.policies.auto import auto_policy

    native = GymEnvFactory("icu_sepsis:Sepsis/ICU-Sepsis-v2")
    single = GymEnvFactory("Sepsis/ICU-Sepsis-v2", vectorization="sync", num_envs=2)
    pi = auto_policy(native.observation_space, native.action_space, hidden_sizes=[8])
    seeds = list(range(500, 540))
    u = torch.rand(len(seeds), 500, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = RolloutEngine(native).run(pi, seeds, u, reward_bound=None)
    b = RolloutEngine(single).run(pi, seeds, u, reward_bound=None)
    for field in ("obs", "actions", "rewards", "mask", "terminated", "final_obs"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
