"""One name, one meaning: the accountant that composes a set of releases is an ``accountant`` in every group
(``privacy.accountant`` for a run's releases, GFA's ``advanced`` | ``zcdp`` included; ``oracle.accountant`` for
dp_gd's k steps, ``gdp`` | ``rdp``). The former name ``composition`` still works for one release, with a one-line
warning naming the new key, and gives the same object as the new name."""
from __future__ import annotations

import pytest

from dppo.build import RENAMED_KEYS, build_oracle, build_privacy, learner_class
from dppo.build.checks import warn_renamed_keys
from dppo.config import compose
from dppo.errors import ConfigError

GFA = ["algo=gfa", "env=riverswim"]


def privacy_of(overrides):
    cfg = compose(overrides)
    return build_privacy(cfg, learner_class(cfg))


def test_gfa_takes_its_composition_as_privacy_accountant():
    assert privacy_of(GFA).accountant.name == "advanced"          # the learner's default
    assert privacy_of([*GFA, "privacy.accountant=zcdp"]).accountant.name == "zcdp"
    assert privacy_of([*GFA, "privacy.composition=zcdp"]).accountant.name == "zcdp"   # the former name


def test_the_oracles_step_accountant_is_oracle_accountant():
    """dp_gd with ``oracle.accountant=rdp`` is the oracle ``oracle.composition=rdp`` gave: the same noise."""
    base = ["algo=dp_rebel", "oracle=dp_gd", "oracle.steps=5"]
    new, old, default = (build_oracle(cfg, learner_class(cfg), True, 4) for cfg in
                         (compose([*base, "oracle.accountant=rdp"]), compose([*base, "oracle.composition=rdp"]),
                          compose(base)))
    assert new.accountant == old.accountant == "rdp" and default.accountant == "gdp"
    assert new.noise_std(2.0, 1e-5) == old.noise_std(2.0, 1e-5) != default.noise_std(2.0, 1e-5)


@pytest.mark.parametrize("overrides,line", [
    ([*GFA, "privacy.composition=zcdp"], "privacy.composition is deprecated and goes in the next release: use "
                                         "privacy.accountant=zcdp (the same choice)"),
    (["algo=dp_rebel", "oracle=dp_gd", "oracle.composition=rdp"],
     "oracle.composition is deprecated and goes in the next release: use oracle.accountant=rdp (the same choice)"),
])
def test_a_former_name_warns_in_one_line(overrides, line, capsys):
    warn_renamed_keys(compose(overrides))
    err = capsys.readouterr().err
    assert err == f"dppo: warning: {line}\n"


def test_no_warning_for_the_new_names_nor_an_old_default(capsys):
    """A run saved before carries ``privacy.composition: advanced`` (the old default, which said nothing): no warning
    when it is resumed, nor for a config using the new names."""
    for overrides in ([*GFA, "privacy.accountant=zcdp"], ["algo=dp_pg", "privacy.composition=advanced"],
                      ["algo=dp_rebel", "oracle=dp_gd", "oracle.accountant=rdp"]):
        warn_renamed_keys(compose(overrides))
    assert capsys.readouterr().err == ""
    assert privacy_of(["algo=dp_pg", "privacy.composition=advanced"]).accountant.name == "parallel"


@pytest.mark.parametrize("overrides,match", [
    ([*GFA, "privacy.accountant=advanced", "privacy.composition=zcdp"], "contradicts the deprecated"),
    (["algo=dp_pg", "privacy.composition=zcdp"], "applies to the GFA learners only"),
])
def test_a_former_name_that_conflicts_is_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        privacy_of(overrides)


def test_every_renamed_key_names_a_key_that_exists():
    """The new names are real keys: the schema's, or a parameter of the object the group builds."""
    from dppo.config import known_keys

    configs = [compose(["algo=dp_rebel", "oracle=dp_gd"]), compose(["algo=dp_ppo"])]
    for old, (new, _) in RENAMED_KEYS.items():
        group, _, key = new.rpartition(".")
        assert any(key in known_keys(cfg)[group] for cfg in configs), new


def test_dp_gd_refuses_both_names_disagreeing():
    from dppo.oracles import make_oracle

    with pytest.raises(ConfigError, match="disagree"):
        make_oracle("dp_gd", accountant="rdp", composition="gdp")


def test_ppo_accountant_is_the_new_name_of_algo_composition_and_builds_the_same_release(tmp_path):
    """algo.composition (deprecated) and algo.accountant give DP-PPO the same release multiplier; contradicting
    values are refused in one line."""
    from dppo.api import train

    common = ["algo=dp_ppo", "rounds=1", "users_per_round=4", "eval_episodes=0", "eval_every=null",
              "progress=false", "logger=console", "env.horizon=20"]
    new = train(common + ["algo.accountant=rdp"], run_dir=str(tmp_path / "new"))
    old = train(common + ["algo.composition=rdp"], run_dir=str(tmp_path / "old"))
    gdp = train(common, run_dir=str(tmp_path / "gdp"))
    z = [s["ledger"][0].get("noise_multiplier", s["ledger"][0].get("sigma")) for s in (new, old, gdp)]
    assert z[0] == z[1] != z[2]
    with pytest.raises(ConfigError, match="disagree"):
        train(common + ["algo.accountant=rdp", "algo.composition=gdp"], run_dir=str(tmp_path / "both"))
