"""The learner interface every algorithm implements; the trainer owns the loop around it."""
from __future__ import annotations


class Learner:
    """One algorithm. It receives its policy / env factory / privacy context / sampler (it builds none
    of them) and implements one round of collect-and-update.

    Subclasses set ``num_rounds`` and implement ``train_round`` and ``evaluate``; ``state_dict`` must
    hold everything needed to resume (parameters, optimizer, learner RNGs), but not the privacy
    context or the sampler, which the trainer checkpoints itself.
    """

    name = "learner"
    num_rounds: int = 0
    # env steps of public rollouts (evaluation, public Fisher states) run so far; None if not counted.
    # The trainer checkpoints it and reports it in summary.json's ``env_steps``.
    public_env_steps: int | None = None

    def train_round(self, round_idx: int) -> dict[str, float]:
        """Run round ``round_idx``: collect from this round's users, make the (private) update,
        release through ``privacy.release``; return metrics: released ones (``privacy/*``, ``rollout/users``) and raw ones under ``diag/``."""
        raise NotImplementedError

    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean return of the current policy over ``episodes`` fresh evaluation episodes."""
        raise NotImplementedError

    def summary(self) -> dict:
        """Extra fields for ``summary.json`` (e.g. ``cumulative_regret``)."""
        return {}

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError
