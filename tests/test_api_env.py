"""``dppo.train(env=...)`` in every form an SB3 user passes an env (an id, a ``gym.Env``, a callable or class, a
vector env, a ``GymEnvFactory``), each recorded in the run's config and checked like the CLI's env; the forms it
refuses are one line; a missing optional dependency is one line naming the extra, at the CLI (exit 2) and in the
API (a ``ConfigError``)."""
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import yaml

import dppo
from dppo.envs.gym_env import GymEnvFactory
from dppo.errors import ConfigError, MissingDependency
from tests.cli_helpers import ROOT, one_error_line

TINY = ["algo=dp_pg", "rounds=2", "users_per_round=2", "group_size=2", "eval_episodes=2", "progress=false",
        "checkpoint_every=1"]


class Corridor(gym.Env):
    """Walk right along n cells; reward 1 at the end, -0.1 per step before (Box observation: the position)."""

    def __init__(self, n=4):
        self.n = n
        self.observation_space = gym.spaces.Box(0.0, float(n), (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(0, 2))
        return np.array([self.pos], np.float32), {}

    def step(self, action):
        self.pos = max(0, min(self.n - 1, self.pos + (1 if int(action) == 1 else -1)))
        done = self.pos == self.n - 1
        return np.array([self.pos], np.float32), (1.0 if done else -0.1), done, False, {}


class Unseeded(Corridor):
    """Starts from the global numpy generator: its episodes do not come from the reset seed."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(np.random.randint(0, 3))
        return np.array([self.pos], np.float32), {}


def make_corridor():
    return gym.wrappers.TimeLimit(Corridor(), 20)


CORRIDOR = ["env.reward_range=[-1,1]"]   # the Python env declares no reward range: the config does


def saved(run):
    with open(os.path.join(run, ".hydra", "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    with open(os.path.join(run, "summary.json")) as f:
        return cfg["env"], json.load(f)


@pytest.mark.parametrize("form, extra, env_id, recorded", [
    ("Acrobot-v1", ["env.horizon=20"], "Acrobot-v1", {"id": "Acrobot-v1", "horizon": 20}),
    ("gymnasium.envs.classic_control:CartPole-v1", ["env.horizon=20"], "CartPole-v1",
     {"id": "gymnasium.envs.classic_control:CartPole-v1"}),
    ("make", [], "CartPole-v1", {"id": "CartPole-v1", "horizon": 20, "kwargs": {"sutton_barto_reward": True},
                                 "wrappers": [{"_target_": "gymnasium.wrappers.stateful_observation."
                                               "TimeAwareObservation", "flatten": True, "normalize_time": False,
                                               "dict_time_key": "time"}]}),
    ("factory", [], "CartPole-v1", {"id": "CartPole-v1", "horizon": 15, "num_envs": 2}),
    ("make_vec", ["env.horizon=20"], "CartPole-v1", {"id": "CartPole-v1", "num_envs": 3, "vectorization": "sync"}),
])
def test_each_registered_form_runs_and_is_recorded(tmp_path, form, extra, env_id, recorded):
    env = {"make": lambda: gym.wrappers.TimeAwareObservation(gym.make("CartPole-v1", max_episode_steps=20,
                                                                      sutton_barto_reward=True)),
           "factory": lambda: GymEnvFactory("CartPole-v1", horizon=15, num_envs=2),
           "make_vec": lambda: gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")}.get(form)
    env = env() if env else form
    run = str(tmp_path / "run")
    summary = dppo.train([*TINY, *extra], run_dir=run, env=env)
    assert summary["rounds_done"] == 2 and summary["env_id"] == env_id
    cfg, on_disk = saved(run)
    assert {k: cfg[k] for k in recorded} == recorded and on_disk["env_id"] == env_id
    overrides = yaml.safe_load(open(os.path.join(run, ".hydra", "overrides.yaml")))
    assert any(o.startswith("env.id=") for o in overrides)


@pytest.mark.parametrize("form", ["class", "lambda", "instance", "sync_vector"])
def test_each_python_form_runs_and_is_recorded(tmp_path, form):
    env = {"class": Corridor, "lambda": lambda: Corridor(), "instance": Corridor(),
           "sync_vector": gym.vector.SyncVectorEnv([make_corridor, make_corridor])}[form]
    run = str(tmp_path / "run")
    summary = dppo.train([*TINY, *CORRIDOR, "env.horizon=20"], run_dir=run, env=env)
    cfg, _ = saved(run)
    assert summary["rounds_done"] == 2 and cfg["id"].startswith("python/") and "test_api_env." in cfg["id"]
    assert summary["env_id"] == cfg["id"]
    if form == "sync_vector":
        assert cfg["num_envs"] == 2 and cfg["vectorization"] == "sync" and cfg["id"].endswith("make_corridor")


def test_an_instance_is_copied_never_stepped_itself():
    env = Corridor()
    env.reset(seed=3)
    env.pos = 2   # the owner's own episode, left as it was
    dppo.train([*TINY, *CORRIDOR], env=env)
    assert env.pos == 2


def test_a_resume_refuses_another_env_and_continues_the_same(tmp_path):
    run = str(tmp_path / "run")
    dppo.train([*TINY, "rounds=1", "env.horizon=20"], run_dir=run, env="CartPole-v1")
    with pytest.raises(ConfigError, match="resume refused: 'env.id' was CartPole-v1 in the checkpoint, now python/"):
        dppo.train([*TINY, *CORRIDOR, "env.horizon=20"], run_dir=run, resume=True, env=Corridor)
    assert dppo.train([*TINY, "env.horizon=20"], run_dir=run, resume=True, env=gym.make("CartPole-v1"))[
        "rounds_done"] == 2


@pytest.mark.parametrize("env, line", [
    (lambda: 3, "calling it returned a int, not a gymnasium.Env"),
    (Unseeded, "does not start its episodes from the reset seed alone"),
    ("riverswim", "dppo.train(env='riverswim'): the env= keyword takes an object or a gymnasium id"),
    ("NoSuchEnv-v0", "unknown env.id 'NoSuchEnv-v0': not a registered gymnasium environment"),
    ("ALE/Pong-v5", "ALE/Pong-v5 is registered by the package ale_py"),
    (42, "the env passed in (int) is not an env factory"),
])
def test_a_wrong_form_is_one_line(env, line):
    if env == "ALE/Pong-v5" and "ale_py" in sys.modules:
        pytest.skip("ale_py is imported here: the id is registered")
    with pytest.raises(ConfigError) as err:
        dppo.train([*TINY, *CORRIDOR], env=env)
    assert line in str(err.value) and "\n" not in str(err.value)


def test_an_env_whose_spaces_the_policy_cannot_read_is_refused_before_round_0():
    class Texts(Corridor):
        def __init__(self):
            super().__init__()
            self.observation_space = gym.spaces.Text(5)

    with pytest.raises(ConfigError) as err:
        dppo.train([*TINY, *CORRIDOR], env=Texts)
    assert "Text" in str(err.value) and "\n" not in str(err.value)


def test_an_env_given_twice_or_against_the_config_is_one_line():
    with pytest.raises(ConfigError, match="the env is given twice: env.id=Acrobot-v1 in the config"):
        dppo.train([*TINY, "env.id=Acrobot-v1"], env="CartPole-v1")
    with pytest.raises(ConfigError, match="the config's env group builds dppo.envs.tabular"):
        dppo.train(["algo=ubev", "env=riverswim", "episodes=4"], env="CartPole-v1")


def test_env_option_given_a_gymnasium_id_names_env_id_in_the_api():
    with pytest.raises(ConfigError) as err:
        dppo.train(["env=Acrobot-v1"])
    assert str(err.value) == ("unknown env 'Acrobot-v1': env= picks an option of conf/env/ (cartpole, pendulum, ...), "
                              "and Acrobot-v1 is a gymnasium id: pass it as env.id=Acrobot-v1")


def test_env_option_given_a_gymnasium_id_names_env_id_at_the_cli(capsys):
    assert "pass it as env.id=CartPole-v1" in one_error_line(capsys, ["env=CartPole-v1"])


def hide_box2d(monkeypatch):
    """Box2D unimportable (installed or not), and gymnasium's box2d envs imported anew."""
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_missing_extra_is_a_config_error_naming_it_in_the_api(monkeypatch):
    hide_box2d(monkeypatch)
    with pytest.raises(MissingDependency) as err:
        dppo.train(TINY, env="LunarLander-v3")
    assert str(err.value) == ("env.id=LunarLander-v3 needs the Python module 'Box2D', which is not installed: install "
                              'it with: pip install swig && pip install "gymnasium[box2d]"')
    with pytest.raises(MissingDependency, match="env.id=LunarLander-v3 needs the Python module 'Box2D'"):
        dppo.train([*TINY, "env.id=LunarLander-v3"])


def test_a_missing_extra_of_a_user_env_names_its_module(monkeypatch):
    gym.register("NeedsAbsent-v0", entry_point="dppo_absent_module_for_tests.envs:Env")
    with pytest.raises(MissingDependency, match="needs the Python module 'dppo_absent_module_for_tests', which is "
                                                "not installed: install the package that provides it"):
        dppo.train(TINY, env="NeedsAbsent-v0")
    monkeypatch.setitem(sys.modules, "icu_sepsis", None)
    with pytest.raises(MissingDependency, match="env.id=icu_sepsis needs the Python module 'icu_sepsis', which is "
                                                "not installed: install it with: pip install icu-sepsis"):
        dppo.train([*TINY, "env.id=icu_sepsis:Sepsis/ICU-Sepsis-v2"])


def test_a_missing_extra_is_one_line_and_exit_2_at_the_cli(tmp_path):
    code = ("import runpy, sys; sys.modules['Box2D'] = None; "
            f"sys.argv = ['train.py', 'env.id=LunarLander-v3', 'progress=false', 'hydra.run.dir={tmp_path / 'run'}']; "
            "runpy.run_path('train.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == ("dppo: error: env.id=LunarLander-v3 needs the Python module 'Box2D', which is not installed: "
                        'install it with: pip install swig && pip install "gymnasium[box2d]"')
    assert not (tmp_path / "run").exists()
