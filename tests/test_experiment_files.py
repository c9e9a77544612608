"""Every file in conf/experiment/ composes with the schema, and the command its header gives runs that file."""
from __future__ import annotations

import os
import re

import pytest

import dppo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "conf", "experiment")) if f.endswith(".yaml"))


@pytest.mark.parametrize("name", FILES)
def test_each_experiment_file_composes_and_its_header_names_it(name):
    cfg = dppo.make_config([f"+experiment={name}"])
    assert cfg.algo["_target_"] and cfg.env["_target_"]
    text = open(os.path.join(ROOT, "conf", "experiment", f"{name}.yaml")).read()
    commands = re.findall(r"\+experiment=([\w]+)", text)
    assert name in commands, f"{name}.yaml's header gives no command that runs it"


def test_a_budget_file_is_its_base_file_with_the_budget_and_run_shape_changed():
    """cartpole_dp_ppo_eps1 takes every setting of cartpole_dp_ppo but eps and the run shape (one home each)."""
    base = dppo.make_config(["+experiment=cartpole_dp_ppo"])
    eps1 = dppo.make_config(["+experiment=cartpole_dp_ppo_eps1"])
    assert (eps1.eps, eps1.rounds, eps1.users_per_round) == (1.0, 40, 300)
    for key in ("algo", "policy", "env", "max_grad_norm", "group_size"):
        assert eps1[key] == base[key], key
