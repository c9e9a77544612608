"""Shared fixtures of the LM tests: the shipped tiny model and prompts file (seconds, CPU)."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "assets", "lm", "tiny-addition")
PROMPTS = os.path.join(ROOT, "assets", "lm", "addition.jsonl.gz")
REWARD = "dppo.envs.tasks.addition.digit_reward"


@pytest.fixture(scope="session")
def small_prompts(tmp_path_factory):
    """A small prompts file: 16 public + 64 private addition problems."""
    from dppo.envs.tasks.addition import write_prompts

    path = str(tmp_path_factory.mktemp("prompts") / "small.jsonl")
    write_prompts(path, public=16, private=64, seed=3)
    return path


def lm_overrides(prompts: str, *extra: str) -> list[str]:
    """A 2-round run of the tiny model on ``prompts`` (8 users a round)."""
    return ["env=prompts", "policy=lm", f"env.path={prompts}", f"env.reward={REWARD}", "rounds=2",
            "users_per_round=8", "group_size=4", "eval_episodes=8", "env.eval_size=8", "eval_every=1",
            "env.show_every=1", "policy.max_new_tokens=5", "progress=false", "privacy.secure_rng=false",
            *extra]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
