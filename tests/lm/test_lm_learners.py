"""The learners on env=prompts (the same PG / NPG / REBEL classes as on gym envs): 2-round smoke runs of each
algorithm, only adapter weights change, the adapter loads with peft, every algo key reaches the update, group
advantages use only the user's own group, the seed matters."""
from __future__ import annotations

import json
import os

import pytest
import torch

from dppo.algos.core import group_advantages
from dppo.algos.npg import NaturalPolicyGradient
from dppo.algos.pg import PolicyGradient
from dppo.algos.rebel import REBEL
from dppo.api import make_config, train
from dppo.build import build
from tests.lm.conftest import MODEL, lm_overrides

ALGOS = [("dp_pg", "eps=8", PolicyGradient), ("dp_npg", "eps=8", NaturalPolicyGradient),
         ("dp_rebel", "eps=8", REBEL), ("dp_pg", "eps=null", PolicyGradient),
         ("dp_npg", "eps=null", NaturalPolicyGradient), ("pg", "eps=null", PolicyGradient),
         ("rebel", "eps=null", REBEL)]  # eps=null: the non-private twins


def base_weights(policy) -> dict:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n}


@pytest.mark.parametrize("algo,eps,cls", ALGOS, ids=[f"{a[0]}-{a[1]}" for a in ALGOS])
def test_two_round_smoke_run_changes_only_the_adapter(small_prompts, tmp_path, algo, eps, cls):
    extra = ["algo.step=norm", "algo.lr=0.05", "oracle=dp_gd"] if "npg" in algo else []
    extra += ["group_size=2"] if "rebel" in algo else []
    cfg = make_config(lm_overrides(small_prompts, f"algo={algo}", eps, *extra))
    trainer = build(cfg, str(tmp_path / "run"))
    assert type(trainer.learner) is cls
    policy = trainer.learner.policy
    before_base, before_adapter = base_weights(policy), policy.adapter_state()
    summary = trainer.fit()
    assert summary["rounds_done"] == 2 and summary["complete"]
    assert len(summary["ledger"]) == (2 if eps == "eps=8" else 0)
    for n, w in base_weights(policy).items():
        assert torch.equal(w, before_base[n]), n
    after = policy.adapter_state()
    assert any(not torch.equal(after[n], before_adapter[n]) for n in after)
    header = open(tmp_path / "run" / "progress.csv").readline().strip().split(",")
    for key in ("diag/return", "eval/return", "rollout/users", "rollout/episodes", "perf/tokens_per_s"):
        assert key in header
    assert os.path.isfile(tmp_path / "run" / "model" / "adapter_config.json")
    assert os.path.isdir(tmp_path / "run" / "checkpoints" / "adapter_2")


def test_saved_adapter_loads_with_peft_and_reproduces_the_policy(small_prompts, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8"))
    trainer = build(cfg, str(tmp_path / "run"))
    trainer.fit()
    policy = trainer.learner.policy
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(MODEL), str(tmp_path / "run" / "model"))
    ids, mask = policy.encode(["123+456=", "001+002="])
    with torch.no_grad():
        a = policy.model(input_ids=ids, attention_mask=mask).logits
        b = loaded(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(a, b)


def test_completions_text_is_logged_for_public_prompts_only(small_prompts, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "env.show_completions=3"))
    trainer = build(cfg, str(tmp_path / "run"))
    trainer.fit()
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("eval/completions/text_summary")]
    env = trainer.learner.env
    assert texts and all(p in texts[0] for p in env.prompts(env.eval_rows(3)))
    assert not any(r["prompt"] in "".join(texts) for r in env.private)


def test_group_advantage_of_a_user_depends_on_its_own_group_only():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(5, 4, generator=g, dtype=torch.float64)
    changed = rewards.clone()
    changed[2] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    for opts in ({}, {"std": False}, {"leave_one_out": True}):  # GRPO, Dr. GRPO, RLOO
        a, b = group_advantages(rewards, **opts)[0], group_advantages(changed, **opts)[0]
        keep = [0, 1, 3, 4]
        torch.testing.assert_close(a[keep], b[keep])
        single = torch.stack([group_advantages(rewards[i:i + 1], **opts)[0][0] for i in range(5)])
        torch.testing.assert_close(a, single)  # computed alone, each user's advantages are the same
    loo = group_advantages(rewards, std=False, leave_one_out=True)[0]
    torch.testing.assert_close(loo[:, 0], rewards[:, 0] - rewards[:, 1:].mean(1))


@pytest.mark.parametrize("algo,key,values", [("dp_pg", "algo.lr", ("0.01", "0.03")),
                                             pytest.param("dp_npg", "algo.lr", ("0.05", "0.1"), marks=pytest.mark.slow)])
def test_an_lm_runs_algo_keys_reach_the_update(small_prompts, tmp_path, algo, key, values):
    """Every key the user sets reaches the code that runs: a different ``algo.lr`` on a language-model run gives
    a different policy (``policy_sha256``), the same one the same policy."""
    sha = [train(lm_overrides(small_prompts, f"algo={algo}", "eps=8", "algo.optimizer=adam" if algo == "dp_pg" else
                              "algo.step=norm", f"{key}={v}"), str(tmp_path / f"r{i}"))["policy_sha256"]
           for i, v in enumerate(values + values[:1])]
    assert sha[0] != sha[1] and sha[0] == sha[2]


def test_npg_step_kl_uses_public_prompts(small_prompts, tmp_path):
    summary = train(make_config(lm_overrides(small_prompts, "algo=dp_npg", "eps=8", "oracle=dp_gd", "algo.step=kl",
                                             "algo.max_kl=0.01")), str(tmp_path / "run"))
    assert summary["rounds_done"] == 2 and len(summary["ledger"]) == 2


def test_dense_oracles_are_refused_for_adapter_dimensions(small_prompts):
    from dppo.errors import ConfigError

    all7 = "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"   # d = 11,776
    with pytest.raises(ConfigError, match="oracle=dp_gd"):
        build(make_config(lm_overrides(small_prompts, "algo=dp_npg", "eps=8", "oracle=ssp", all7)))


def test_an_unknown_advantage_is_refused(small_prompts):
    from dppo.errors import ConfigError

    with pytest.raises(ConfigError, match="advantage"):
        build(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=null", "algo.advantage=batch")))


def test_the_seed_matters_and_a_seed_reproduces(small_prompts, tmp_path):
    def adapter(seed, name):
        cfg = make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", f"seed={seed}"))
        trainer = build(cfg, str(tmp_path / name))
        trainer.fit()
        return trainer.learner.policy.adapter_state()

    a, b, c = adapter(0, "a"), adapter(0, "b"), adapter(1, "c")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert all(not torch.equal(a[n], c[n]) for n in a if "lora_A" in n)  # LoRA init follows the seed too


def test_kl_penalty_to_the_initial_policy_runs(small_prompts, tmp_path):
    summary = train(make_config(lm_overrides(small_prompts, "algo=dp_pg", "eps=8", "+algo.kl_coef=0.1")),
                    str(tmp_path / "run"))
    assert summary["rounds_done"] == 2 and len(summary["ledger"]) == 2
