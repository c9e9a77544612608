"""Private vs non-private update cost of the LM learners, side by side in one run: ``python scripts/bench_lm.py``.

For one round's data (m prompts x G sampled completions of a task's prompts; the m and G of its experiment)
and each policy config - by default the private config of every task in ``scripts/reproduce_lm.py``
(``TASKS[task]["private"]``: what the reference's private rows run), then LoRA r = 2 on q, v, LoRA r = 8 on all
seven projections and full fine-tuning of the linear layers on the addition model beside them, those not
benched already (``--adapters`` picks others from ``common.ADAPTERS``) - it times, after a warm-up and as the median of ``--repeats``, interleaved:
  non-private: one backward pass of the summed GRPO objective (a plain PG step's cost);
  private:     DP-PG's update as the learner makes it: the users' norms and the clipped sum without the
               (m, d) per-user gradients (``AdapterSpace.clipped_user_sum``, ``dppo.policies.per_user_grads``:
               one forward/backward to the layers' outputs, per layer per-user blocks or Gram matrices,
               whichever is cheaper), then the noise (``release_clipped_sum`` of the release every learner
               uses, ``dppo.privacy.composed``, in DP-PG's k = 1 case: the round opened, one sum);
  materialised: the same release from the (m, d) per-user gradients (``user_gradients``, the engine
               ``dppo.policies.per_user_grads``), clipped and summed by ``release_sum`` (the path before),
and the peak memory of each call above its start (CPU: the peak of the running sum of the tensor
allocations ``torch.profiler`` records; CUDA: ``torch.cuda.max_memory_allocated``).
With ``--device cuda`` (or ``auto`` on a GPU machine) it also benchmarks ``--large`` config (a wider
Llama built in code, random weights: cost only).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dppo.algos.core import group_advantages  # noqa: E402
from dppo.policies.lm import pick_device  # noqa: E402
from dppo.policies.spaces import make_space  # noqa: E402
from dppo.privacy import NoiseSource, PrivacyContext  # noqa: E402
from dppo.privacy.accountants import make_accountant  # noqa: E402
from dppo.privacy.composed import composed_sums  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ADAPTERS, ROOT, TASKS  # noqa: E402


def setup(task: str, adapter: str, device: str, extra: tuple = ()):
    """(policy, env, m, G) of a task's experiment with an adapter of ``common.ADAPTERS`` (as a run builds them)."""
    from dppo.api import make_config
    from dppo.build import build_env, build_policy

    cfg = make_config([f"+experiment={TASKS[task]['experiment']}", *ADAPTERS[adapter][0], f"device={device}",
                       "eps=null", *extra])
    env = build_env(cfg)
    return build_policy(cfg, env), env, int(cfg.users_per_round), int(cfg.group_size)


