"""Bad config or input: one line on stderr, exit code 2, no traceback.

Most cases go through the CLI's own entry function in-process (fast); a few run ``train.py`` in a
subprocess to check the real exit code and that no traceback reaches the terminal.
"""
import pytest

from dppo.cli import entry
from tests.cli_helpers import one_error_line

CASES = [
    (["eps=0"], "eps must be > 0"),
    (["eps=-1"], "eps must be > 0"),
    (["delta=0"], "delta"),
    (["delta=1.5"], "delta"),
    (["algo=nope"], "algo"),
    (["env.id=NoSuchEnv-v9"], "unknown env.id"),
    (["env.id=no_such_pkg:Thing-v0", "algo=dp_pg"], "cannot import 'no_such_pkg'"),
    (["users_per_round=0"], "users_per_round"),
    (["max_grad_norm=0"], "max_grad_norm"),
    (["privacy.population_size=50", "rounds=10"], "population has 50"),
    (["resume=/tmp/definitely/not/a/run"], "not a run directory"),
    (["eps=abc"], "eps must be a number (or null), got 'abc'"),
    (["users_per_round=ten"], "users_per_round must be an int (or null), got 'ten'"),
    (["privacy.secure_rng=maybe"], "privacy.secure_rng must be true or false"),
    (["unknown_key=3"], "unknown key 'unknown_key'"),
    (["+rounds_=3"], "unknown key 'rounds_' (did you mean 'rounds'?)"),
    (["rounds_=3"], "unknown key 'rounds_' (did you mean 'rounds'?)"),
    (["privacy.accountnt=rdp"], "unknown key 'privacy.accountnt' (did you mean 'privacy.accountant'?)"),
    (["env.idd=CartPole-v1"], "unknown key 'env.idd' (did you mean 'env.id'?)"),
    (["algo.lrr=0.1"], "unknown key 'algo.lrr' (did you mean 'algo.lr'?)"),
    # a key the chosen learner (or the chosen option) does not read is refused, not ignored
    (["algo=dp_npg", "max_grad_norm=0.1"], "max_grad_norm=0.1 does not apply to algo=dp_npg"),
    (["algo=dp_npg", "algo.lr=0.1"], "algo.lr applies with algo.step=norm|fixed, not algo.step=kl"),
    (["algo=dp_npg", "algo.step=norm", "algo.max_kl=0.1"], "algo.max_kl applies with algo.step=kl"),
    (["algo=dp_pg", "algo.gamma=0.9"], "algo.gamma applies with algo.advantage=to_go"),
    (["algo=dp_pg", "algo.optimizer=adam", "algo.momentum=0.5"], "algo.momentum applies with algo.optimizer=sgd"),
    (["algo=dp_pg", "oracle=ssp"], "oracle= applies to the regression learners"),
    (["algo=gfa", "env=riverswim", "rounds=5"], "rounds=5 does not apply to algo=gfa"),
    (["algo=ubev", "env=riverswim", "group_size=4"], "group_size=4 does not apply to algo=ubev"),
    (["algo=dp_npg", "oracle=ssp", "oracle.gram_share=0.5"], "oracle.gram_share shapes the released Gram matrix"),
    (["algo=dp_npg", "oracle=dp_gd", "oracle.stepz=3"], "unknown key 'oracle.stepz' (did you mean 'oracle.steps'?)"),
    (["env.id=MountainCarContinuous-v0", "policy=mlp"], "Discrete"),
    (["algo=dp_pg", "privacy.multi_pass=true", "privacy.population_size=20", "eps=0.01", "rounds=1000"],
     "cannot be met"),
    (["algo=dp_npg", "privacy.multi_pass=true", "privacy.population_size=20"], "one-pass training only"),
    # refused before round 0 (they used to fail mid-run, or run silently wrong)
    (["algo=dp_pg", "privacy.accountant=advanced"], "pure-DP (delta=0) releases only"),
    (["algo=dp_npg", "privacy.accountant=zcdp"], "pure-DP (delta=0) releases only"),
    (["algo=dp_ubev", "env=riverswim", "algo.counter=laplace_tree", "privacy.accountant=gdp"],
     "privacy.accountant=gdp composes the Gaussian continual counters' releases only"),
    (["algo=dp_pg", "privacy.accountant=rdp"], "needs privacy.multi_pass=true"),
    (["algo=dp_pg", "privacy.composition=zcdp"], "applies to the GFA learners only"),
    (["algo=gfa", "env=riverswim", "privacy.accountant=parallel"], "accounts its releases by composition"),
    (["algo=dp_pg", "privacy.max_epsilon=1"], "is below eps=5.0"),
    (["algo=pucb", "env=riverswim", "privacy.max_epsilon=2"], "is below eps=5.0"),
    (["algo=dp_pg", "privacy.multi_pass=true", "privacy.population_size=100", "privacy.max_epsilon=0.01"],
     "that the first multi-pass round spends"),
    (["algo=pucb", "env=riverswim", "privacy.multi_pass=true", "privacy.population_size=100",
      "privacy.accountant=rdp"], "makes pure-DP releases"),
    (["algo=gfa", "env=riverswim", "privacy.accountant=advanced", "privacy.composition=zcdp"], "contradicts"),
    (["algo=dp_pg", "env.horizon=0"], "env.horizon must be >= 1"),
    (["algo=dp_pg", "env.horizon=-3"], "env.horizon must be >= 1"),
    (["algo=dp_pg", "+env.kwargs.no_such_arg=1"], "unexpected keyword argument 'no_such_arg'"),
    (["algo=dp_pg", "users_per_round=100000000000"], "needs ~"),
    (["algo=dp_pg", "privacy.population_size=100000000000000", "rounds=2"], "population_size=100000000000000"),
    # issue 20: each of these misbehaved (an internal error text, a failure after releases, a wrong hint)
    (["algo=dp_pg", "env=riverswim"], "is a tabular MDP: use algo=ubev"),
    (["policy=mlp", "env=prompts"], "text prompts as observations"),
    (["algo=dp_pg", "env=prompts"], "use policy=lm"),  # the default policy=auto names the fix too
    (["algo=dp_ppo", "env=prompts", "policy=lm"], "use algo=pg|dp_pg for prompts"),
    (["delta=1e-300"], "delta=1e-300 is below 1e-100"),
    (["algo=pucb", "env=riverswim", "privacy.multi_pass=true", "privacy.population_size=100"],
     "makes pure-DP releases; use one-pass training"),
    (["algo=dp_npg", "env=bandit", "users_per_round=500", "rounds=5"],
     "needs 2500 more users but the env's population (ContextualBandit) has 2000"),
    (["algo=dp_pg", "env=bandit", "policy=loglinear", "privacy.multi_pass=true", "privacy.population_size=3000",
      "eps=8"], "privacy.population_size=3000 is larger than the env's population"),
    (["algo=ubev", "env=riverswim", "privacy.population_size=50", "episodes=100"], "needs 100 more users"),
    (["policy.init_users_offset=3"], "applies to policy.init_from"),
    (["policy.init_from=/no/such/file.pt"], "neither a run directory nor a file"),
    # a key of a group set at the top level, or under another group, names where it lives
    (["algo=dp_ppo", "epochs=3"], "unknown key 'epochs' (did you mean 'algo.epochs'?): not a top-level key; "
                                  "a group's key takes the group's prefix: algo.epochs=3"),
    (["algo=dp_ppo", "env.epochs=3"], "unknown key 'env.epochs' (did you mean 'algo.epochs'?)"),
    (["algo.rounds=3"], "unknown key 'algo.rounds' (did you mean 'rounds'?)"),   # was silently replaced by rounds
    (["algo=dp_pgg"], "unknown algo 'dp_pgg' (did you mean 'dp_pg'?): choose one of dp_model, dp_npg, dp_pg, dp_ppo"),
]


