"""Any env a user brings: named as gymnasium names it (``module:EnvId``, ``env.imports``, ``env.wrappers``), read
as SB3 reads its spaces, run on a bounded pool of instances, with its rewards clipped only to a declared range."""
from __future__ import annotations

import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch

import dppo
from dppo.build import build
from dppo.envs.gym_env import GymEnvFactory
from dppo.envs.reward_ranges import clipping_warning, declared_reward_range, resolve_reward_bound
from dppo.envs.rollout import RolloutEngine, resolve_vectorization
from dppo.errors import ConfigError
from dppo.policies.auto import auto_policy
from dppo.policies.multi_discrete import MultiDiscreteMLPPolicy
from dppo.policies.observations import ObservationEncoder, ObservationLayout

CORRIDOR = '''
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right along n cells (Discrete observations); reward 1 at the end, -0.1 per step before."""

    def __init__(self, n=5):
        self.n = n
        self.observation_space = gym.spaces.Discrete(n)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(0, 2))
        return self.pos, {}

    def step(self, action):
        self.pos = max(0, min(self.n - 1, self.pos + (1 if int(action) == 1 else -1)))
        done = self.pos == self.n - 1
        return self.pos, (1.0 if done else -0.1), done, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=30)
'''


@pytest.fixture
def toy_module(tmp_path, monkeypatch):
    """A user's own env module on the path (``mytoyenv``), not imported yet."""
    name = f"mytoyenv_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(CORRIDOR))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    gym.registry.pop("Corridor-v0", None)


def test_an_env_in_the_users_module_is_named_by_module_colon_id_or_by_imports(toy_module):
    env = GymEnvFactory(f"{toy_module}:Corridor-v0")
    assert env.id == "Corridor-v0" and env.module == toy_module and env.horizon == 30
    assert isinstance(env.observation_space, gym.spaces.Discrete)
    assert GymEnvFactory("Corridor-v0", imports=[toy_module]).observation_space.n == 5


def test_an_unknown_module_or_id_is_one_line_naming_the_fix():
    with pytest.raises(ConfigError, match="cannot import 'no_such_pkg'.*PYTHONPATH"):
        GymEnvFactory("no_such_pkg:Thing-v0")
    with pytest.raises(ConfigError, match="env.imports"):
        GymEnvFactory("NoSuchEnv-v7")


def test_wrappers_by_import_path_apply_to_every_instance_and_turn_native_off():
    env = GymEnvFactory("CartPole-v1", wrappers=["gymnasium.wrappers.TimeAwareObservation"])
    assert env.observation_space.shape == (5,) and env.make().observation_space.shape == (5,)
    assert resolve_vectorization(env) == "sync"   # the native vector env would skip the wrapper
    halved = GymEnvFactory("CartPole-v1", wrappers=[{"_target_": "gymnasium.wrappers.ClipReward",
                                                     "max_reward": 0.5}]).make()
    halved.reset(seed=0)
    assert halved.step(0)[1] == 0.5
    with pytest.raises(ConfigError, match="env.wrappers: cannot import"):
        GymEnvFactory("CartPole-v1", wrappers=["gymnasium.wrappers.NoSuchWrapper"])


SPACES = {
    "discrete": gym.spaces.Discrete(5, start=2),
    "multidiscrete": gym.spaces.MultiDiscrete([3, 4]),
    "multibinary": gym.spaces.MultiBinary(3),
    "tuple": gym.spaces.Tuple([gym.spaces.Discrete(4), gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2)]),
    "dict": gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(0, 1, (2, 2))}),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_stored_observations_encode_to_gymnasiums_own_flattening(name):
    """Compact storage + the encoder = ``gym.spaces.flatten`` (one-hot Discrete parts), on sampled elements."""
    space = SPACES[name]
    space.seed(3)
    layout = ObservationLayout(space)
    enc = ObservationEncoder(layout)
    for _ in range(5):
        x = space.sample()
        want = np.asarray(gym.spaces.flatten(space, x), dtype=np.float32)
        got = enc(torch.from_numpy(layout.encode(x))[None])[0].numpy()
        np.testing.assert_array_equal(got, want)
    assert layout.feature_dim == gym.spaces.flatdim(space)


