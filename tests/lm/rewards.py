"""Broken reward callables for the error tests (importable by a ``train.py`` subprocess)."""
import math


def wrong_length(prompts, completions, **_):
    return [0.0] * (len(completions) - 1)


def nan_reward(prompts, completions, **_):
    return [math.nan] * len(completions)