def _never_called():
    raise AssertionError("Hydra's run must not start for a bad config")


@pytest.mark.parametrize("args,needle", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        entry(_never_called, [*args, "progress=false"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


@pytest.mark.parametrize("args,needle", [(["eps=0"], "eps must be > 0"), (["+rounds_=3"], "unknown key 'rounds_'"),
                                         (["algo=dp_ppo", "epochs=3"], "(did you mean 'algo.epochs'?)"),
                                         (["algo=dp_pgg"], "unknown algo 'dp_pgg' (did you mean 'dp_pg'?)"),
                                         (["env.id=NoSuchEnv-v9"], "unknown env.id"),
                                         (["algo=dp_pg", "privacy.accountant=rdp"], "multi_pass"),
                                         (["algo=dp_pg", "privacy.max_epsilon=1"], "below eps")])
def test_subprocess_exit_code_and_no_traceback(cli, tmp_path, args, needle):
    r = cli([*args, "progress=false", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()  # rejected before Hydra made a run directory


_line = one_error_line


@pytest.mark.parametrize("args,first", [
    (["algo=dp_ppo", "epochs=3"], "algo.epochs"),            # the same name in a group comes first, not 'eps'
    (["algo=dp_ppo", "epochz=3"], "algo.epochs"),            # a top-level typo of a group's key
    (["algo=dp_ppo", "epoch=3"], "algo.epochs"),
    (["horizon=50"], "env.horizon"),
    (["horizn=50"], "env.horizon"),
    (["hidden_size=[8]"], "policy.hidden_sizes"),
    (["lr=0.1"], "algo.lr"),
    (["accountant=rdp"], "privacy.accountant"),
    (["tensorboard=false"], "logger.tensorboard"),
    (["greedy=true"], "eval.greedy"),
    (["algo=dp_npg", "oracle=dp_gd", "steps=3"], "oracle.steps"),
    (["algo=dp_ppo", "privacy.epochs=3"], "algo.epochs"),    # a key under the wrong group
    (["algo=dp_ppo", "policy.epochs=3"], "algo.epochs"),
    (["algo=dp_ppo", "env.epochs=3"], "algo.epochs"),
    (["algo=dp_ppo", "algo.horizon=3"], "env.horizon"),
    (["algo=dp_ppo", "algo.hidden_sizes=[8]"], "policy.hidden_sizes"),
    (["algo=dp_npg", "oracle=dp_gd", "oracle.stepz=3"], "oracle.steps"),   # the key's own group before another's
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_did_you_mean_ranks_the_keys_of_every_group_of_the_config(capsys, args, first):
    line = _line(capsys, args)
    assert f"(did you mean '{first}'" in line, line
    assert "valid: ['algo', 'batch_size'" not in line   # not the list of top-level keys instead of the answer


def test_a_key_no_group_takes_lists_the_top_level_keys_and_names_the_groups(capsys):
    line = _line(capsys, ["algo=ubev", "env=riverswim", "epochs=3"])   # UBEV has no epochs, and 'eps' is no hint
    assert line.startswith("dppo: error: unknown key 'epochs': not a top-level key nor a key of algo, env,")
    assert "did you mean" not in line and "'users_per_round'" in line


OPTION_TYPOS = [("algo", "dp_pgg", "dp_pg"), ("env", "cartpol", "cartpole"), ("policy", "ml", "mlp"),
                ("oracle", "sp", "ssp"), ("logger", "wand", "wandb"), ("callbacks", "stop", "stop_at_return"),
                ("experiment", "cartpole_pgg", "cartpole_pg")]


@pytest.mark.parametrize("group,name,close", OPTION_TYPOS, ids=[f"{g}={n}" for g, n, _ in OPTION_TYPOS])
def test_an_unknown_group_option_is_one_short_line_with_the_groups_options(capsys, group, name, close):
    from dppo.config import CONF_DIR

    options = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
    prefix = "+" if group == "experiment" else ""
    line = _line(capsys, [f"{prefix}{group}={name}"])
    assert line == f"dppo: error: unknown {group} '{name}' (did you mean '{close}'?): choose one of {options}"


def test_an_unknown_group_option_from_python_is_the_same_line():
    import dppo
    from dppo.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        dppo.make_config({"algo": "dp_pgg"})
    assert str(err.value).startswith("unknown algo 'dp_pgg' (did you mean 'dp_pg'?): choose one of dp_model, dp_npg, dp_pg")
    assert "search path" not in str(err.value)


def test_an_unknown_train_keyword_names_dppo_train_and_the_config_key_to_set_instead():
    import dppo
    from dppo.errors import ConfigError

    with pytest.raises(TypeError) as err:   # a TypeError, as Python's own, and dppo's ConfigError
        dppo.train(["algo=dp_ppo"], epochs=3)
    msg = str(err.value)
    assert isinstance(err.value, ConfigError) and "\n" not in msg and "build()" not in msg
    assert msg == ("dppo.train() got an unexpected keyword argument 'epochs': epochs is the config key algo.epochs, "
                   "which goes in the config, as 'algo.epochs=3' in the overrides list or {'algo.epochs': 3} in "
                   "the dict")
    with pytest.raises(ConfigError, match=r"'rounds': rounds is a config key, which goes in the config, as "
                                          r"'rounds=5' in the overrides list or \{'rounds': 5\} in the dict"):
        dppo.train(rounds=5)


@pytest.mark.parametrize("kwargs,hint", [
    ({"run_directory": "/tmp/x"}, "(did you mean run_dir=?)"),
    ({"train_data": []}, "(did you mean train_dataset=?)"),
    ({"seeds": 1}, "(did you mean the config key 'seed'?)"),
    ({"no_such_thing": 1}, "dppo.train's keywords are cfg, run_dir, resume, callbacks"),
])
def test_a_mistyped_train_keyword_gets_a_close_keyword_and_how_to_pass_a_config_key(kwargs, hint):
    import dppo
    from dppo.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        dppo.train(["algo=dp_pg"], **kwargs)
    msg = str(err.value)
    assert msg.startswith(f"dppo.train() got an unexpected keyword argument '{next(iter(kwargs))}'") and hint in msg
    assert "a config key goes in the config" in msg and "\n" not in msg


@pytest.mark.parametrize("name", ["policy", "logger", "callbacks"])   # env= takes ids: tests/test_api_env.py
def test_an_option_name_where_train_takes_an_object_says_how_to_pick_the_option(name):
    import dppo
    from dppo.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        dppo.train(**{name: "some_option"})
    assert str(err.value).startswith(f"dppo.train({name}='some_option'): the {name}= keyword takes an object")
    assert f"'{name}=some_option' in the overrides list" in str(err.value)


def test_a_dict_of_group_choices_alone_is_a_config():
    import dppo

    assert dppo.make_config({"algo": "dp_ppo"}).algo._target_ == "dppo.algos.ppo.PPO"
