"""One TRL ``GRPOTrainer`` run on a dppo LM experiment, scored by dppo's evaluator: the peer baseline.

    python scripts/trl_grpo.py --out runs/trl_s0 +experiment=lm_addition seed=0 --lr 1e-3 ++policy.freeze=[]

The overrides compose the same config a dppo run would use (``+experiment=lm_<task>``, ``seed``,
``policy.lora``, ``users_per_round``, ``rounds``, ``group_size``, ``policy.max_new_tokens``); from it TRL gets:
- the same private prompts, each used once and in the order a dppo run with this seed takes them
  (``rounds x users_per_round`` rows, ``shuffle_dataset=False``), every column passed to the reward;
- the same reward callable(s) with their weights (TRL's ``reward_weights``), clipped to ``reward_bound``;
- G = ``num_generations`` completions per prompt, one optimizer step per round (``generation_batch_size =
  users_per_round x G``, one accumulation step), ``max_steps = rounds``, temperature and completion cap as
  the policy's, the same LoRA adapter (``peft_config``) or every parameter (``policy.lora=null``; those named
  by ``policy.freeze`` stay frozen).
Everything else is TRL's own recommended GRPO setting unless a flag changes it: the DAPO loss (token-level
sum divided by the batch's token count), rewards scaled by the group's std (``scale_rewards="group"``),
``beta = 0`` (no reference model), AdamW with TRL's global gradient-norm clip ``max_grad_norm = 1.0`` and a
linear learning-rate decay (``--scheduler constant`` keeps it fixed). ``bf16`` and gradient checkpointing are
off (CPU; they change speed and memory, not the method). Non-private: TRL has no per-user clipping or noise.

The trained model (LoRA merged into the weights) is saved under ``--out/model`` and evaluated by the very
evaluator of dppo's learners (``Learner.evaluate`` -> ``PromptCollector.evaluate``: the same public prompts
and the same public sampling stream), written to ``--out/summary.json`` (``final_return``, ``final_greedy_return``, ``wall_time_s``).
TRL is imported only here (``pip install trl``, the ``bench`` extra).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def private_dataset(env, n: int):
    """The first ``n`` private rows in the order a dppo run takes its users (user id u -> row ``order[u]``)."""
    from datasets import Dataset

    rows = env.user_rows(range(n))
    return Dataset.from_list([{**r, "prompt": r[env.prompt_key]} for r in rows])


def clipped(fn, bound):
    """The env's combined reward with TRL's call signature, clipped to ``bound`` as dppo clips it."""
    import numpy as np

    def reward(prompts, completions, **columns):
        extra = {k: v for k, v in columns.items() if k not in ("completion_ids", "trainer_state", "log_extra",
                                                                "log_metric", "environments")}
        values = np.asarray(fn(prompts=prompts, completions=completions, **extra), dtype=np.float64)
        return (np.clip(values, -bound, bound) if bound is not None else values).tolist()

    reward.__name__ = "reward"
    return reward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (model/, summary.json)")
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--scheduler", default="linear", help="TRL's lr_scheduler_type (TRL default: linear)")
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="TRL's global gradient clip (default 1.0)")
    ap.add_argument("--loss-type", default="dapo", help="TRL's loss_type (default dapo)")
    ap.add_argument("--scale-rewards", default="group", help="TRL's scale_rewards (default group)")
    ap.add_argument("overrides", nargs="*", help="dppo config overrides (+experiment=..., seed=..., policy.lora=...)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from dppo.api import make_config
    from dppo.build import build_env
    from dppo.policies.lm import LMPolicy, lora_targets, resolve_path

    cfg = make_config(list(args.overrides) + ["eps=null"])
    env = build_env(cfg)
    defaults = inspect.signature(LMPolicy).parameters   # the yaml holds only what differs from LMPolicy's defaults
    temperature = float(OmegaConf.select(cfg, "policy.temperature", default=defaults["temperature"].default))
    max_new_tokens = int(OmegaConf.select(cfg, "policy.max_new_tokens", default=defaults["max_new_tokens"].default))
    G = int(cfg.group_size or 8)
    m, rounds = int(cfg.users_per_round), int(cfg.rounds)
    env.check_capacity(rounds, m)
    path = resolve_path(cfg.policy.path)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    lora = OmegaConf.select(cfg, "policy.lora", default=None)
    lora = OmegaConf.to_container(lora) if lora else None
    frozen = list(OmegaConf.select(cfg, "policy.freeze", default=None) or [])
    if frozen and not lora:  # policy.freeze names LMPolicy's parameters: "model." + the Hugging Face name
        names = [n.removeprefix("model.") for n in frozen]
        for n, p in model.named_parameters():
            if any(n == f or n.startswith(f + ".") for f in names):
                p.requires_grad_(False)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", r=lora["r"], lora_alpha=lora.get("alpha", 2 * lora["r"]),
                                 lora_dropout=lora.get("dropout", 0.0),
                                 target_modules=lora.get("target_modules") or lora_targets(model)[0],  # as dppo's
                                 bias="none")
    os.makedirs(args.out, exist_ok=True)
    config = GRPOConfig(
        output_dir=os.path.join(args.out, "trl"), learning_rate=args.lr, lr_scheduler_type=args.scheduler,
        max_grad_norm=args.max_grad_norm, loss_type=args.loss_type, scale_rewards=args.scale_rewards, beta=0.0,
        num_generations=G, per_device_train_batch_size=m * G, gradient_accumulation_steps=1, max_steps=rounds,
        max_completion_length=max_new_tokens, temperature=temperature,
        shuffle_dataset=False, seed=int(cfg.seed), data_seed=int(cfg.seed), bf16=False, fp16=False,
        gradient_checkpointing=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[clipped(env.combined_reward, cfg.reward_bound)], args=config,
                          train_dataset=private_dataset(env, m * rounds), processing_class=tok,
                          peft_config=peft_config)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    trained = trainer.model
    trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)   # before merging the adapter
    if peft_config is not None:
        trained = trained.merge_and_unload()
    model_dir = os.path.join(args.out, "model")
    trained.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    sample, greedy = evaluate(list(args.overrides), model_dir)
    log = [{k: v for k, v in e.items() if isinstance(v, (int, float))} for e in trainer.state.log_history]
    summary = {"final_return": sample, "final_greedy_return": greedy, "wall_time_s": round(wall, 3),
               "complete": True, "lr": args.lr, "scheduler": args.scheduler, "max_grad_norm": args.max_grad_norm,
               "loss_type": args.loss_type, "scale_rewards": args.scale_rewards, "group_size": G,
               "users_per_round": m, "rounds": rounds, "lora": lora, "seed": int(cfg.seed),
               "trainable_parameters": trainable,
               "trl_log": log}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"TRL GRPO lr={args.lr} {args.scheduler}: eval reward {sample:.4f} (greedy {greedy:.4f}) in {wall:.0f} s")


def evaluate(overrides: list[str], model_dir: str) -> tuple[float, float]:
    """dppo's evaluator on a trained model directory: (sampled, greedy) mean reward on the public prompts."""
    from dppo.api import make_config
    from dppo.build import build

    cfg = make_config(overrides + ["eps=null", f"policy.path={model_dir}", "policy.lora=null", "progress=false"])
    learner = build(cfg).learner
    return learner.evaluate(cfg.eval_episodes, greedy=False), learner.evaluate(cfg.eval_episodes, greedy=True)


if __name__ == "__main__":
    main()
