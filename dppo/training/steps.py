"""The logging step axis (``global_step``): cumulative environment steps, or cumulative episodes.

Counted from each round's metrics: ``rollout/episodes`` (users x group size; ``rollout/users`` if absent) and
``diag/env_steps`` (this round's env steps; for learners without it, episodes x
``learner.horizon``, the fixed episode length it declares, or one step per episode where it declares none).
With ``logger.diagnostics=false`` the axis is the number of episodes, which is public (the users drawn), while
the number of env steps depends on the users' episode lengths. Saved in every checkpoint so a resumed run
continues the axis.
"""
from __future__ import annotations


class StepCounter:
    """Cumulative env steps and episodes over the rounds done so far."""

    def __init__(self):
        self.env_steps = 0
        self.episodes = 0

    def update(self, metrics: dict, learner=None) -> None:
        episodes = int(metrics.get("rollout/episodes", metrics.get("rollout/users", 0)) or 0)
        steps = metrics.get("diag/env_steps")
        if steps is None:
            horizon = None if learner is None else learner.horizon
            steps = episodes * int(horizon) if horizon is not None else episodes
        self.episodes += episodes
        self.env_steps += int(steps)

    def global_step(self, diagnostics: bool = True) -> int:
        return self.env_steps if diagnostics else self.episodes

    def state_dict(self) -> dict:
        return {"env_steps": self.env_steps, "episodes": self.episodes}

    def load_state_dict(self, state: dict | None) -> None:
        state = state or {}
        self.env_steps, self.episodes = int(state.get("env_steps", 0)), int(state.get("episodes", 0))
