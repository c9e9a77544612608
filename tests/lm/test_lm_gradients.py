"""Per-user clipped sums of adapter gradients equal a brute-force loop over users; only adapters train."""
from __future__ import annotations

import torch

from dppo.algos.prompt_po import group_advantages
from dppo.envs.prompts import PromptsEnv
from dppo.policies.lm import LMPolicy
from dppo.policies.lm_grads import per_user_gradients, summed_gradient
from dppo.privacy.clipping import clip_per_user
from tests.lm.conftest import MODEL, REWARD

LORA = {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _policy(dtype="float64"):
    torch.manual_seed(0)
    pol = LMPolicy(MODEL, lora=LORA, max_new_tokens=5, dtype=dtype)
    for _, p in pol.trainable():  # LoRA B starts at zero: move off it so every factor has a gradient
        p.data.normal_(0, 0.1)
    return pol


def _group(pol, prompts, G, seed=0):
    pid, pm = pol.encode(prompts)
    u = torch.rand(len(prompts) * G, pol.max_new_tokens, generator=torch.Generator().manual_seed(seed),
                   dtype=torch.float64)
    comp = pol.sample(pid, pm, u, group=G)
    return pid, pm, comp


def test_per_user_clipped_sum_equals_brute_force_loop(small_prompts):
    pol = _policy()
    env = PromptsEnv(small_prompts, REWARD)
    rows = env.private[:6]
    G = 3
    pid, pm, comp = _group(pol, env.prompts(rows), G)
    rewards, _ = env.rewards(rows, comp.texts, G, 1.0)
    A = group_advantages(torch.as_tensor(rewards)).reshape(-1)

    def objective(us):  # the shared-prompt (KV cache) path, users ``us``
        sl = slice(us.start * G, us.stop * G)
        lp = pol.token_log_probs(pid[us], pm[us], comp.ids[sl], comp.mask[sl], group=G)
        return A[sl].to(torch.float64) * lp.sum(1)

    fast = per_user_gradients(pol, objective, len(rows), G)
    params = [p for _, p in pol.trainable()]
    brute = []
    for i, prompt in enumerate(env.prompts(rows)):  # each user alone: its own forward and backward pass
        ids, mask = pol.encode([prompt])
        sl = slice(i * G, (i + 1) * G)
        lp = pol.token_log_probs(ids, mask, comp.ids[sl], comp.mask[sl], group=G).sum(1)
        grads = torch.autograd.grad((A[sl].to(torch.float64) * lp).sum(), params)
        brute.append(torch.cat([g.reshape(-1) for g in grads]))
    brute = torch.stack(brute).double()
    assert fast.shape == brute.shape == (len(rows), pol.num_trainable())
    torch.testing.assert_close(fast, brute, rtol=1e-7, atol=1e-9)
    C = 0.5 * float(brute.norm(dim=1).median())
    torch.testing.assert_close(clip_per_user(fast, C)[0].sum(0), clip_per_user(brute, C)[0].sum(0), rtol=1e-7, atol=1e-9)
    # the non-private path (one backward of the summed objective) is the sum of the rows
    torch.testing.assert_close(summed_gradient(pol, objective, len(rows), G), brute.sum(0), rtol=1e-7, atol=1e-9)
    # sharing the prompt's KV cache changes only rounding: the same gradients as repeating the prompt
    rep_ids, rep_mask = pid.repeat_interleave(G, 0), pm.repeat_interleave(G, 0)

    def repeated(us):
        sl = slice(us.start * G, us.stop * G)
        return A[sl].to(torch.float64) * pol.token_log_probs(rep_ids[sl], rep_mask[sl], comp.ids[sl], comp.mask[sl]).sum(1)

    torch.testing.assert_close(per_user_gradients(pol, repeated, len(rows), G), fast, rtol=1e-5, atol=1e-6)


def test_per_user_gradients_do_not_depend_on_chunking(small_prompts):
    pol = _policy()
    env = PromptsEnv(small_prompts, REWARD)
    rows = env.private[:4]
    pid, pm, comp = _group(pol, env.prompts(rows), 2)

    def objective(us):
        sl = slice(us.start * 2, us.stop * 2)
        return pol.token_log_probs(pid[us], pm[us], comp.ids[sl], comp.mask[sl], group=2).sum(1)

    whole = per_user_gradients(pol, objective, 4, 2)
    pol.micro_batch = 2  # one user per chunk (G = 2 sequences)
    torch.testing.assert_close(per_user_gradients(pol, objective, 4, 2), whole)


def test_only_adapter_parameters_are_trainable():
    pol = _policy("float32")
    names = [n for n, _ in pol.trainable()]
    assert names and all("lora_" in n for n in names)
    frozen = [n for n, p in pol.model.named_parameters() if "lora_" not in n]
    assert frozen and not any(p.requires_grad for n, p in pol.model.named_parameters() if "lora_" not in n)


def test_sampling_log_probs_match_scoring(small_prompts):
    """The KV-cached sampler's log-probabilities equal a fresh scoring pass (shared and unshared prompt)."""
    pol = _policy()
    env = PromptsEnv(small_prompts, REWARD)
    prompts = env.prompts(env.private[:5])
    pid, pm, comp = _group(pol, prompts, 3, seed=4)
    with torch.no_grad():
        shared = pol.token_log_probs(pid, pm, comp.ids, comp.mask, group=3).sum(1)
        rep = pol.token_log_probs(pid.repeat_interleave(3, 0), pm.repeat_interleave(3, 0), comp.ids, comp.mask).sum(1)
    torch.testing.assert_close(shared.double(), comp.logp, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(rep.double(), comp.logp, rtol=1e-7, atol=1e-9)
    assert all(m[: int(m.sum())].all() for m in comp.mask)  # the mask is a prefix (EOS included)
