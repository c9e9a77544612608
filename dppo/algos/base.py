"""The learner interface every algorithm implements; the trainer owns the loop around it."""
from __future__ import annotations

import inspect
import typing

from dppo.errors import ConfigError


class Learner:
    """One algorithm. It receives its policy / env factory / privacy context / sampler (it builds none
    of them) and implements one round of collect-and-update.

    Subclasses set ``num_rounds`` and implement ``train_round`` and ``evaluate``; ``state_dict`` must
    hold everything needed to resume (parameters, optimizer, learner RNGs), but not the privacy
    context or the sampler, which the trainer checkpoints itself.

    What the trainer and the builder need to know of a learner it declares, so that neither guesses from
    its attribute names or its constructor's signature:

    - ``needs``: what the builder passes its constructor (``dppo.build.learner.build_learner``): objects
      (``policy``, ``space``, ``env``, ``privacy``, ``sampler``, ``logger``, ``oracle``, ``init_critic``) and
      run-level keys (``seed``, ``rounds``, ``episodes``, ``batch_size``, ``group_size``, ``max_grad_norm``,
      ``reward_bound``, ``eps``, ``delta``); each one a keyword of its ``__init__`` (a test checks both ways).
    - ``run_length``: the top-level key that sets how long a run is, ``rounds`` or ``episodes``; a resume
      may raise it only where ``extension_refusal`` and the privacy context allow (``dppo.build.extension``).
    - ``planned_length`` / ``planned_users``: that length, and the users a whole run draws.
    - ``horizon``: the steps of each episode where a round's metrics carry no ``diag/env_steps``.
    - ``uses_composition``: its releases compose over the run (the builder's accountant and extension rules).
    - ``space_defaults``: the parameter space the builder makes for its policy unless ``policy.*`` says otherwise.
    - ``hyperparameters()``: its ``algo.*`` keys with their types and defaults (the config checks read them).
    - ``name`` / ``names``: its name, and its (non-private, private) twins' (the run's ``algo`` name).
    - ``resolved_hparams()``: what the builder resolved for it beyond its config (the oracle a null
      ``oracle`` became), for the run's recorded hyper-parameters.
    - ``released_modules``: the released modules ``policy.pt`` carries and ``summary.json`` hashes.
    - ``lost_attempt_charges`` / ``export_artifacts``: hooks of the trainer, with no-op defaults.
    """

    name = "learner"
    num_rounds: int = 0
    # the run shape (top-level rounds, users_per_round, group_size) a run gets when it leaves those keys unset
    # (null): the learner's defaults, beside its others; the composed config records the values used
    default_run_shape: dict = {"rounds": 100, "users_per_round": 10, "group_size": 8}
    # the run-level shortcuts this learner reads besides its keyword arguments (``dppo.build.SHORTCUTS``)
    reads: tuple = ()
    # algo key -> (option, values): the key is read only when ``algo.<option>`` takes one of ``values``
    APPLIES: dict = {}
    # what the builder passes the constructor (``dppo.config.INJECTABLE`` names every possible one)
    needs: tuple = ()
    # the top-level key that sets how long a run is ("rounds" or "episodes"): the one a resume may raise
    run_length: str = "rounds"
    # the parameter space the builder makes for its policy unless policy.* says otherwise (None: the builder's)
    space_defaults: dict | None = None
    # the releases compose over the run (the accountant composes them; more rounds or episodes spend more)
    uses_composition: bool = False
    # the learner's names, (non-private, private): algo=<name> picks it
    names: tuple = ()

    @classmethod
    def accountant_name(cls, privacy_cfg, algo_cfg: dict | None = None) -> str:
        """The accountant a run gets with ``privacy.accountant`` null: parallel composition of one-pass rounds,
        Opacus' RDP for multi-pass ones; a learner whose releases need another says so."""
        return "rdp" if privacy_cfg.multi_pass else "parallel"

    @classmethod
    def releases_pure_dp(cls, cfg) -> bool:
        """Whether every release is pure eps-DP (delta = 0) under this config (default: Gaussian releases)."""
        return False

    @classmethod
    def releases_gaussian_sums(cls, cfg) -> bool:
        """Whether every private release is a round of the one release of clipped Gaussian sums
        (``dppo.privacy.composed``), whose noise may be correlated across rounds (``privacy.noise_correlation``)."""
        return False

    @classmethod
    def releases_carry_rho(cls, cfg) -> bool:
        """Whether the ledger entries carry their zCDP rho (the Gaussian continual counters')."""
        return False

    @property
    def planned_length(self) -> int:
        """The planned value of ``run_length``: rounds here; a learner run by episodes returns its episodes."""
        return int(self.num_rounds)

    def planned_users(self, users_per_round: int) -> int:
        """Users a whole run draws, given the sampler's round size: rounds x users per round here; one user per
        episode for a learner run by episodes."""
        return int(self.num_rounds) * int(users_per_round)

    @property
    def horizon(self) -> int | None:
        """Env steps of each episode, for the step axis (``dppo.training.steps``) where a round's metrics carry
        no ``diag/env_steps``; None: one step per episode is counted there."""
        return None

    @classmethod
    def extension_refusal(cls, algo: str) -> str | None:
        """Why a resume may not raise ``run_length`` whatever the privacy context (``algo``: the run's name for
        the line); None: it may, where the privacy context allows (``dppo.build.extension``)."""
        return None

    def released_modules(self) -> dict:
        """The released modules that ``policy.pt`` carries and ``summary.json`` hashes: ``"policy"`` (and an
        actor-critic's ``"critic"``); none here (a learner whose policy is no module: nothing to export)."""
        return {}

    def lost_attempt_charges(self, lost_rounds: list[int]) -> list[dict]:
        """Ledger entries to charge, besides the journalled releases, for the rounds a crashed attempt lost
        (a learner whose releases span rounds); none here."""
        return []

    def export_artifacts(self, run_dir: str, round_idx: int) -> None:
        """Write, with each checkpoint, files of the policy in another layout (e.g. a LoRA adapter); none here."""

    @property
    def public_env_steps(self) -> int | None:
        """Env steps of the public rollouts run so far (evaluation, public Fisher states); None here, where nothing
        counts them (a learner with a collector asks it: ``GroupPolicyOptimizer``). The trainer checkpoints it and
        reports it in ``summary.json``'s ``env_steps``."""
        return None

    @public_env_steps.setter
    def public_env_steps(self, value: int) -> None:
        """Restore the count from a checkpoint; nothing to restore here."""

    @classmethod
    def defaults(cls) -> dict:
        """The defaults of the learner's keyword arguments (the one home of each hyper-parameter)."""
        return {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}

    @classmethod
    def hyperparameters(cls) -> dict[str, tuple]:
        """The ``algo.*`` keys this learner takes: each keyword argument of ``__init__`` that the builder does not
        inject (not in ``needs``), as ``name -> (type, default)`` (the annotation resolved, or the text it cannot be
        resolved from; ``inspect.Parameter.empty`` where there is none). The config checks read their names and
        types here, so a learner taking a key another way (e.g. ``**kwargs``) overrides this."""
        params = inspect.signature(cls.__init__).parameters
        try:
            hints = typing.get_type_hints(cls.__init__)
        except Exception:  # noqa: BLE001 - an annotation that does not resolve: its text is read instead
            hints = {}
        return {n: (hints.get(n, p.annotation), p.default) for n, p in params.items()
                if n != "self" and n not in cls.needs and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def resolved_hparams(self) -> dict:
        """Hyper-parameters the builder resolved for this learner beyond its config, recorded with the run's (e.g.
        ``{"oracle": "ssp"}`` where ``oracle`` was null); none here."""
        return {}

    @classmethod
    def check_config(cls, algo: dict, **context) -> None:
        """Refuse an ``algo.*`` key that the chosen options make this learner ignore (one line, naming the
        option it needs); ``algo`` holds the keys set in the config, ``context`` what the builder knows
        besides (e.g. the oracle's class and keys)."""
        values = {**cls.defaults(), **algo}
        for key, (option, allowed) in cls.APPLIES.items():
            if key in algo and values.get(option) not in allowed:
                raise ConfigError(f"algo.{key} applies with algo.{option}={'|'.join(allowed)}, not "
                                  f"algo.{option}={values.get(option)}: remove it")

    @classmethod
    def check_env(cls, env) -> None:
        """Refuse, before the policy is built, an env this learner cannot learn from (one line naming the
        learners that can); every env with a policy goes by default."""

    def train_round(self, round_idx: int) -> dict[str, float]:
        """Run round ``round_idx``: collect from this round's users, make the (private) update,
        release through ``privacy.release``; return metrics: released ones (``privacy/*``, ``rollout/users``) and raw ones under ``diag/``."""
        raise NotImplementedError

    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean return of the current policy over ``episodes`` fresh evaluation episodes."""
        raise NotImplementedError

    def evaluate_episodes(self, episodes: int, greedy: bool = False):
        """``(returns, lengths)`` tensors of the held-out episodes ``evaluate`` averages (``evaluate`` is their mean), for
        a spread (``SavedRun.evaluate(return_std=True)``); None for a learner that scores otherwise."""
        return None

    # whether ``evaluate_candidate`` scores the released policy on its own public episodes (``eval.select=best``:
    # ``dppo/training/selection.py``); a learner whose policy is no network it can put back says no
    selects_final = False

    def evaluate_candidate(self, episodes: int, greedy: bool = False) -> float:
        """Mean return of the current policy on ``episodes`` public *selection* episodes, disjoint from the ones
        ``evaluate`` reports on (``eval.select=best`` scores the run's releases on them)."""
        raise ConfigError(f"eval.select=best is for the learners whose policy is a network (the PG, NPG, REBEL and "
                          f"PPO families); {type(self).__name__} releases its own policy: use eval.select=last")

    def summary(self) -> dict:
        """Extra fields for ``summary.json`` (e.g. ``cumulative_regret``)."""
        return {}

    def distribute(self, shards) -> None:
        """Make this learner multi-process (``torchrun``): wrap the parts its release reads with ``shards``
        (``shards.sampler(sampler)``: this rank's share of each round's users;
        ``shards.round_release(release, sampler)``: a round's clipped sums, each rank's added and noised on rank 0;
        ``shards.oracle(oracle)``: a least-squares oracle solved on rank 0; ``dppo.training.distributed``).
        A learner that does not override this runs in one process only."""
        raise ConfigError(f"multi-process training (torchrun) supports the policy-optimization learners (algo=pg|"
                          f"dp_pg|npg|dp_npg|rebel|dp_rebel|ppo|dp_ppo); {type(self).__name__} runs in one process")

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError


class EpisodeLearner(Learner):
    """A learner run by episodes, one user each (the tabular, model-based and GFA learners): ``run_length`` is
    ``episodes``, a whole run draws ``planned_episodes`` users (``T`` unless a subclass says otherwise) whatever the
    sampler's round size, and its episodes have ``H`` steps."""

    run_length = "episodes"

    @property
    def planned_episodes(self) -> int:
        return int(self.T)

    @property
    def planned_length(self) -> int:
        return self.planned_episodes

    def planned_users(self, users_per_round: int) -> int:
        return self.planned_episodes

    @property
    def horizon(self) -> int:
        return int(self.H)
