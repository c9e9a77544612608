"""Cost of one DP-PG update relative to one non-private PG update, measured side by side in one process.

Policies:
  cartpole  the CartPole 2x64 MLP, 1024 steps from 10 users
  lm        a tiny Llama (transformers; 2 layers, hidden 64) scoring 16-token completions of 16-token
            prompts, 10 users x 8 completions; with peft also its LoRA (r=4) adapters alone. Without
            transformers, a toy Embedding/LayerNorm/Linear model stands in (the output says so).
Rows (each timed as a whole update: per-user gradients, clip, sum, Gaussian noise, mean):
  pg (non-private)   one plain backward of the summed loss
  dp-pg, hooks       per-user gradients from one backward (dppo.policies.per_user_grads, per-layer rules)
                     ("of which per-user grads": the same without the clip/noise/ledger release;
                     "of which the release": that release alone, clip + float64 noise + ledger, on fixed rows)
  pg, non-private twin  what algo=pg computes on this path: the same per-user gradients, clipped, averaged
                     (the twins differ by the noise only); the DP-PG / twin ratio is printed below the rows
  dp-pg, hooks, flat rows  the same from unpadded rows with a user index (how group rollouts arrive)
  dp-pg, torch.func  the vmap over users of the whole objective
  dp-pg, opacus      Opacus GradSampleModule per-step gradients, summed by user (CartPole only)
The rows are timed round-robin (one call of each in turn, ``--repeats`` times) and the medians are
reported, so that load from other processes on a shared machine hits every row alike; each repeat
takes the rows in a new (seeded) random order, because a call's time depends on what ran just before
it (caches: in a fixed order the row after the slowest one gains or loses up to ~0.3x). The ratio is
of CPU time (``time.thread_time``), wall time is printed next to it. CartPole is also timed at 8192 steps
(10 users x 8 rollouts of ~100 steps: group rollouts), where fixed per-call costs weigh less.
Usage: python scripts/bench_clipping.py [--repeats 30] [--policy cartpole|lm|all]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from torch import nn

from dppo.policies.per_user_grads import per_user_gradients
from dppo.envs.gym_env import GymEnvFactory
from dppo.policies.mlp import MLPPolicy
from dppo.privacy import PrivacyContext
from dppo.privacy.composed import composed_sums
from dppo.privacy.noise import NoiseSource


def cartpole_batch(m=10, total=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((m,), total // m)
    lengths[: total - int(lengths.sum())] += 1
    T = int(lengths.max())
    obs = torch.randn(m, T, 4, generator=g)
    actions = torch.randint(0, 2, (m, T), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(m, T, generator=g) * mask
    return obs, actions, adv, mask


class CompletionPolicy(nn.Module):
    """log pi(completion | prompt) = sum of the completion tokens' log-probabilities under a causal LM."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, prompts, completions):
        ids = torch.cat([prompts, completions], dim=1)
        logits = self.lm(ids)
        logits = logits.logits if hasattr(logits, "logits") else logits
        logp = torch.log_softmax(logits[:, prompts.shape[1] - 1:-1], dim=-1)
        return logp.gather(-1, completions[..., None]).squeeze(-1).sum(-1)


class ToyLM(nn.Module):
    """Embedding -> (LayerNorm -> Linear -> tanh, residual) x 2 -> LayerNorm -> Linear, position-wise."""

    def __init__(self, vocab=32, dim=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Tanh()) for _ in range(2)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(self.norm(h))


