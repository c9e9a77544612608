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


@pytest.mark.parametrize("eps, workload", [(5.0, "prefix"), (1.0, "auto")])
def test_dp_pgs_budget_files_are_its_base_file_with_the_correlated_noise_that_won_there(eps, workload):
    """cartpole_dp_pg_eps5 / _eps1 take every setting of cartpole_dp_pg but eps and the noise's correlation (banded,
    16 bands; the factorization's workload as selected on seeds 100-102: runs/reference/correlated_noise.md)."""
    base = dppo.make_config(["+experiment=cartpole_dp_pg"])
    tuned = dppo.make_config([f"+experiment=cartpole_dp_pg_eps{eps:g}"])
    assert tuned.eps == eps and base.privacy.noise_correlation == "none"
    assert (tuned.privacy.noise_correlation, tuned.privacy.bands, tuned.privacy.noise_workload) == \
        ("banded", 16, workload)
    for key in ("algo", "policy", "env", "rounds", "users_per_round", "group_size"):
        assert tuned[key] == base[key], key