def test_unsupported_observation_spaces_are_refused_naming_a_wrapper():
    with pytest.raises(ConfigError, match="Text.*env.wrappers"):
        ObservationLayout(gym.spaces.Text(8))
    with pytest.raises(ConfigError, match=r"\[1\].*Graph"):
        ObservationLayout(gym.spaces.Tuple([gym.spaces.Discrete(2),
                                            gym.spaces.Graph(gym.spaces.Box(0, 1, (1,)), None)]))


def test_multidiscrete_log_prob_is_the_sum_of_the_components_and_entropy_rows_give_its_gradient():
    torch.manual_seed(0)
    pi = auto_policy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiDiscrete([3, 2, 4]), hidden_sizes=[8])
    assert isinstance(pi, MultiDiscreteMLPPolicy)
    with torch.no_grad():
        pi.logits_layer.weight.normal_()
    obs = torch.randn(6, 3)
    acts = torch.stack([torch.randint(0, n, (6,)) for n in (3, 2, 4)], 1)
    parts = pi.logits(obs).split([3, 2, 4], -1)
    want = sum(torch.distributions.Categorical(logits=z).log_prob(acts[:, j]) for j, z in enumerate(parts))
    torch.testing.assert_close(pi.log_prob(obs, acts), want)
    # sum_rows w grad log pi(a|s) over the entropy rows = grad sum_s coef_s H(pi(.|s))
    coef = torch.rand(6, dtype=torch.float64)
    eo, ea, ew, _ = pi.entropy_rows(obs, torch.zeros(6, dtype=torch.long), coef)
    g_rows = torch.autograd.grad((ew.float() * pi.log_prob(eo, ea)).sum(), pi.logits_layer.weight)[0]
    H = sum(torch.distributions.Categorical(logits=z).entropy() for z in pi.logits(obs).split([3, 2, 4], -1))
    g_H = torch.autograd.grad((coef.float() * H).sum(), pi.logits_layer.weight)[0]
    torch.testing.assert_close(g_rows, g_H, rtol=1e-4, atol=1e-6)


class Counting:
    """A factory wrapper that counts the env instances it makes."""

    def __init__(self, inner):
        self.inner, self.made = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def make(self):
        self.made += 1
        return self.inner.make()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "FrozenLake-v1", "Blackjack-v1"])
