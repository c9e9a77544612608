"""TRL's ergonomics on env=prompts: weighted reward_funcs, Python rewards and datasets from the API (with the
split and privacy rules of a prompts file), chat templates, generate/predict on a loaded run, completions
logged at global_step, device=auto."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

import dppo
from dppo.api import make_config, train
from dppo.envs.prompts import PromptsEnv, canonical, load_rows
from dppo.envs.tasks.addition import digit_reward, exact_match
from dppo.errors import ConfigError
from dppo.policies.lm import LMPolicy
from tests.lm.conftest import MODEL, REWARD, lm_overrides


def test_reward_funcs_are_a_weighted_sum_clipped_to_the_bound(small_prompts):
    env = PromptsEnv(small_prompts, reward_funcs=[REWARD, "dppo.envs.tasks.addition.exact_match"],
                     reward_weights=[0.5, 2.0])
    rows = env.private[:4]
    comps = [rows[0]["answer"], rows[1]["answer"][:2] + "xx", "", rows[3]["answer"]]
    prompts, answers = [r["prompt"] for r in rows], [r["answer"] for r in rows]
    expect = (0.5 * np.array(digit_reward(prompts, comps, answers))
              + 2.0 * np.array(exact_match(prompts, comps, answers)))        # independent: the functions alone
    out, clipped = env.rewards(rows, comps, 1, reward_bound=None)
    np.testing.assert_allclose(out[:, 0], expect)
    out, clipped = env.rewards(rows, comps, 1, reward_bound=1.0)
    np.testing.assert_allclose(out[:, 0], np.clip(expect, -1, 1))
    assert clipped == int(np.sum(np.abs(expect) > 1)) == 2                    # the exact answers: 2.5 -> 1
    with pytest.raises(ConfigError, match="one finite weight per reward"):
        PromptsEnv(small_prompts, reward_funcs=[REWARD], reward_weights=[1.0, 1.0])


def _rows(small_prompts):
    rows = load_rows(small_prompts)
    public = [{k: v for k, v in r.items() if k != "split"} for r in rows if r["split"] == "public"]
    private = [{k: v for k, v in r.items() if k != "split"} for r in rows if r["split"] == "private"]
    return public, private


def test_a_python_reward_and_dataset_run_through_the_api_with_the_split_rules(small_prompts, tmp_path):
    """reward_funcs=[callable], train_dataset (a datasets.Dataset) and eval_dataset (a list of dicts): the users
    are training rows only, each once; evaluation calls the reward on the eval rows only; the reward gets the
    columns; the config records the reward's name and nothing about the rows (no hash: it is shareable); a resume
    needs the same rows, and rows given to a load must be the run's own (checked against the keyed fingerprint in
    the checkpoint, under the run's secret key); a load without rows generates."""
    try:
        from datasets import Dataset
        as_dataset = Dataset.from_list
    except ImportError:     # datasets is optional: a list of dicts is the same input
        as_dataset = list
    public, private = _rows(small_prompts)
    seen = {"private": [], "public": []}
    train_prompts = {r["prompt"] for r in private}

    def my_reward(prompts, completions, answer, **_):
        for p in prompts:
            seen["private" if p in train_prompts else "public"].append(p)
        return digit_reward(prompts, completions, answer)

    cfg = make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "checkpoint_every=1", "rounds=2"))
    run = tmp_path / "run"
    summary = train(cfg, str(run), reward_funcs=[my_reward], train_dataset=as_dataset(private),
                    eval_dataset=public)
    assert summary["rounds_done"] == 2 and len(summary["ledger"]) == 2 and summary["users_seen"] == 16
    users = seen["private"]
    assert len(users) == 16 * 4 and len(set(users)) == 16                   # 16 users x G = 4, each user once
    assert set(seen["public"]) <= {r["prompt"] for r in public[:8]} and seen["public"]   # eval_size = 8
    saved = (run / ".hydra" / "config.yaml").read_text()
    assert "test_trl_ergonomics" in saved and "my_reward" in saved
    assert "sha256" not in saved and "<python rows>" in saved
    import hashlib
    for rows in (public + private, private):                           # no unkeyed hash of the rows, anywhere shared
        digest = hashlib.sha256(b"".join(canonical(r) + b"\n" for r in rows)).hexdigest()
        for name in ("summary.json", ".hydra/config.yaml", ".hydra/overrides.yaml"):
            assert digest not in (run / name).read_text()
    other = as_dataset(private[::-1])
    with pytest.raises(ConfigError, match="not the rows this run was trained on"):
        train(cfg, str(run), resume=True, reward_funcs=[my_reward], train_dataset=other, eval_dataset=public)
    with pytest.raises(ConfigError, match="not the rows this run was trained on"):
        dppo.load(str(run), reward_funcs=[my_reward], train_dataset=private[::-1], eval_dataset=public)
    loaded = dppo.load(str(run), reward_funcs=[my_reward], train_dataset=private, eval_dataset=public)
    assert isinstance(loaded.policy.generate(public[0]["prompt"]), str)
    # without the rows it loads to generate (tests/lm/test_load_without_prompts.py), the same completions
    assert dppo.load(str(run)).policy.generate(public[0]["prompt"]) == loaded.policy.generate(public[0]["prompt"])


