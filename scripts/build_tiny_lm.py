"""Build the tiny addition model and its prompts file (no downloads): ``python scripts/build_tiny_lm.py``.

1. ``assets/lm/addition.jsonl.gz``: 512 public (held-out evaluation) + 16,384 private (RL users)
   zero-padded 3-digit addition prompts with their ``answer`` column (distinct problems, seed 0).
2. ``assets/lm/tiny-addition/``: a character tokenizer and a 2-layer Llama-style model (hidden 64,
   about 133k parameters) trained by supervised fine-tuning on *public* synthetic problems that are
   neither evaluation nor private prompts, stopped early once greedy exact match on the evaluation
   prompts reaches ``--target`` (a mediocre start that RL can improve), saved with ``save_pretrained``.
Deterministic for a given ``--seed``; shows a progress bar.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dppo.envs.prompts import PromptsEnv  # noqa: E402
from dppo.envs.tasks.addition import CHARS, digit_reward, exact_match, sample_problems, write_prompts  # noqa: E402
from dppo.policies.tiny_lm import char_tokenizer, tiny_llama  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def batch_of(tokenizer, problems):
    """Prompt + answer + EOS, left-padded; loss only on the answer and EOS tokens."""
    texts = [p + a for p, a in problems]
    enc = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    eos = torch.full((ids.shape[0], 1), tokenizer.eos_token_id)
    ids, attn = torch.cat([ids, eos], 1), torch.cat([attn, torch.ones_like(eos)], 1)
    labels = torch.full_like(ids, -100)
    n_ans = len(problems[0][1]) + 1
    labels[:, -n_ans:] = ids[:, -n_ans:]
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    return ids, attn, pos, labels


@torch.no_grad()
def greedy_scores(model, tokenizer, rows):
    from dppo.policies.lm import LMPolicy  # noqa: F401 - same decoding as the learners'

    prompts = [r["prompt"] for r in rows]
    enc = tokenizer(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    outs = []
    for _ in range(5):
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        nxt = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -1].argmax(-1)
        ids, attn = torch.cat([ids, nxt[:, None]], 1), torch.cat([attn, torch.ones_like(nxt[:, None])], 1)
        outs.append(nxt)
    comps = tokenizer.batch_decode(torch.stack(outs, 1), skip_special_tokens=True)
    answers = [r["answer"] for r in rows]
    return float(np.mean(digit_reward(prompts, comps, answers))), float(np.mean(exact_match(prompts, comps, answers)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "assets", "lm"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.45, help="stop at this greedy exact match on eval prompts")
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from tqdm.auto import tqdm

    os.makedirs(args.out, exist_ok=True)
    data = os.path.join(args.out, "addition.jsonl.gz")
    write_prompts(data, public=512, private=16384, seed=args.seed)
    env = PromptsEnv(data, "dppo.envs.tasks.addition.digit_reward", eval_size=512)
    excluded = {r["prompt"] for r in env.public} | {r["prompt"] for r in env.private}
    torch.manual_seed(args.seed)
    tokenizer = char_tokenizer(CHARS)
    model = tiny_llama(tokenizer)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng([args.seed, 1])
    t0 = time.perf_counter()
    bar = tqdm(range(args.max_steps), desc="SFT tiny-addition")
    for step in bar:
        problems = [p for p in sample_problems(2 * args.batch, rng) if p[0] not in excluded][: args.batch]
        ids, attn, pos, labels = batch_of(tokenizer, problems)
        model.train()
        loss = model(input_ids=ids, attention_mask=attn, position_ids=pos, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 9:
            model.eval()
            reward, exact = greedy_scores(model, tokenizer, env.eval_rows())
            bar.set_postfix(loss=f"{loss.item():.3f}", reward=f"{reward:.3f}", exact=f"{exact:.3f}")
            if exact >= args.target:
                break
    model.eval()
    reward, exact = greedy_scores(model, tokenizer, env.eval_rows())
    target = os.path.join(args.out, "tiny-addition")
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    n = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target))
    print(f"saved {target}: {n} parameters, {size / 1024:.0f} KiB, {step + 1} SFT steps in "
          f"{time.perf_counter() - t0:.1f} s; eval (greedy) reward {reward:.3f}, exact match {exact:.3f}")


if __name__ == "__main__":
    main()
