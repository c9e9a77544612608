"""A fine-tuned LM is used without its private prompts: ``dppo.load`` of a run directory or of a lone
``policy.pt`` (copied elsewhere, the prompts file gone) builds the policy to generate with no dataset at hand,
and the run's ``model/`` folder loads with ``from_pretrained`` (transformers / peft) and decodes as dppo's
policy does. Evaluation takes public prompts (``eval_dataset=``) and says in one line what to pass without."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import dppo
from dppo.api import make_config, train
from dppo.envs.prompts import load_rows
from dppo.envs.prompts_withheld import WithheldPromptsEnv
from dppo.envs.tasks.addition import digit_reward
from dppo.errors import ConfigError
from dppo.policies.lm import LMPolicy
from tests.lm.conftest import MODEL, lm_overrides

PROMPTS = ["123+456=", "001+002=", "999+999=", "250+250="]


def _rows(path):
    rows = load_rows(path)
    strip = [{k: v for k, v in r.items() if k != "split"} for r in rows]
    public = [r for r, s in zip(strip, rows) if s["split"] == "public"]
    private = [r for r, s in zip(strip, rows) if s["split"] == "private"]
    return public, private


@pytest.fixture(scope="module")
def python_rows_run(small_prompts, tmp_path_factory):
    """A 2-round LoRA run trained from Python rows (train_dataset / eval_dataset / a Python reward)."""
    public, private = _rows(small_prompts)
    run = tmp_path_factory.mktemp("python_rows") / "run"
    # a reward of the training session: its recorded name (<locals>.<lambda>) cannot be imported by a load
    reward = lambda prompts, completions, answer, **kw: digit_reward(prompts, completions, answer)  # noqa: E731
    summary = train(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "checkpoint_every=1")), str(run),
                    train_dataset=private, eval_dataset=public, reward_funcs=[reward])
    return run, summary, public, private, reward


def test_a_python_rows_run_loads_and_generates_without_its_rows(python_rows_run, tmp_path):
    """dppo.load(run_dir) and dppo.load(<copied policy.pt>) with no dataset: no private row is built, and the
    greedy completions are those of the run loaded with its rows (checked against the run, as before)."""
    run, summary, public, private, reward = python_rows_run
    with_rows = dppo.load(str(run), train_dataset=private, eval_dataset=public, reward_funcs=[reward])
    expected = with_rows.policy.generate(PROMPTS)
    loaded = dppo.load(str(run))
    assert isinstance(loaded.env, WithheldPromptsEnv) and loaded.env.private == [] and loaded.env.public == []
    assert isinstance(loaded.policy, LMPolicy) and loaded.rounds_done == 2
    assert loaded.policy.generate(PROMPTS) == expected
    alone = tmp_path / "elsewhere" / "policy.pt"
    alone.parent.mkdir()
    shutil.copy(run / "policy.pt", alone)
    from_file = dppo.load(str(alone))
    assert from_file.policy.generate(PROMPTS) == expected
    assert from_file.summary["rounds_done"] == 2 and from_file.checkpoint == str(alone)
    with pytest.raises(ConfigError, match="not the rows this run was trained on"):   # rows given: still checked
        dppo.load(str(run), train_dataset=private[::-1], eval_dataset=public, reward_funcs=[reward])


def test_a_run_loaded_without_rows_evaluates_on_public_prompts_given_to_load(python_rows_run):
    """Without public prompts evaluate says what to pass in one line; a reward of the training session (not
    importable) is asked for when scoring; with both the run's final_return is reproduced."""
    run, summary, public, _, reward = python_rows_run
    with pytest.raises(ConfigError, match=r"no public prompts to evaluate on; pass them, dppo.load\(path, eval_"):
        dppo.load(str(run)).evaluate()
    with pytest.raises(ConfigError, match=r"pass the reward again: dppo.load\(path, reward_funcs="):
        dppo.load(str(run), eval_dataset=public).evaluate()
    assert dppo.load(str(run), eval_dataset=public, reward_funcs=[reward]).evaluate() == summary["final_return"]


