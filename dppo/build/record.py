"""What a run records of its config: the fingerprint a resume must match, the public config ``policy.pt`` and
``.hydra/config.yaml`` carry, and the hyper-parameters as they were used."""
from __future__ import annotations

import hashlib
import json

from dppo.build.checks import algo_name
from dppo.config import to_container

# The only settings a resumed run may change: where and how often it logs, checkpoints, evaluates, stops on
# a public evaluation. Every other key (eps, delta, rounds, users_per_round, group_size, clip norms, the
# algo's and oracle's parameters, accountant, population, secure_rng, max_epsilon, env, policy, seed) can
# change what a release spends or on whom, and a change to it refuses the resume, naming the key.
RESUME_MAY_CHANGE = ("logger", "progress", "checkpoint_every", "eval_episodes", "eval_every", "eval", "resume",
                     "callbacks", "hydra", "privacy.allow_over_target", "threads")


def fingerprint(cfg) -> dict:
    """Every setting a resumed run must share with the original, flattened (``oracle.x_bound``);
    the checkpoint stores it and resume compares it key by key (``check_fingerprint``)."""
    flat = _flat(to_container(cfg))
    keep = {k: _plain(v) for k, v in flat.items()
            if k.split(".", 1)[0] not in RESUME_MAY_CHANGE and k not in RESUME_MAY_CHANGE}
    keep["_hash"] = hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return keep


def _plain(v):
    if isinstance(v, (list, tuple)):
        return json.dumps(v, default=str)
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def public_config(cfg) -> dict:
    """The run's composed config as plain values, without Hydra's section or ``resume``: what ``policy.pt``
    carries to rebuild and run its policy (the same public config as ``.hydra/config.yaml``)."""
    out = to_container(cfg)
    out.pop("hydra", None)
    out.pop("resume", None)
    return out


def resolved_hparams(cfg, privacy, learner) -> dict:
    """The run's hyper-parameters as they were used: the accountant and what the learner says it was built with
    (``Learner.resolved_hparams``: the oracle, not a null default), eps = null for a non-private run, the
    algorithm's name; flattened ``a.b`` keys."""
    hp = _flat(to_container(cfg))
    hp.pop("resume", None)
    hp["algo"] = algo_name(cfg, type(learner), privacy.private)
    hp["eps"] = privacy.eps
    hp["private"] = bool(privacy.private)
    hp["privacy.accountant"] = privacy.accountant.name
    hp.update(learner.resolved_hparams())
    return hp


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
