"""An ``env=prompts`` run loaded without its private prompts: what ``dppo.load`` builds to generate from it.

A released language model needs its weights, not the rows it was trained on. When ``dppo.load`` is given
a run whose private prompts are not at hand - rows passed from Python (``env.path=<python rows>``) and no
``train_dataset=`` given again, or a prompts file (``env.path``) that is no longer there - the run is
rebuilt on ``WithheldPromptsEnv``: no private row, so the policy loads and generates
(``run.policy.generate``) and nothing of the training data is read, hashed or checked. Evaluation uses public
prompts only, as always: the ones passed as ``eval_dataset=`` to ``dppo.load``, else the run's own
``env.eval_path`` file if it is there; without any, ``run.evaluate()`` says in one line what to pass. A
reward that cannot be imported here (a Python callable of the training session) is asked for only when
something is scored (``reward_funcs=``). The rows a run was trained on are checked (keyed fingerprint) only
when they are given (``dppo.load(run_dir, train_dataset=...)`` builds the run's own env, as before).
"""
from __future__ import annotations

import os

from dppo.envs.prompts import (PYTHON_ROWS, PromptCollector, PromptsEnv, dataset_rows, load_rows, reward_name,
                               resolve_file)
from dppo.errors import ConfigError


def prompts_at_hand(cfg, inputs: dict | None) -> bool:
    """Whether the private prompts of a prompts run's config can be read: ``train_dataset=`` given, or
    ``env.path`` a file that exists (from the working directory or the repository root)."""
    from omegaconf import OmegaConf

    if (inputs or {}).get("train_dataset") is not None:
        return True
    path = OmegaConf.select(cfg, "env.path", default=None)
    if not path or path == PYTHON_ROWS:
        return False
    return os.path.isfile(resolve_file(str(path)))


class WithheldPromptsEnv(PromptsEnv):
    """A prompts env with no private row (module docstring): ``public`` is the evaluation prompts at hand
    (``eval_dataset``, else the ``eval_path`` file if it exists, else none); every private operation (users,
    their content, the rows' fingerprint, the run's capacity) is refused or skipped. The constructor takes
    the run's ``cfg.env`` as ``PromptsEnv`` does (``dataset`` is not taken: with it, the run's own env is
    built)."""

    withheld = True    # ``dppo.load``: no rows to check the run's keyed fingerprint against
    data_parts = None  # no rows: the trainer keys no fingerprint of them

    def __init__(self, path: str | None = None, reward=None, **kwargs):
        if kwargs.get("dataset") is not None:
            raise ConfigError("WithheldPromptsEnv holds no private prompts; with train_dataset build PromptsEnv")
        self.reward_error = None
        super().__init__(path, reward, **kwargs)
        self.population = None    # unknown (private): no capacity to check, no user to draw

    def read(self, path, dataset, eval_dataset, split_key, public_size, eval_path=None):
        source = path or PYTHON_ROWS
        if eval_dataset is not None:
            public, evals = dataset_rows(eval_dataset, "eval_dataset"), "eval_dataset"
        elif eval_path and os.path.isfile(resolve_file(str(eval_path))):
            public, evals = load_rows(eval_path, "env.eval_path"), f"env.eval_path={eval_path}"
        else:
            public, evals = [], None
        marked = [i for i, r in enumerate(public) if r.get(split_key, "public") != "public"]
        if marked:
            raise ConfigError(f"{evals} row {marked[0]} has {split_key}={public[marked[0]][split_key]!r}; the "
                              f"evaluation prompts are public (scored, logged, shown): remove that row")
        self.eval_source = evals
        return public, [], source

    def set_rewards(self, reward, reward_funcs, reward_weights) -> None:
        """The run's rewards if they can be resolved here; else the reason, said when something is scored."""
        try:
            super().set_rewards(reward, reward_funcs, reward_weights)
        except ConfigError as err:
            specs = reward_funcs if reward_funcs is not None else ([] if reward is None else [reward])
            specs = list(specs) if isinstance(specs, (list, tuple)) else [specs]
            self.reward_fns, self.reward_names = [], [reward_name(s) for s in specs]
            self.reward_weights = [1.0] * len(specs) if reward_weights is None else [float(w) for w in reward_weights]
            self.reward_name = " + ".join(self.reward_names) or "none"
            self.reward_error = str(err)

    def call_reward(self, k: int, prompts: list, completions: list, columns: dict):
        if self.reward_error is not None:
            raise ConfigError(f"{self.reward_error.rstrip('.')}; to score completions, pass the reward again: "
                              f"dppo.load(path, reward_funcs=[...], eval_dataset=<public prompts>)")
        return super().call_reward(k, prompts, completions, columns)

    # ---- what needs the private rows -----------------------------------------------------------------
    def _refuse(self, what: str):
        raise ConfigError(f"{what} needs this run's private prompts, which were not given to dppo.load "
                          f"({self.withheld_source()}); load with train_dataset=... (or with env.path's file)")

    def withheld_source(self) -> str:
        return ("rows passed from Python" if self.path == PYTHON_ROWS else f"env.path={self.path} is not a file")

    def user_rows(self, users):
        self._refuse("training (users' prompts)")

    def member_content(self, users):
        self._refuse("the run's users")

    def check_capacity(self, rounds: int, users_per_round: int) -> None:
        """Nothing to check: no user is ever drawn from a withheld population."""

    def eval_rows(self, n: int | None = None) -> list[dict]:
        if not self.public:
            raise ConfigError(f"this run was loaded without its prompts ({self.withheld_source()}): it generates "
                              f"(run.policy.generate) but has no public prompts to evaluate on; pass them, "
                              f"dppo.load(path, eval_dataset=<public prompts>, reward_funcs=[...])")
        return super().eval_rows(n)

    @property
    def evaluates(self) -> bool:
        return bool(self.public)

    def collector(self, seed: int) -> "WithheldPromptCollector":
        return WithheldPromptCollector(self, seed)

    def __repr__(self) -> str:
        return (f"WithheldPromptsEnv({self.path!r}: private prompts not loaded, public={len(self.public)}"
                f"{'' if self.eval_source is None else ' from ' + self.eval_source}, reward={self.reward_name!r})")


class WithheldPromptCollector(PromptCollector):
    """``PromptCollector`` on a withheld env: whether the run had public prompts is not known here (a learner
    that needs them at the start, e.g. DP-NPG's public Fisher, is not refused: it will not train)."""

    @property
    def has_public(self):
        return True if self.env.public else None
