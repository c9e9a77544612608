"""Bring your own LM in one command (docs/finetuning.md): the README's line

    python train.py algo=dp_pg policy=lm policy.path=<model> env=prompts env.path=my_prompts.jsonl \\
        env.reward=my_module.my_reward eps=8

on a GPT-2-shaped and on a Llama-shaped model built here (tiny random weights, a character tokenizer; nothing
downloaded), with a JSONL of prompt / answer rows without a split column and a reward in a module of the working
directory: every row is a private user, nothing is evaluated, LoRA targets are chosen for the architecture. The
same from Python (``dppo.train(..., train_dataset=rows, reward_funcs=[f])``, rows standing in for the config),
the split rules (env.eval_path, a row marked private in the evaluation prompts, a split column on some rows
only), and that the number of private rows reaches no shareable file (runs on n and n + 1 rows)."""
from __future__ import annotations

import json
import sys

import pytest
import torch

import dppo
from dppo.envs.prompts import PromptsEnv
from dppo.errors import ConfigError
from dppo.policies.lm import LMPolicy, lora_targets
from tests.training.test_shareable_neighbours import QUIET, _cli, assert_neighbours_indistinguishable, neighbouring_runs

CHARS = "0123456789+="
ROWS = 24          # prompts in the file: 2 rounds x 4 users use 8 of them
SMALL = ["rounds=2", "users_per_round=4", "group_size=2", "policy.max_new_tokens=3"]   # a fast run's shape
REWARD_MODULE = '''
def my_reward(prompts, completions, answer, **kwargs):
    """1/len per right character of the answer."""
    return [sum(a == b for a, b in zip(c, ans)) / len(ans) for c, ans in zip(completions, answer)]
'''


def rows(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, 50, (2, n), generator=g).tolist()
    return [{"prompt": f"{x}+{y}=", "answer": str(x + y)} for x, y in zip(a, b)]


def write_jsonl(path, data) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in data)


def gpt2_tokenizer():
    """GPT-2's convention: one special token (``<|endoftext|>``: BOS, EOS and unknown) and no pad token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    end = "<|endoftext|>"
    vocab = {end: 0, **{c: i + 1 for i, c in enumerate(sorted(CHARS))}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=end))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end)


def save_model(kind: str, directory) -> str:
    """A tiny random ``kind`` (gpt2 | llama) causal LM and its tokenizer in the save_pretrained layout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from dppo.policies.tiny_lm import char_tokenizer, tiny_llama

    torch.manual_seed(0)
    if kind == "gpt2":
        tok = gpt2_tokenizer()
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                           bos_token_id=0, eos_token_id=0))
    else:
        tok = char_tokenizer(CHARS)
        model = tiny_llama(tok, hidden=16, layers=2, heads=2, intermediate=32, context=32)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {kind: save_model(kind, root / kind) for kind in ("gpt2", "llama")}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory holding my_prompts.jsonl (no split column) and my_module.py (the reward)."""
    write_jsonl(tmp_path / "my_prompts.jsonl", rows(ROWS))
    (tmp_path / "my_module.py").write_text(REWARD_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "my_module", raising=False)   # this test's module, not an earlier one
    return tmp_path


def readme_line(model: str) -> list[str]:
    """The README's bring-your-own command, read from the README, with ``model`` for its placeholder path."""
    from tests.docs.test_readme import README, code_blocks, shell_commands

    line = next(cmd for info, body in code_blocks(README.read_text()) if info == "bash"
                for cmd in shell_commands(body) if "policy.path=/path/to/local/hf/model" in cmd)
    assert line[:2] == ["python", "train.py"]
    return [a.replace("/path/to/local/hf/model", model) for a in line[2:]]


