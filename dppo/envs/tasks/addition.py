"""Zero-padded 3-digit addition: ``"123+456="`` -> ``"0579"``, rewarded digit by digit.

The reward follows TRL's calling convention, ``reward(prompts=..., completions=..., **columns)``: the
``answer`` column of the prompts file is passed through. A completion earns 1/4 per position whose digit
matches the answer (partial credit), so the reward lies in [0, 1]; characters beyond the answer's length
are ignored. The task is verifiable and has a smooth learning signal: a model that gets the low digits
right but not the carries earns about 0.5-0.8, the exact answer earns 1.
"""
from __future__ import annotations

import gzip
import json

import numpy as np

DIGITS = 3
CHARS = "0123456789+="


def problem(a: int, b: int) -> tuple[str, str]:
    """(prompt, answer) for a + b, zero-padded: 3-digit operands, 4-digit sum."""
    return f"{a:0{DIGITS}d}+{b:0{DIGITS}d}=", f"{a + b:0{DIGITS + 1}d}"


def digit_reward(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """Fraction of the answer's digit positions the completion gets right (0..1)."""
    out = []
    for c, ans in zip(completions, answer):
        out.append(sum(1.0 for i, ch in enumerate(ans) if i < len(c) and c[i] == ch) / len(ans))
    return out


def exact_match(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """1 if the completion starts with the exact answer, else 0 (a stricter reward, for reporting)."""
    return [float(c[:len(a)] == a) for c, a in zip(completions, answer)]


def sample_problems(n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    ab = rng.integers(0, 10**DIGITS, size=(n, 2))
    return [problem(int(a), int(b)) for a, b in ab]


def distinct_rows(sample, public: int, private: int, seed: int) -> list[dict]:
    """``public`` rows (held-out evaluation, ``split=public``) then ``private`` rows (the users of RL,
    ``split=private``) of distinct problems drawn by ``sample(n, rng)``, seeded."""
    rng = np.random.default_rng(seed)
    seen, rows = set(), []
    while len(rows) < public + private:
        for p, a in sample(public + private, rng):
            if p not in seen and len(rows) < public + private:
                seen.add(p)
                rows.append({"prompt": p, "answer": a, "split": "public" if len(rows) < public else "private"})
    return rows


def write_prompts(path: str, *, public: int, private: int, seed: int = 0) -> None:
    """A prompts file of :func:`distinct_rows` (``.gz`` paths are gzip-compressed)."""
    rows = distinct_rows(sample_problems, public, private, seed)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
