"""The tasks' rewards and the shipped exact-answer model: the reward is exactness (digits and the end), the
demonstrations stop after the answer at the stated rate, and the SFT model computes but rarely stops."""
from __future__ import annotations

import numpy as np

from dppo.envs.prompts import PromptsEnv
from dppo.envs.tasks import exact
from dppo.policies.lm import LMPolicy

ROOT_MODEL = "assets/lm/tiny-exact"


def test_exact_reward_needs_the_digits_and_the_end():
    prompts, answers = ["47+385="] * 5, ["432"] * 5
    comps = ["432", "432;6+7", "431", "43", ""]
    assert exact.exact_reward(prompts, comps, answers) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert exact.answer_reward(prompts, comps, answers) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert exact.problem(47, 385) == ("47+385=", "432") and exact.problem(0, 7) == ("0+7=", "7")


def test_demonstrations_end_after_the_answer_at_the_stated_rate():
    rng = np.random.default_rng(0)
    demos = [exact.demonstration(exact.problem(12, 30), rng, 24) for _ in range(4000)]
    ends = np.array([e for _, _, e in demos])
    assert abs(ends.mean() - exact.STOP) < 4 * np.sqrt(exact.STOP * (1 - exact.STOP) / len(demos))
    for prompt, target, e in demos:
        assert target.startswith("42") and (target == "42" if e else target[2] == ";")
        assert len(prompt) + len(target) <= 24


def test_the_shipped_sft_model_computes_but_rarely_stops():
    env = PromptsEnv("assets/lm/exact.jsonl.gz", "dppo.envs.tasks.exact.exact_reward")
    assert len(env.public) == 512 and env.population == 16384
    assert not {r["prompt"] for r in env.public} & {r["prompt"] for r in env.private}
    rows = env.eval_rows(128)
    policy = LMPolicy(ROOT_MODEL, lora=None, max_new_tokens=5)
    comps = policy.generate(env.prompts(rows))
    answers = [r["answer"] for r in rows]
    content = np.mean(exact.answer_reward(None, comps, answers))
    exactly = np.mean(exact.exact_reward(None, comps, answers))
    assert content > 0.5 and exactly < 0.1       # greedy: right digits, then ';' (the demonstrator goes on)
