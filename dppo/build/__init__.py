"""Config -> objects, in one place and in order: env -> policy -> privacy -> sampler -> learner -> trainer.

One module per job: ``run`` (``build``, the order), ``env``, ``policy`` (and the weights' source), ``checks`` (keys,
values, shortcuts, names), ``privacy`` (accountant, noise, sampler), ``pretraining`` (the users the initial weights
consumed), ``memory``, ``learner`` (injection, oracle), ``record`` (fingerprint, public config, hyper-parameters)
and ``extension`` (what a resume may extend). The names below are the package's public surface.
"""
from __future__ import annotations

from dppo.build.checks import (RENAMED_KEYS, SHORTCUTS, algo_name, check_config_values, check_policy_device,
                               check_shortcuts, check_target_keys, check_target_values, parameter_kind)
from dppo.build.env import ENV_INPUTS, build_env, env_inputs, record_env_inputs
from dppo.build.extension import extension_rules
from dppo.build.learner import build_learner, build_oracle, learner_reward_bound
from dppo.build.memory import ROUND_MEMORY_FRACTION, check_memory
from dppo.build.policy import (REPO_ROOT, build_policy, build_space, check_policy_fits_env, load_init_source,
                               read_init_source)
from dppo.build.pretraining import exclude_pretraining_users, inherited_provenance, secret_provenance
from dppo.build.privacy import build_privacy, build_sampler, check_accountant
from dppo.build.record import RESUME_MAY_CHANGE, fingerprint, public_config, resolved_hparams
from dppo.build.run import build, check_writable, learner_class, seed_everything
# the key introspection lives in dppo.config; re-exported here, where callers have always imported it
from dppo.config import INJECTABLE, POLICY_KEYS, SPACE_KEYS, accepted_keys, did_you_mean, group_keys, hint_line

__all__ = ["INJECTABLE", "POLICY_KEYS", "SPACE_KEYS", "accepted_keys", "did_you_mean", "group_keys", "hint_line",
           "RENAMED_KEYS", "SHORTCUTS", "algo_name", "check_config_values", "check_policy_device", "check_shortcuts",
           "check_target_keys", "check_target_values", "parameter_kind", "ENV_INPUTS", "build_env", "env_inputs",
           "record_env_inputs", "extension_rules", "build_learner", "build_oracle", "learner_reward_bound",
           "ROUND_MEMORY_FRACTION", "check_memory", "REPO_ROOT", "build_policy", "build_space",
           "check_policy_fits_env", "load_init_source", "read_init_source", "exclude_pretraining_users",
           "inherited_provenance", "secret_provenance", "build_privacy", "build_sampler", "check_accountant",
           "RESUME_MAY_CHANGE", "fingerprint", "public_config", "resolved_hparams", "build", "check_writable",
           "learner_class", "seed_everything"]
