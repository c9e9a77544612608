"""Which of a run's releases it ends with: the last (``eval.select=last``) or the best on held-out public episodes
(``eval.select=best``).

Every policy a private run holds after a round is released (a function of the round's noisy releases and of
public quantities). Scoring released policies on public episodes (public reset seeds and sampling streams, never
a user's) and keeping the best is post-processing: it costs no privacy, whatever the number of candidates. It is
only as sound as the episodes are public: on a simulator (every gymnasium env, ICU-Sepsis's published MDP) or on
held-out public prompts. Without one there is nothing public to score on (docs/privacy.md says what to do then).

The candidates are the policies at the run's evaluation points (``eval_every``) and the final one. Each is scored
on its own public stream, ``select`` (``eval_episodes`` episodes, the same for every candidate), and the winner's
``final_return`` is measured on the usual ``eval`` episodes: the score that chose it is not the number reported,
so the choice's own luck does not inflate the result. ``eval/return`` and every user's episode are the same as
without selection (nothing else draws from the ``select`` stream); only what the run ends with changes.
"""
from __future__ import annotations

import copy

from dppo.training.callbacks import Callback

RULES = ("last", "best")


def trainable_state(module) -> dict:
    """The entries of ``module.state_dict()`` that training changes: those sharing storage with a parameter that
    requires grad (a LoRA policy: its adapters, not the frozen base model), or every entry when no parameter
    is frozen; cloned."""
    params = list(module.parameters())
    state = module.state_dict()
    if all(p.requires_grad for p in params):
        return {k: v.detach().clone() for k, v in state.items()}
    live = {p.data_ptr() for p in params if p.requires_grad}
    return {k: v.detach().clone() for k, v in state.items() if v.data_ptr() in live}


class SelectBest(Callback):
    """``eval.select=best``: scores the released policy at each evaluation point on the ``select`` stream and keeps
    a copy of the best (its released modules' trained entries); ``finish`` scores the final policy the same way
    and installs the winner (later wins ties: more training for the same score)."""

    def __init__(self, episodes: int, greedy: bool = False):
        self.episodes, self.greedy = int(episodes), bool(greedy)
        self.best: dict | None = None       # {"round", "select_return", "modules": {name: state}}
        self.candidates = 0

    def score(self, trainer) -> float:
        return float(trainer.learner.evaluate_candidate(self.episodes, self.greedy))

    def offer(self, trainer, round_idx: int, value: float) -> None:
        self.candidates += 1
        if self.best is None or value >= self.best["select_return"]:
            modules = trainer.learner.released_modules()
            self.best = {"round": int(round_idx), "select_return": float(value),
                         "modules": {name: trainable_state(m) for name, m in modules.items()}}

    def on_round_end(self, trainer, round_idx, metrics):
        if "eval/return" in metrics:            # an evaluation point (EvalCallback ran just before)
            value = self.score(trainer)
            metrics["eval/select_return"] = value
            self.offer(trainer, round_idx, value)
        return True

    def finish(self, trainer) -> dict:
        """Score the final policy and offer it (the last candidate, kept in the checkpoint saved next, so that an
        extension of the run chooses among the same releases as a run that had been that long from the start);
        what was chosen (public: released policies scored on public episodes)."""
        last = trainer.round - 1
        final_value = self.score(trainer)
        if self.best is None or self.best["round"] != last:    # a resumed run may have scored it already
            self.offer(trainer, last, final_value)
        return {"rule": "best", "round": int(self.best["round"]) + 1, "last_round": int(trainer.round),
                "select_return": self.best["select_return"], "last_select_return": final_value,
                "candidates": self.candidates, "select_episodes": self.episodes}

    def install(self, trainer) -> None:
        """Put the chosen release in the learner's released modules."""
        for name, module in trainer.learner.released_modules().items():
            if name in self.best["modules"]:
                module.load_state_dict(self.best["modules"][name], strict=False)

    def state_dict(self) -> dict:
        return {"best": copy.deepcopy(self.best), "candidates": self.candidates}

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.best = copy.deepcopy(state.get("best"))
            self.candidates = int(state.get("candidates", 0))
