"""Whether a resume may extend a run (more ``rounds`` / ``episodes``), or why not."""
from __future__ import annotations

import inspect

from dppo.build.checks import algo_name


def extension_rules(cfg, cls, privacy) -> dict:
    """Whether a resume may raise ``rounds`` / ``episodes`` (extend a run), or why not (the refusal's reason).

    One-pass rounds under parallel composition (and non-private rounds) may grow: each new round takes new
    users, released once at the run's eps, so every user's guarantee stays what it was. Not so where more
    releases compose (multi-pass RDP/PRV, the basic accountant, GFA's batches) or where a learner's private
    counters are sized for its episodes (the tabular learners).
    """
    name = algo_name(cfg, cls, privacy.private)
    sig = inspect.signature(cls.__init__).parameters
    composes = getattr(cls, "uses_composition", False)
    if "rounds" not in sig:
        rounds = f"algo={name} runs for a number of episodes, not rounds"
    elif privacy.private and privacy.multi_pass:
        rounds = ("multi-pass training composes every round's release (RDP/PRV): more rounds would spend more than "
                  "the target eps")
    elif privacy.private and privacy.accountant.name != "parallel":
        rounds = (f"the {privacy.accountant.name} accountant composes every round's release: more rounds would spend "
                  f"more than the target eps")
    else:
        rounds = None
    rules = {"rounds": rounds}
    if composes:
        rules["episodes"] = (f"algo={name} splits its budget over the batches of the planned episodes (its releases "
                             f"compose): more episodes would spend more than the target eps")
    elif "episodes" in sig:
        rules["episodes"] = (f"algo={name} sizes its counters and confidence bounds for the planned episodes (a "
                             f"private counter's capacity is fixed when it is built)")
    return rules