@pytest.mark.parametrize("kind,targets", [("gpt2", ["c_attn"]), ("llama", ["q_proj", "v_proj"])])
def test_the_readme_line_trains_a_model_without_a_split_column(models, workdir, capfd, kind, targets):
    """The README's line as printed (plus a small run's shape): all rows are private users, no held-out
    evaluation (said in one line; final_return null, no eval/return), LoRA on peft's targets for the
    architecture (said in one line), and the adapter saved in peft's layout."""
    run = workdir / "run"
    _cli([*readme_line(models[kind]), *SMALL], str(run))
    err = capfd.readouterr().err
    split = [line for line in err.splitlines() if "no 'split' column" in line]
    assert split == [f"dppo: note: no 'split' column and no env.eval_path: all {ROWS} rows of my_prompts.jsonl are "
                     f"private users; no held-out evaluation (give env.eval_path=<public prompts> to evaluate)"]
    assert f"LoRA on [{', '.join(targets)}] (peft's default for model_type={kind})" in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and summary["rounds_done"] == 2 and len(summary["ledger"]) == 2
    assert summary["users_seen"] == 8 and summary["final_return"] is None and summary["final_greedy_return"] is None
    assert "eval/return" not in (run / "progress.csv").read_text().splitlines()[0].split(",")
    adapter = json.loads((run / "model" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == targets


def test_with_env_eval_path_the_run_evaluates_on_those_prompts_only(models, workdir):
    """env.eval_path: a file of public evaluation prompts; the training file's rows stay all private."""
    evals = rows(6, seed=1)
    write_jsonl(workdir / "eval.jsonl", evals)
    _cli([*readme_line(models["llama"]), "env.eval_path=eval.jsonl", *SMALL, "eval_episodes=6"], str(workdir / "run"))
    summary = json.loads((workdir / "run" / "summary.json").read_text())
    assert summary["complete"] and isinstance(summary["final_return"], float)
    env = PromptsEnv("my_prompts.jsonl", "my_module.my_reward", eval_path="eval.jsonl")
    assert env.public == evals and env.population == ROWS and env.split_note is None


def test_the_number_of_private_rows_reaches_no_shareable_file(models, workdir, tmp_path):
    """Without a split column the console names the number of private rows; the run's shareable files
    (summary.json, policy.pt, .hydra/, the adapter, events, progress.csv) are the same for a file of n rows
    and of n + 1 rows, once the released values are masked."""
    data = {"a": rows(ROWS), "b": rows(ROWS) + rows(1, seed=9)}

    def run(world, run_dir):
        write_jsonl(workdir / "my_prompts.jsonl", data[world])
        _cli([*[o for o in readme_line(models["llama"]) if o != "eps=8"], *SMALL, *QUIET], run_dir)

    assert_neighbours_indistinguishable(*neighbouring_runs(tmp_path, run))


def my_reward(prompts, completions, answer, **_):
    return [sum(a == b for a, b in zip(c, ans)) / len(ans) for c, ans in zip(completions, answer)]


@pytest.mark.parametrize("as_dataset", [False, True], ids=["list", "datasets.Dataset"])
def test_python_rows_with_no_eval_set_train(models, tmp_path, capfd, as_dataset):
    """dppo.train(cfg, train_dataset=[{"prompt": ...}, ...], reward_funcs=[f]) with no split and no eval set: the
    rows imply env=prompts (and policy=lm, algo=dp_pg), every row is a private user, nothing is evaluated."""
    data = rows(ROWS)
    if as_dataset:
        data = pytest.importorskip("datasets").Dataset.from_list(data)
    summary = dppo.train([f"policy.path={models['gpt2']}", *SMALL, "eps=8"], str(tmp_path / "run"),
                         train_dataset=data, reward_funcs=[my_reward])
    assert summary["complete"] and summary["rounds_done"] == 2 and summary["final_return"] is None
    assert summary["algo"] == "dp_pg" and summary["env_id"] == "prompts:<python rows>"
    assert f"all {ROWS} rows of <python rows> are private users" in capfd.readouterr().err
    saved = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "<python rows>" in saved and "my_reward" in saved


def test_rows_in_the_config_place_and_an_explicit_env(models, tmp_path):
    """dppo.train(rows, ...) is dppo.train(None, ..., train_dataset=rows): the default run's shape (100 rounds x 10
    users) needs more rows than these, said in one line before anything runs; an env chosen explicitly stays."""
    with pytest.raises(ConfigError, match=f"needs 1000 prompts .* has {ROWS} private prompts"):
        dppo.train(rows(ROWS), reward_funcs=[my_reward])
    with pytest.raises(ConfigError, match="given twice"):
        dppo.train(rows(ROWS), train_dataset=rows(ROWS))
    with pytest.raises(ConfigError, match="apply to env=prompts"):
        dppo.train(["env=cartpole"], train_dataset=rows(ROWS), reward_funcs=[my_reward])
    summary = dppo.train(["+experiment=lm_addition", "rounds=1", "users_per_round=4", "group_size=2",
                          "eval_episodes=2", "env.eval_size=2", "policy.max_new_tokens=5"],
                         train_dataset=[{"prompt": "123+456=", "answer": "0579"}] * 4, reward_funcs=[my_reward],
                         eval_dataset=[{"prompt": "001+002=", "answer": "0003"}])
    assert summary["algo"] == "dp_pg" and summary["final_return"] is not None


def test_split_rules_never_make_a_row_public_unless_told(tmp_path):
    data = rows(10)
    env = PromptsEnv(dataset=data, reward_funcs=[my_reward])
    assert env.public == [] and env.population == 10 and not env.evaluates and "no held-out evaluation" in env.split_note
    assert len(PromptsEnv(dataset=data, reward_funcs=[my_reward], public_size=3).public) == 3   # said so: 3 public
    some = [dict(r, split="public") if i == 0 else r for i, r in enumerate(data)]
    with pytest.raises(ConfigError, match="some rows"):
        PromptsEnv(dataset=some, reward_funcs=[my_reward])
    with pytest.raises(ConfigError, match="evaluation prompts are public"):
        PromptsEnv(dataset=data, reward_funcs=[my_reward], eval_dataset=[dict(data[0], split="private")])
    write_jsonl(tmp_path / "train.jsonl", data)
    with pytest.raises(ConfigError, match="env.eval_path=.* is not a file"):
        PromptsEnv(str(tmp_path / "train.jsonl"), reward_funcs=[my_reward], eval_path=str(tmp_path / "none.jsonl"))
    with pytest.raises(ConfigError, match="give one"):
        PromptsEnv(dataset=data, reward_funcs=[my_reward], eval_dataset=data[:2], eval_path=str(tmp_path / "train.jsonl"))


def test_npg_without_public_prompts_is_refused_before_any_user(models, workdir):
    """DP-NPG's public Fisher matrix needs public prompts: with every row private it is refused at build time."""
    from dppo.api import make_config
    from dppo.build import build

    cfg = make_config(["algo=dp_npg", "policy=lm", f"policy.path={models['llama']}", "env=prompts",
                       "env.path=my_prompts.jsonl", "env.reward=my_module.my_reward", "oracle=dp_gd", *SMALL])
    with pytest.raises(ConfigError, match="public Fisher matrix .* needs public prompts"):
        build(cfg)


def test_lora_targets_per_architecture(models):
    """peft's default for a model type it lists; else the Linear / Conv1D layers of the attention blocks."""
    from transformers import AutoModelForCausalLM

    gpt2 = AutoModelForCausalLM.from_pretrained(models["gpt2"], local_files_only=True)
    llama = AutoModelForCausalLM.from_pretrained(models["llama"], local_files_only=True)
    assert lora_targets(gpt2)[0] == ["c_attn"] and lora_targets(llama)[0] == ["q_proj", "v_proj"]
    for model in (gpt2, llama):
        model.config.model_type = "not_in_peft"
    assert lora_targets(gpt2)[0] == ["attn.c_attn", "attn.c_proj"]
    assert lora_targets(llama)[0] == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    mlp = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="target_modules is not set"):
        lora_targets(mlp)
    with pytest.raises(ConfigError, match="leave policy.lora.target_modules unset"):
        LMPolicy(models["gpt2"], lora={"r": 2, "target_modules": ["q_proj"]})