def make_lm(lora: bool):
    """A tiny Llama (if transformers is installed) wrapped as a completion policy; returns (policy, label)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return CompletionPolicy(ToyLM()), "toy Embedding/LayerNorm/Linear LM (transformers not installed)"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      attn_implementation="eager")
    lm = LlamaForCausalLM(cfg)
    label = "tiny Llama (transformers), all parameters"
    if lora:
        try:
            import peft
        except ImportError:
            return None, "LoRA: peft not installed"
        lm = peft.get_peft_model(lm, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        label = "tiny Llama + LoRA r=4 on q,v (peft), adapters only"
    return CompletionPolicy(lm), label


def lm_batch(m=10, group=8, prompt=16, completion=16, vocab=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = m * group
    prompts = torch.randint(0, vocab, (n, prompt), generator=g)
    completions = torch.randint(0, vocab, (n, completion), generator=g)
    adv = torch.randn(n, generator=g)
    users = torch.arange(m).repeat_interleave(group)
    return prompts, completions, adv, users


def trainable(policy):
    return [p for p in policy.parameters() if p.requires_grad]


def race(fns: dict, repeats: int) -> dict:
    """Median CPU seconds (and wall seconds) of each function, timed round-robin in a new random order
    each repeat (a row's time depends on what ran just before it: caches; a fixed order biases rows)."""
    for fn in fns.values():
        fn()  # warm-up
    cpu, wall = {k: [] for k in fns}, {k: [] for k in fns}
    order = random.Random(0)
    keys = list(fns)
    for _ in range(repeats):
        order.shuffle(keys)
        for k in keys:
            fn = fns[k]
            t0, w0 = time.thread_time(), time.perf_counter()
            fn()
            cpu[k].append(time.thread_time() - t0)
            wall[k].append(time.perf_counter() - w0)
    return {k: (statistics.median(cpu[k]), statistics.median(wall[k])) for k in fns}


TWIN = "pg, non-private twin"  # what algo=pg runs on the same path: per-user gradients + clip + mean


class RoundMean:
    """One DP-PG round of the release every learner uses (``composed_sums``' k = 1 case): opened for the rows'
    users (its ledger entry), their sum clipped to C plus the noise, over m; with eps null the twin's plain mean."""

    def __init__(self, privacy, clip: float = 1.0):
        self.release, self.clip = composed_sums(privacy, parts={"actor": (1, 1.0)}), clip

    def __call__(self, rows, round_idx: int):
        users = list(range(rows.shape[0]))
        self.release.open_round(round_idx, users, (self.clip,))
        total, _ = self.release.release_sum(rows, users, self.clip, part="actor")
        return total / len(users)


def report(title, results: dict, base: str):
    print(title)
    b_cpu, b_wall = results[base]
    for k, (c, w) in results.items():
        print(f"  {k:<26} {c * 1e3:9.2f} ms cpu  {c / b_cpu:5.2f}x   | wall {w * 1e3:8.2f} ms  {w / b_wall:5.2f}x")
    if TWIN in results:
        print(f"  dp-pg, hooks / {TWIN}: {results['dp-pg, hooks'][0] / results[TWIN][0]:.2f}x cpu")


def bench_cartpole(repeats, private, total=1024, opacus=True):
    env = GymEnvFactory("CartPole-v1")
    policy = MLPPolicy(env.observation_space, env.action_space)
    obs, actions, adv, mask = cartpole_batch(total=total)
    flat_obs, flat_act, flat_adv = obs[mask], actions[mask], adv[mask]
    user_of_step = torch.arange(obs.shape[0])[:, None].expand_as(mask)[mask]
    m = obs.shape[0]
    rows = per_user_gradients(policy, (obs, actions), adv)  # fixed input of the release-only row
    twin = RoundMean(PrivacyContext(None))

    def pg_update():
        policy.zero_grad()
        (-(policy.log_prob(flat_obs, flat_act) * flat_adv).sum() / m).backward()

    fns = {"pg (non-private)": pg_update,
           "dp-pg, hooks": lambda: private(per_user_gradients(policy, (obs, actions), adv), 0),
           "  of which per-user grads": lambda: per_user_gradients(policy, (obs, actions), adv),
           "  of which the release": lambda: private(rows, 0),
           TWIN: lambda: twin(per_user_gradients(policy, (obs, actions), adv), 0),
           "dp-pg, hooks, flat rows": lambda: private(
               per_user_gradients(policy, (flat_obs, flat_act), flat_adv, user_of_step, num_users=m), 0),
           "dp-pg, torch.func": lambda: private(
               per_user_gradients(policy, (obs, actions), adv, method="func"), 0)}
    try:
        if not opacus:
            raise ImportError
        from opacus import GradSampleModule

        gsm = GradSampleModule(MLPPolicy(env.observation_space, env.action_space))

        def opacus_update():
            gsm.zero_grad()
            (-(gsm(flat_obs, flat_act) * flat_adv).sum()).backward()
            per_step = torch.cat([p.grad_sample.reshape(len(flat_obs), -1) for p in gsm.parameters()], dim=1)
            per_user = torch.zeros(m, per_step.shape[1]).index_add_(0, user_of_step, per_step)
            private(per_user, 0)

        fns["dp-pg, opacus hooks"] = opacus_update
    except ImportError:
        if opacus:
            print("(opacus not installed: no opacus row)")
    res = race(fns, repeats)
    report(f"cartpole MLP: steps={len(flat_obs)} users={m} params={sum(p.numel() for p in policy.parameters())} "
           f"repeats={repeats}", res, "pg (non-private)")


def bench_lm(repeats, private, lora: bool):
    policy, label = make_lm(lora)
    if policy is None:
        print(f"lm: {label}; skipped")
        return
    prompts, completions, adv, users = lm_batch()
    m = int(users.max()) + 1
    params = trainable(policy)

    def pg_update():
        policy.zero_grad()
        (-(policy(prompts, completions) * adv).sum() / m).backward()

    rows = per_user_gradients(policy, (prompts, completions), adv, users, num_users=m)
    twin = RoundMean(PrivacyContext(None))
    fns = {"pg (non-private)": pg_update,
           "dp-pg, hooks": lambda: private(
               per_user_gradients(policy, (prompts, completions), adv, users, num_users=m), 0),
           "  of which per-user grads": lambda: per_user_gradients(policy, (prompts, completions), adv, users,
                                                                 num_users=m),
           "  of which the release": lambda: private(rows, 0),
           TWIN: lambda: twin(per_user_gradients(policy, (prompts, completions), adv, users, num_users=m), 0)}

    def func_update():
        private(per_user_gradients(policy, (prompts, completions), adv, users, num_users=m, method="func"), 0)

    try:
        func_update()
        fns["dp-pg, torch.func"] = func_update
    except Exception as err:  # noqa: BLE001 - a model torch.func cannot vmap is reported, not fatal
        print(f"  (torch.func path unavailable for this model: {type(err).__name__}: {str(err)[:100]})")
    res = race(fns, repeats)
    report(f"lm: {label}; sequences={len(prompts)} (users={m} x 8) tokens/seq=32 trainable params="
           f"{sum(p.numel() for p in params)} repeats={repeats}", res, "pg (non-private)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--policy", choices=["cartpole", "lm", "all"], default="all")
    args = ap.parse_args()
    torch.set_num_threads(1)
    private = RoundMean(PrivacyContext(5.0, 1e-5, noise=NoiseSource(0, secure=False)))
    print("one thread; seeded noise; medians of round-robin repeats, rows in a random order each repeat.\n"
          "cpu = time.thread_time of the call (on a shared machine a call longer than a scheduler slice waits\n"
          "for other processes, which inflates wall time)")
    if args.policy in ("cartpole", "all"):
        bench_cartpole(args.repeats, private)
        bench_cartpole(max(5, args.repeats // 3), private, total=8192, opacus=False)  # 8 rollouts per user
    if args.policy in ("lm", "all"):
        bench_lm(args.repeats, private, lora=False)
        bench_lm(args.repeats, private, lora=True)


if __name__ == "__main__":
    main()
