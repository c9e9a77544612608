"""Exact answers: ``"47+385="`` -> ``"432"`` and nothing after it, rewarded 1 or 0.

A format-and-exactness task where supervised fine-tuning leaves most of the reward on the table. Operands
have 1-3 digits and are not padded, so the answer's length (1-4 digits) depends on the carries. The public
demonstrations are the kind a model imitates from text that goes on: after the answer a demonstration
ends (EOS) with probability ``STOP`` only, and otherwise continues with ``;`` and further solved problems
(``"47+385=432;6+71=77;..."``). A model fine-tuned on them computes the answer but rarely stops after it.
The reward (``exact_reward``, TRL's calling convention, the ``answer`` column passed through) is 1 when the
completion is exactly the answer - right digits, then the end - and 0 otherwise, so a completion that
keeps writing earns nothing however right its digits are. ``answer_reward`` scores the digits alone (the
completion's text up to its first non-digit), for reporting.
"""
from __future__ import annotations

import gzip
import json

import numpy as np

from dppo.envs.tasks.addition import distinct_rows

MAX_OPERAND = 999
CHARS = "0123456789+=;"
STOP = 0.25          # the share of demonstrations that end right after the answer


def problem(a: int, b: int) -> tuple[str, str]:
    """(prompt, answer) for a + b, without padding."""
    return f"{a}+{b}=", f"{a + b}"


def exact_reward(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """1 if the completion is exactly the answer (nothing before or after it), else 0."""
    return [float(c == a) for c, a in zip(completions, answer)]


def leading_digits(text: str) -> str:
    out = []
    for ch in text:
        if not ch.isdigit():
            break
        out.append(ch)
    return "".join(out)


def answer_reward(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """1 if the completion's leading digits are the answer (whatever follows), else 0: content without format."""
    return [float(leading_digits(c) == a) for c, a in zip(completions, answer)]


def sample_problems(n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    ab = rng.integers(0, MAX_OPERAND + 1, size=(n, 2))
    return [problem(int(a), int(b)) for a, b in ab]


def demonstration(first: tuple[str, str], rng: np.random.Generator, max_chars: int) -> tuple[str, str, bool]:
    """(prompt, target text, ends with EOS): the answer, then with probability 1 - STOP ``;`` and more solved
    problems up to ``max_chars`` characters in all (the demonstrator's habit of going on)."""
    prompt, answer = first
    if rng.random() < STOP:
        return prompt, answer, True
    text = answer
    while len(prompt) + len(text) < max_chars:
        p, a = sample_problems(1, rng)[0]
        text += ";" + p + a
    return prompt, text[: max_chars - len(prompt)], False


def write_prompts(path: str, *, public: int, private: int, seed: int = 0) -> None:
    """A prompts file of :func:`~dppo.envs.tasks.addition.distinct_rows` (``.gz`` paths are gzip-compressed,
    with mtime 0)."""
    rows = distinct_rows(sample_problems, public, private, seed)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
    with open(path, "wb") as f:  # gzip with mtime 0: the same bytes on every build
        f.write(gzip.compress(text, mtime=0) if path.endswith(".gz") else text)