def large_model_dir(device) -> str:
    """A wider Llama (hidden 512, 4 layers, 8 heads) with the tiny model's tokenizer, random weights."""
    from transformers import AutoTokenizer

    from dppo.policies.tiny_lm import tiny_llama

    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "assets", "lm", "tiny-addition"))
    torch.manual_seed(0)
    model = tiny_llama(tok, hidden=512, layers=4, heads=8, intermediate=2048)
    path = tempfile.mkdtemp(prefix="dppo_bench_lm_")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def peak_memory(fn, device) -> tuple[float, float]:
    """(seconds, peak MiB above the start) of one call."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t, (torch.cuda.max_memory_allocated() - base) / 2**20
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(((e.time_range.start, e.cpu_memory_usage) for e in prof.events() if e.cpu_memory_usage),
                    key=lambda x: x[0])
    cur = peak = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    return float("nan"), peak / 2**20


def bench(policy, env, users: int, group: int, repeats: int, label: str) -> dict:
    batch = env.collector(0).users(policy, list(range(users)), 0, group, 1.0)[0]  # a round's data (user streams)
    A = group_advantages(batch.grouped(batch.returns))[0].reshape(-1, 1)
    space = make_space(policy, dim=None)   # what the learner moves: AdapterSpace (LoRA) or FullSpace
    coef = (A.reshape(-1) / group).float()
    per_pass = max(1, policy.micro_batch // group)

    privacy = PrivacyContext(8.0, 1e-5, accountant=make_accountant("parallel"), noise=NoiseSource(0, secure=False))
    release, clip, ids = composed_sums(privacy, parts={"actor": (1, 1.0)}), 1.0, list(range(users))
    dev = policy.device_

    def non_private():  # one backward of the summed objective (micro-batches of users)
        total = [torch.zeros_like(p, dtype=torch.float64) for p in space.params]
        for lo in range(0, users, per_pass):
            us, sl = slice(lo, lo + per_pass), slice(lo * group, (lo + per_pass) * group)
            lp = policy.token_log_probs(batch.prompt_ids[us], batch.prompt_mask[us], batch.ids[sl],
                                        batch.token_mask[sl], group=group)
            for t_, g_ in zip(total, torch.autograd.grad((coef[sl].to(lp.device) * lp.sum(1)).sum(), space.params)):
                t_ += g_.double()
        return torch.cat([t_.reshape(-1).cpu() for t_ in total]) / users

    def private():  # the learner's path: norms and the clipped sum (dppo.policies.per_user_grads), the noise
        total, norms = space.clipped_user_sum(batch, A, lambda n: release.clip_scale(n, clip))
        release.open_round(0, ids, (clip,))
        return release.release_clipped_sum(total, norms, ids, clip, part="actor")[0] / users

    def materialised():  # per-user gradients (dppo.policies.per_user_grads), clipping, the noisy sum
        release.open_round(0, ids, (clip,))
        return release.release_sum(space.user_gradients(batch, A), ids, clip, part="actor")[0] / users

    def grads_only():
        return space.user_gradients(batch, A)

    times = {"non-private": [], "private": [], "materialised": [], "per-user grads": []}
    fns = {"non-private": non_private, "private": private, "materialised": materialised, "per-user grads": grads_only}
    for name in fns:  # warm-up
        fns[name]()
    for _ in range(repeats):
        for name, fn in fns.items():  # interleaved, so load changes hit both alike
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t)
    mem = {name: peak_memory(fn, dev)[1] for name, fn in fns.items() if name != "per-user grads"}
    med = {name: statistics.median(v) for name, v in times.items()}
    tp, tn, tm = med["private"], med["non-private"], med["materialised"]
    print(f"\n[{label}] {sum(p.numel() for p in policy.model.parameters())} "
          f"parameters, {policy.num_trainable()} trainable; m={users} prompts x G={group}; device {dev}; "
          f"generation {batch.tokens / max(batch.seconds, 1e-9):,.0f} tokens/s (KV cache)")
    print(f"{'update':<34}{'time (s)':>10}{'peak MiB':>10}")
    print(f"{'non-private (one backward)':<34}{tn:>10.3f}{mem['non-private']:>10.1f}")
    print(f"{'private (norms, clipped sum, noise)':<34}{tp:>10.3f}{mem['private']:>10.1f}")
    print(f"{'private, materialised (m, d) rows':<34}{tm:>10.3f}{mem['materialised']:>10.1f}")
    print(f"{'  of which per-user gradients':<34}{med['per-user grads']:>10.3f}{'':>10}")
    ratio = {"time": tp / tn, "memory": mem["private"] / max(mem["non-private"], 1e-9),
             "time_rows": tm / tn, "memory_rows": mem["materialised"] / max(mem["non-private"], 1e-9)}
    print(f"ratio private / non-private: time {ratio['time']:.2f}x, peak memory {ratio['memory']:.2f}x; "
          f"materialised rows {ratio['time_rows']:.2f}x, {ratio['memory_rows']:.2f}x "
          f"(median of {repeats}, interleaved)")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--users", type=int, default=None, help="prompts per round (default: the experiment's)")
    ap.add_argument("--group", type=int, default=None, help="G (default: the experiment's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--adapters", nargs="*", default=None, choices=sorted(ADAPTERS),
                    help="configs on the addition model beside the tasks' private configs "
                         "(default: lora_r2_qv lora_r8_all full_linear, those not already benched)")
    ap.add_argument("--large", action="store_true", help="also the larger config (default on a GPU)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows = [(task, TASKS[task]["private"][0], "private config of the reference") for task in TASKS]
    for adapter in (["lora_r2_qv", "lora_r8_all", "full_linear"] if args.adapters is None else args.adapters):
        if ("addition", adapter) not in [(t, a) for t, a, _ in rows]:
            rows.append(("addition", adapter, "other config"))
    if args.large or pick_device(args.device).type == "cuda":
        rows.append(("addition", TASKS["addition"]["private"][0], "large (hidden 512)"))
    ratios = []
    for task, adapter, why in rows:
        extra = (f"policy.path={large_model_dir(args.device)}",) if why.startswith("large") else ()
        policy, env, users, group = setup(task, adapter, args.device, extra)
        label = f"{task}, {ADAPTERS[adapter][1]} ({why})"
        r = bench(policy, env, args.users or users, args.group or group, args.repeats, label)
        ratios.append((label, policy.num_trainable(), r))
        del policy
    print("\nsummary (private / non-private update, side by side in this run):")
    for label, d, r in ratios:
        print(f"  {label:<75} {d:>8,} trainable: time {r['time']:.2f}x, peak memory {r['memory']:.2f}x "
              f"(materialised rows: {r['time_rows']:.2f}x, {r['memory_rows']:.2f}x)")


if __name__ == "__main__":
    main()
