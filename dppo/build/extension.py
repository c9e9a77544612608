"""Whether a resume may extend a run (more ``rounds`` / ``episodes``), or why not."""
from __future__ import annotations

from dppo.build.checks import algo_name


def extension_rules(cfg, cls, privacy) -> dict:
    """Whether a resume may raise ``rounds`` / ``episodes`` (extend a run), or why not (the refusal's reason).

    The learner says which key sets its run's length (``Learner.run_length``) and whether it refuses more of it
    whatever the privacy (``Learner.extension_refusal``: the tabular learners' private counters are sized for
    their episodes, GFA's releases compose). Otherwise one-pass rounds under parallel composition (and
    non-private rounds) may grow: each new round takes new users, released once at the run's eps, so every
    user's guarantee stays what it was. Not so where more releases compose (multi-pass RDP/PRV, the basic
    accountant).
    """
    name = algo_name(cfg, cls, privacy.private)
    own = cls.extension_refusal(name)
    if privacy.private and privacy.multi_pass:
        composes = ("multi-pass training composes every round's release (RDP/PRV): more rounds would spend more "
                    "than the target eps")
    elif privacy.private and privacy.accountant.name != "parallel":
        composes = (f"the {privacy.accountant.name} accountant composes every round's release: more rounds would "
                    f"spend more than the target eps")
    else:
        composes = None
    if cls.run_length != "rounds":
        rules = {"rounds": f"algo={name} runs for a number of {cls.run_length}, not rounds",
                 cls.run_length: own or composes}
    else:
        rules = {"rounds": own or composes}
    return rules