def test_a_dataset_without_split_or_eval_dataset_is_all_private(small_prompts):
    """No split column, eval_dataset or public_size: nobody said a row is public, so every row is a user and
    nothing is evaluated; env.public_size makes that many shuffled rows public."""
    _, private = _rows(small_prompts)
    env = PromptsEnv(dataset=private, reward=REWARD)
    assert env.public == [] and env.population == len(private) and not env.evaluates
    assert f"all {len(private)} rows of <python rows> are private users; no held-out evaluation" in env.split_note
    env = PromptsEnv(dataset=private, reward=REWARD, public_size=10)
    assert len(env.public) == 10 and env.population == len(private) - 10
    with pytest.raises(ConfigError, match="env=prompts"):
        train(make_config(["env=cartpole", "rounds=1"]), reward_funcs=[digit_reward])


def test_a_loaded_lm_run_generates_completions(small_prompts, tmp_path):
    """dppo.load(run).policy.generate / predict: greedy = the policy's own greedy decoding of the trained model;
    a seeded sample reproduces; several prompts give one completion each."""
    run = tmp_path / "run"
    train(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8")), str(run))
    policy = dppo.load(str(run)).policy
    prompts = ["123+456=", "001+002=", "999+999="]
    out = policy.generate(prompts)
    ids, mask = policy.encode(prompts)
    assert out == policy.sample(ids, mask, None).texts and all(len(c) <= policy.max_new_tokens for c in out)
    assert policy.predict(prompts) == out and policy.generate(prompts[0]) == out[0]
    a = policy.generate(prompts, greedy=False, num_samples=3, seed=7)
    assert a == policy.generate(prompts, greedy=False, num_samples=3, seed=7)
    assert len(a) == 3 and all(len(s) == 3 for s in a)
    assert all(len(c) <= 2 for c in policy.generate(prompts, max_new_tokens=2))
    assert policy.max_new_tokens == 5                                       # the cap is restored


CHAT = ("{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}")


def test_conversational_prompts_use_the_chat_template(small_prompts, tmp_path):
    """A conversation is rendered with the tokenizer's chat template (generation prompt appended), as TRL does;
    the reward gets TRL's conversational completions; without a template it is a one-line ConfigError."""
    chat_model = tmp_path / "chat-model"
    shutil.copytree(MODEL, chat_model)
    cfg = json.loads((chat_model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT
    (chat_model / "tokenizer_config.json").write_text(json.dumps(cfg))
    policy = LMPolicy(str(chat_model), lora={"r": 2, "target_modules": ["q_proj"]}, max_new_tokens=5)
    conv = [{"role": "user", "content": "123+456"}]
    assert policy.render([conv, "1+2="]) == ["123+456=", "1+2="]
    torch.testing.assert_close(policy.encode([conv])[0], policy.encode(["123+456="])[0])
    public, private = _rows(small_prompts)
    to_chat = [{"prompt": [{"role": "user", "content": r["prompt"][:-1]}], "answer": r["answer"]} for r in private]
    got = []

    def chat_reward(prompts, completions, answer, **_):
        got.append((prompts[0], completions[0]))
        return digit_reward(prompts, [c[0]["content"] for c in completions], answer)

    summary = train(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", f"policy.path={chat_model}",
                                             "env.public_size=8")),
                    str(tmp_path / "run"), reward_funcs=chat_reward, train_dataset=to_chat)
    assert summary["rounds_done"] == 2
    prompt, completion = got[0]
    assert prompt[0]["role"] == "user" and completion[0]["role"] == "assistant"
    plain = LMPolicy(MODEL, lora=None, max_new_tokens=5)
    with pytest.raises(ConfigError, match="chat template"):
        plain.encode([conv])


def test_completions_are_logged_at_global_step(small_prompts, tmp_path):
    """The text of round r is written at the step of round r's metrics (global_step), as every scalar is."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import csv

    run = tmp_path / "run"
    train(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "rounds=3")), str(run))
    acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("eval/completions/text_summary")
    with open(run / "progress.csv") as f:
        steps = {int(float(r["rollout/round"])): int(float(r["global_step"])) for r in csv.DictReader(f)
                 if r.get("rollout/round")}
    assert [e.step for e in events] == [steps[r] for r in range(3)] == [32, 64, 96]  # 8 users x G = 4 a round
    assert events[1].tensor_proto.string_val[0].decode().startswith("round 1")


def test_device_auto_picks_the_gpu_when_there_is_one():
    policy = LMPolicy(MODEL, lora={"r": 2, "target_modules": ["q_proj"]}, device="auto")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert policy.device_.type == expected
    assert all(p.device.type == expected for p in policy.model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_a_run_with_device_auto_trains_on_the_gpu(small_prompts, tmp_path):
    from dppo.build import build

    trainer = build(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "device=auto")), str(tmp_path))
    assert next(trainer.learner.policy.model.parameters()).device.type == "cuda"
    summary = trainer.fit()
    assert summary["rounds_done"] == 2 and np.isfinite(summary["final_return"])


def test_trl_runner_trains_and_is_scored_by_our_evaluator(tmp_path):
    """scripts/trl_grpo.py (TRL's GRPOTrainer on the experiment's prompts, each once): a smoke run writes a
    summary whose final_return is dppo's evaluation of the saved model."""
    pytest.importorskip("trl")
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    out = tmp_path / "trl"
    ovr = ["+experiment=lm_addition", "users_per_round=16", "rounds=2", "eval_episodes=16", "env.eval_size=16",
           "env.eval_samples=2"]
    res = subprocess.run([sys.executable, os.path.join(root, "scripts", "trl_grpo.py"), "--out", str(out), "--lr",
                          "1e-3", *ovr], capture_output=True, text=True, cwd=root,
                         env=dict(os.environ, PYTHONPATH=os.path.abspath(root)))
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    from scripts.trl_grpo import evaluate

    assert summary["complete"] and summary["rounds"] == 2
    assert summary["final_return"] == pytest.approx(evaluate(ovr, str(out / "model"))[0], abs=1e-9)
