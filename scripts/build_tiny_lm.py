"""Build a tiny task model and its prompts file (no downloads): ``python scripts/build_tiny_lm.py [--task T]``.

``--task addition`` (the default; ``dppo.envs.tasks.addition``):
1. ``assets/lm/addition.jsonl.gz``: 512 public (held-out evaluation) + 16,384 private (RL users)
   zero-padded 3-digit addition prompts with their ``answer`` column (distinct problems, seed 0).
2. ``assets/lm/tiny-addition/``: a character tokenizer and a 2-layer Llama-style model (hidden 64,
   about 133k parameters) trained by supervised fine-tuning on *public* synthetic problems that are
   neither evaluation nor private prompts, stopped early once greedy exact match on the evaluation
   prompts reaches ``--target`` (default 0.45: a mediocre start that RL can improve).
``--task exact`` (``dppo.envs.tasks.exact``: unpadded 1-3 digit additions, the answer and nothing after it):
1. ``assets/lm/exact.jsonl.gz``: 512 public + 16,384 private prompts (distinct problems, seed 0).
2. ``assets/lm/tiny-exact/``: the same architecture, fine-tuned on public demonstrations that end after the
   answer in only a quarter of cases (``exact.STOP``; otherwise they go on with ``;`` and more solved
   problems), stopped once the greedy answer digits are right on ``--target`` (default 0.6) of the
   evaluation prompts: a model that computes but rarely stops, so the exact-answer reward starts low.
Both saved with ``save_pretrained``. Deterministic for a given ``--seed`` (one thread); shows a progress bar.
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
from dppo.envs.tasks import addition, exact  # noqa: E402
from dppo.policies.tiny_lm import char_tokenizer, tiny_llama  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# task -> (module, reward for the stopping rule, the metric it stops on, default target)
TASKS = {"addition": (addition, "dppo.envs.tasks.addition.digit_reward", "exact match", 0.45),
         "exact": (exact, "dppo.envs.tasks.exact.exact_reward", "answer digits right", 0.6)}
CONTEXT = 32


def batch_of(tokenizer, problems):
    """Prompt + answer + EOS, left-padded; loss only on the answer and EOS tokens (fixed-length answers)."""
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


def demo_batch(tokenizer, demos):
    """(prompt, target, ends) demonstrations of any length: prompt + target (+ EOS if it ends), left-padded;
    loss on the target (and EOS) tokens only."""
    seqs = []
    for prompt, target, ends in demos:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        t = tokenizer(target, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if ends else [])
        seqs.append((p + t, [-100] * len(p) + t))
    width = max(len(s) for s, _ in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(s)) + s for s, _ in seqs])
    labels = torch.tensor([[-100] * (width - len(lab)) + lab for _, lab in seqs])
    attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s, _ in seqs])
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    return ids, attn, pos, labels


@torch.no_grad()
def greedy_completions(model, tokenizer, rows, steps: int = 5, cut_at_eos: bool = True) -> list[str]:
    """Greedy completions of ``steps`` tokens, cut at EOS as the learners decode them (``cut_at_eos=False``:
    every generated character, the rule the shipped addition model was stopped by)."""
    prompts = [r["prompt"] for r in rows]
    enc = tokenizer(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    outs = []
    for _ in range(steps):
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        nxt = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -1].argmax(-1)
        ids, attn = torch.cat([ids, nxt[:, None]], 1), torch.cat([attn, torch.ones_like(nxt[:, None])], 1)
        outs.append(nxt)
    gen = torch.stack(outs, 1)
    if not cut_at_eos:
        return tokenizer.batch_decode(gen, skip_special_tokens=True)
    texts = []
    for row in gen.tolist():
        cut = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
        texts.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    return texts


def greedy_scores(task: str, model, tokenizer, rows) -> tuple[float, float]:
    """(task reward, stopping metric) of greedy completions on ``rows``."""
    prompts, answers = [r["prompt"] for r in rows], [r["answer"] for r in rows]
    comps = greedy_completions(model, tokenizer, rows, cut_at_eos=task != "addition")
    if task == "addition":
        return (float(np.mean(addition.digit_reward(prompts, comps, answers))),
                float(np.mean(addition.exact_match(prompts, comps, answers))))
    return (float(np.mean(exact.exact_reward(prompts, comps, answers))),
            float(np.mean(exact.answer_reward(prompts, comps, answers))))


def sft_batch(task: str, tokenizer, rng, excluded: set, size: int):
    module = TASKS[task][0]
    problems = [p for p in module.sample_problems(2 * size, rng) if p[0] not in excluded][:size]
    if task == "addition":
        return batch_of(tokenizer, problems)
    return demo_batch(tokenizer, [exact.demonstration(p, rng, CONTEXT - 8) for p in problems])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="addition")
    ap.add_argument("--out", default=os.path.join(ROOT, "assets", "lm"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=None, help="stop at this greedy score on the eval prompts "
                    "(addition: exact match, default 0.45; exact: answer digits right, default 0.6)")
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from tqdm.auto import tqdm

    module, reward, metric, default_target = TASKS[args.task]
    target_score = default_target if args.target is None else args.target
    os.makedirs(args.out, exist_ok=True)
    data = os.path.join(args.out, f"{args.task}.jsonl.gz")
    module.write_prompts(data, public=512, private=16384, seed=args.seed)
    env = PromptsEnv(data, reward, eval_size=512)
    excluded = {r["prompt"] for r in env.public} | {r["prompt"] for r in env.private}
    torch.manual_seed(args.seed)
    tokenizer = char_tokenizer(module.CHARS)
    model = tiny_llama(tokenizer, context=CONTEXT)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng([args.seed, 1])
    t0 = time.perf_counter()
    bar = tqdm(range(args.max_steps), desc=f"SFT tiny-{args.task}")
    for step in bar:
        ids, attn, pos, labels = sft_batch(args.task, tokenizer, rng, excluded, args.batch)
        model.train()
        loss = model(input_ids=ids, attention_mask=attn, position_ids=pos, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 9:
            model.eval()
            reward_, score = greedy_scores(args.task, model, tokenizer, env.eval_rows())
            bar.set_postfix(loss=f"{loss.item():.3f}", reward=f"{reward_:.3f}", score=f"{score:.3f}")
            if score >= target_score:
                break
    model.eval()
    reward_, score = greedy_scores(args.task, model, tokenizer, env.eval_rows())
    target = os.path.join(args.out, f"tiny-{args.task}")
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    n = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target))
    print(f"saved {target}: {n} parameters, {size / 1024:.0f} KiB, {step + 1} SFT steps in "
          f"{time.perf_counter() - t0:.1f} s; eval (greedy) reward {reward_:.3f}, {metric} {score:.3f}")


if __name__ == "__main__":
    main()
