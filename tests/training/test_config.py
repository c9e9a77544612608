import pytest
from omegaconf.errors import ConfigKeyError, ValidationError

from dppo.config import compose, validate
from dppo.errors import ConfigError


def test_default_config_composes_with_fixed_top_level_keys():
    cfg = compose([])
    for key in ("algo", "env", "policy", "privacy", "logger", "eps", "delta", "seed", "rounds", "users_per_round",
                "max_grad_norm", "reward_bound", "resume"):
        assert key in cfg
    assert cfg.env.id == "CartPole-v1" and cfg.delta == 1e-5
    # the default learner's run shape (NaturalPolicyGradient.default_run_shape; the base Learner's elsewhere: 100 x
    # 10 x 8), filled in when composed
    assert (cfg.rounds, cfg.users_per_round, cfg.group_size) == (200, 15, 4)
    assert (compose(["algo=npg"]).users_per_round, compose(["algo=dp_pg"]).users_per_round) == (15, 10)
    validate(cfg)


def test_unknown_key_is_rejected():
    for key in ("no_such_key=1", "+no_such_key=1", "++no_such_key=1", "privacy.no_such_key=1"):
        with pytest.raises(ConfigError, match="unknown key"):
            compose([key])


def test_wrong_type_is_rejected():
    with pytest.raises(Exception, match="eps=abc"):
        compose(["eps=abc"])


def test_privacy_none_means_non_private():
    assert compose(["eps=null"]).eps is None and compose(["algo=pg"]).eps is None  # the one switch; pg = dp_pg + eps null


@pytest.mark.parametrize("override,msg", [("eps=0", "eps must be > 0"), ("delta=1", "delta"),
                                          ("users_per_round=0", "users_per_round"),
                                          ("max_grad_norm=0", "max_grad_norm")])
def test_invalid_values_fail_validation(override, msg):
    with pytest.raises(ConfigError, match=msg):
        validate(compose([override]))


def test_plain_train_py_runs_dp_npg_at_eps_5():
    cfg = compose([])
    assert cfg.algo._target_.endswith("NaturalPolicyGradient") and cfg.eps == 5.0 and cfg.env.id == "CartPole-v1"


def test_the_run_shape_is_the_learners_default_where_left_unset():
    """The run shape's home is the learner (``default_run_shape``): a key left unset takes the learner's value, a
    key set is kept, and the composed config holds the values the run uses (no null left)."""
    from dppo.algos.base import Learner
    from dppo.algos.npg import NaturalPolicyGradient
    from dppo.algos.rebel import REBEL

    shape = lambda c: {"rounds": c.rounds, "users_per_round": c.users_per_round, "group_size": c.group_size}  # noqa: E731
    assert shape(compose([])) == NaturalPolicyGradient.default_run_shape == \
        {"rounds": 200, "users_per_round": 15, "group_size": 4}
    assert shape(compose(["algo=dp_rebel"])) == REBEL.default_run_shape == Learner.default_run_shape
    assert shape(compose(["algo=dp_ppo"])) == Learner.default_run_shape == \
        {"rounds": 100, "users_per_round": 10, "group_size": 8}
    assert shape(compose(["rounds=7", "group_size=2"])) == {"rounds": 7, "users_per_round": 15, "group_size": 2}
    assert shape(compose(["algo=npg", "rounds=100"]))["rounds"] == 100   # set to the other learners' value: kept


def test_no_group_file_sets_a_run_shape():
    """``conf/algo`` (and the env, policy and oracle groups) hold no top-level rounds / users_per_round /
    group_size: the learner's class does; an experiment file may pin one (its reference table's)."""
    from omegaconf import OmegaConf

    from dppo.config import CONF_DIR, RUN_SHAPE

    found = [f"{p.parent.name}/{p.name}: {k}" for g in ("algo", "env", "policy", "oracle")
             for p in sorted((CONF_DIR / g).glob("*.yaml")) for k in RUN_SHAPE if k in (OmegaConf.load(p) or {})]
    assert found == []


def test_a_config_hydra_composed_itself_is_filled_in_and_recorded(tmp_path):
    """A multirun job's config (Hydra composes it, nulls and all) gets the learner's shape in ``validate``, and
    the job's ``.hydra/config.yaml`` (written by Hydra before the build) is rewritten with the values used."""
    from omegaconf import OmegaConf

    from dppo.cli import _record_run_shape
    from dppo.config import TrainConfig

    cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig),
                          {"algo": {"_target_": "dppo.algos.npg.NaturalPolicyGradient"},
                           "env": {"_target_": "dppo.envs.gym_env.GymEnvFactory", "id": "CartPole-v1"}, "rounds": 3})
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    assert cfg.users_per_round is None
    validate(cfg)
    assert (cfg.rounds, cfg.users_per_round, cfg.group_size) == (3, 15, 4)
    _record_run_shape(str(tmp_path), cfg)
    saved = OmegaConf.load(tmp_path / ".hydra" / "config.yaml")
    assert (saved.rounds, saved.users_per_round, saved.group_size) == (3, 15, 4)


def test_a_learner_that_reads_no_run_shape_refuses_one_off_its_default():
    """The tabular learners run episodes: ``rounds`` left unset is fine, ``rounds=200`` (NPG's) is refused."""
    from dppo.build import build

    with pytest.raises(ConfigError, match="rounds=200 does not apply to algo=dp_ubev"):
        build(compose(["algo=dp_ubev", "env=riverswim", "rounds=200", "episodes=10"]))