def test_a_lone_policy_pt_loads_with_its_prompts_file_gone(small_prompts, tmp_path, monkeypatch):
    """The issue's second case: env.path=my_prompts.jsonl (relative) deleted, policy.pt copied to another
    folder; both it and the run directory load and decode greedily as the run loaded with its file did."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    shutil.copy(small_prompts, work / "my_prompts.jsonl")
    run = work / "run"
    train(make_config(lm_overrides("my_prompts.jsonl", "algo=dp_pg", "eps=8")), str(run))
    expected = dppo.load(str(run)).policy.generate(PROMPTS)       # the file is there: the run's own env
    shutil.copy(run / "policy.pt", tmp_path / "policy.pt")
    os.remove(work / "my_prompts.jsonl")
    monkeypatch.chdir(tmp_path)
    for path in (tmp_path / "policy.pt", run, run / "policy.pt"):
        loaded = dppo.load(str(path))
        assert isinstance(loaded.env, WithheldPromptsEnv)
        assert loaded.env.withheld_source() == "env.path=my_prompts.jsonl is not a file"
        assert loaded.policy.generate(PROMPTS) == expected, path
    with pytest.raises(ConfigError, match="no public prompts to evaluate on"):
        loaded.evaluate()


def _hf_greedy(model, tokenizer, prompts, max_new_tokens):
    """Greedy completions with transformers' own ``generate``, one prompt at a time (no padding)."""
    out = []
    for p in prompts:
        enc = tokenizer(p, return_tensors="pt", add_special_tokens=False)
        ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        out.append(tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))
    return out


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_model_folder_loads_with_from_pretrained_and_decodes_as_dppo(small_prompts, tmp_path, monkeypatch,
                                                                          lora):
    """<run_dir>/model/ holds what TRL's trainers save in output_dir (the LoRA adapter, or the whole model, and
    the tokenizer): AutoPeftModelForCausalLM / AutoModelForCausalLM / PeftModel.from_pretrained load it from any
    directory, with nothing downloaded, and give the logits and greedy completions of dppo's loaded policy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    extra = () if lora else ("policy.lora=null",)
    train(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", *extra)), str(run))
    folder = run / "model"
    policy = dppo.load(str(run / "policy.pt")).policy
    monkeypatch.chdir(tmp_path)                      # not the repository root: the base is named absolutely
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    models = [AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)]
    if lora:
        from peft import AutoPeftModelForCausalLM, PeftModel

        config = json.loads((folder / "adapter_config.json").read_text())
        assert os.path.isabs(config["base_model_name_or_path"])
        assert os.path.samefile(config["base_model_name_or_path"], MODEL)
        models += [AutoPeftModelForCausalLM.from_pretrained(folder, local_files_only=True),
                   PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(MODEL), folder)]
    else:
        assert (folder / "model.safetensors").is_file() and not (folder / "adapter_config.json").exists()
    expected = policy.generate(PROMPTS)
    ids, mask = policy.encode(PROMPTS)
    with torch.no_grad():
        ours = policy.model(input_ids=ids, attention_mask=mask).logits
        base = AutoModelForCausalLM.from_pretrained(MODEL)(input_ids=ids, attention_mask=mask).logits
    assert not torch.allclose(ours, base, atol=1e-6)   # the released weights differ from the base model's
    for model in models:
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, ours, atol=1e-5, rtol=1e-5)
        assert _hf_greedy(model, tokenizer, PROMPTS, policy.max_new_tokens) == expected


@pytest.mark.parametrize("algo", [("algo=dp_npg", "oracle=dp_gd", "algo.step=kl", "algo.max_kl=0.01"),
                                  ("algo=dp_rebel",)], ids=["dp_npg", "dp_rebel"])
def test_every_lm_learner_loads_without_its_rows(small_prompts, tmp_path, algo):
    """DP-NPG with its public Fisher (which needs public prompts at the start of a run) and DP-REBEL load from a
    run directory with no rows and decode as with them."""
    public, private = _rows(small_prompts)
    run = tmp_path / "run"
    train(make_config(lm_overrides(small_prompts, *algo, "eps=8")), str(run), train_dataset=private,
          eval_dataset=public)
    expected = dppo.load(str(run), train_dataset=private, eval_dataset=public).policy.generate(PROMPTS)
    loaded = dppo.load(str(run))
    assert isinstance(loaded.env, WithheldPromptsEnv) and loaded.policy.generate(PROMPTS) == expected
