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
    # the default learner's run shape (conf/algo/dp_npg.yaml; the schema's defaults elsewhere: 100 x 10 x 8)
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