def test_a_bounded_pool_gives_every_episode_bit_identically_on_at_most_num_envs_instances(env_id):
    """Episode i depends on its seed, its uniforms and the policy only: the same batch on 1, 3 or 64 live
    instances (slots refilled as episodes end) is bit-identical, and never more instances are made."""
    base = GymEnvFactory(env_id, vectorization="sync", horizon=40)
    pi = auto_policy(base.observation_space, base.action_space, hidden_sizes=[8])
    seeds = list(range(100, 124))
    u = torch.rand(len(seeds), 40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = {}
    for cap in (1, 3, 64):
        f = Counting(GymEnvFactory(env_id, vectorization="sync", horizon=40, num_envs=cap))
        out[cap] = RolloutEngine(f).run(pi, seeds, u, reward_bound=None)
        assert f.made == min(cap, len(seeds))
    for cap in (1, 3):
        for field in ("obs", "actions", "rewards", "mask", "terminated", "final_obs"):
            assert torch.equal(getattr(out[cap], field), getattr(out[64], field)), (cap, field)


def test_buffers_grow_with_the_steps_taken_not_the_horizon():
    env = GymEnvFactory("CartPole-v1", horizon=100_000)
    pi = auto_policy(env.observation_space, env.action_space, hidden_sizes=[8])
    batch = RolloutEngine(env).run(pi, list(range(8)), None, reward_bound=None)
    assert batch.obs.shape[1] == int(batch.lengths.max()) < 1000


def test_native_cartpole_on_fewer_slots_than_episodes_is_identical_to_one_batch():
    pi = auto_policy(gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2), hidden_sizes=[8])
    seeds = list(range(10))
    u = torch.rand(10, 500, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    one = RolloutEngine(GymEnvFactory("CartPole-v1")).run(pi, seeds, u, reward_bound=1.0)
    waves = RolloutEngine(GymEnvFactory("CartPole-v1", num_envs=4)).run(pi, seeds, u, reward_bound=1.0)
    assert torch.equal(one.obs, waves.obs) and torch.equal(one.actions, waves.actions)


def test_the_reward_range_comes_from_the_config_the_env_or_its_documentation():
    assert declared_reward_range("Pendulum-v1")[0] == pytest.approx(-16.2736044)
    assert GymEnvFactory("Pendulum-v1").reward_range == declared_reward_range("Pendulum-v1")
    assert GymEnvFactory("Pendulum-v1", reward_range=[-20, 0]).reward_range == (-20.0, 0.0)

    class Declares(gym.Env):
        reward_range = (-3.0, 2.0)

    assert declared_reward_range("Mine-v0", Declares()) == (-3.0, 2.0)
    env = GymEnvFactory("Pendulum-v1")
    kw = dict(private=True, needs_bound=False, seed=0, algo="dp_ppo")
    assert resolve_reward_bound(None, env, **kw) == pytest.approx(16.2736044)
    assert resolve_reward_bound(2.0, env, **kw) == 2.0
    assert "rewards beyond +-1 are clipped" in clipping_warning(1.0, env)
    assert clipping_warning(20.0, env) is None


def test_a_private_run_on_an_env_declaring_no_range_is_refused_with_the_probed_scale(toy_module):
    env = GymEnvFactory(f"{toy_module}:Corridor-v0")
    assert env.reward_range is None
    with pytest.raises(ConfigError, match=r"declares none; 16 random episodes on public seeds saw rewards in "
                                          r"\[-0.1, 1\]: set env.reward_range=\[low, high\] or reward_bound"):
        resolve_reward_bound(None, env, private=True, needs_bound=False, seed=0, algo="dp_pg")
    # non-private: nothing is clipped unless asked
    assert resolve_reward_bound(None, env, private=False, needs_bound=False, seed=0, algo="pg") is None
    cfg = dppo.make_config([f"env.id={toy_module}:Corridor-v0", "algo=dp_pg", "rounds=1", "users_per_round=2"])
    with pytest.raises(ConfigError, match="declares none"):
        build(cfg)


def _installed_supported_envs() -> list[str]:
    ids = []
    for env_id in sorted(gym.registry):
        try:
            e = gym.make(env_id)
        except Exception:  # noqa: BLE001 - an optional dependency (box2d, mujoco, jax) is not installed
            continue
        try:
            ObservationLayout(e.observation_space)
            auto_policy(e.observation_space, e.action_space, hidden_sizes=[8])
        except ConfigError:
            continue
        finally:
            e.close()
        ids.append(env_id)
    return ids


@pytest.mark.parametrize("algo", ["dp_ppo", "dp_pg"])
def test_every_installed_registry_env_with_supported_spaces_runs_two_rounds_with_defaults(algo, tmp_path):
    """gymnasium's own registry (whatever extras are installed): two rounds of each learner with the defaults,
    a small run shape; an env declaring no reward range is given the scale its public probe suggests."""
    import dppo.envs.gym_env  # noqa: F401 - registers this package's envs too

    ids = _installed_supported_envs()
    assert {"CartPole-v1", "FrozenLake-v1", "Blackjack-v1", "Pendulum-v1"} <= set(ids)
    for i, env_id in enumerate(ids):
        extra = [] if declared_reward_range(env_id, gym.make(env_id)) is not None else ["reward_bound=1000"]
        cfg = dppo.make_config([f"env.id={env_id}", f"algo={algo}", "rounds=2", "users_per_round=2",
                                "group_size=2", "env.horizon=20", "eval_episodes=2", "progress=false", *extra])
        summary = dppo.train(cfg, str(tmp_path / f"{i}"))
        assert summary["rounds_done"] == 2 and np.isfinite(summary["final_return"]), env_id
