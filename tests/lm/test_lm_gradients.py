"""The language model's parameter space (``AdapterSpace``, over the one per-user-gradient engine): per-user and
per-completion adapter gradients equal a brute-force loop of backward passes; only adapters train."""
from __future__ import annotations

import torch

from dppo.algos.core import group_advantages
from dppo.envs.prompts import PromptsEnv
from dppo.policies.lm import LMPolicy
from dppo.policies.spaces import AdapterSpace, make_space
from dppo.privacy.release import clip_per_user
from tests.lm.conftest import MODEL, REWARD

LORA = {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _policy(dtype="float64"):
    torch.manual_seed(0)
    pol = LMPolicy(MODEL, lora=LORA, max_new_tokens=5, dtype=dtype)
    for _, p in pol.trainable():  # LoRA B starts at zero: move off it so every factor has a gradient
        p.data.normal_(0, 0.1)
    return pol


def _batch(pol, env, users, G, seed=0):
    return env.collector(seed).users(pol, users, 0, G, 1.0)[0]


def _brute(pol, batch, A, G):
    """Each user alone: its own forward and backward pass of (1/G) sum_g A_g log pi(y_g | x)."""
    params = [p for _, p in pol.trainable()]
    rows = []
    for i in range(batch.users):
        sl = slice(i * G, (i + 1) * G)
        lp = pol.token_log_probs(batch.prompt_ids[i:i + 1], batch.prompt_mask[i:i + 1], batch.ids[sl],
                                 batch.token_mask[sl], group=G).sum(1)
        grads = torch.autograd.grad((A[sl].to(lp.dtype) / G * lp).sum(), params)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows).double()


def test_per_user_adapter_gradients_equal_a_brute_force_loop(small_prompts):
    """One forward of every user's prompt (its KV cache shared by its G completions) and one backward give
    each user's gradient; equal to each user's own backward to 1e-7 in float64, and so the clipped sum."""
    pol = _policy()
    env = PromptsEnv(small_prompts, REWARD)
    G = 3
    batch = _batch(pol, env, list(range(6)), G)
    A = group_advantages(batch.grouped(batch.returns))[0].reshape(-1, 1)
    space = make_space(pol, dim=None)
    assert isinstance(space, AdapterSpace) and space.dim == pol.num_trainable()
    fast = space.user_gradients(batch, A)
    brute = _brute(pol, batch, A.reshape(-1), G)
    assert fast.shape == brute.shape == (6, pol.num_trainable())
    torch.testing.assert_close(fast, brute, rtol=1e-7, atol=1e-9)
    C = 0.5 * float(brute.norm(dim=1).median())
    torch.testing.assert_close(clip_per_user(fast, C)[0].sum(0), clip_per_user(brute, C)[0].sum(0), rtol=1e-7,
                               atol=1e-9)


def test_fused_clipped_sum_equals_clipping_the_per_user_rows(small_prompts):
    """``clipped_user_sum`` (norms and the clipped sum without the (m, dim) rows; DP-PG's path) equals clipping
    ``user_gradients``' rows and summing them, to 1e-9 in float64: LoRA with the KL anchor (the layers called on
    the prompt and then on its completions), and every linear layer (embeddings and norms frozen)."""
    from dppo.privacy.release import clip_scale

    env = PromptsEnv(small_prompts, REWARD)
    G = 3
    for lora, kl in ((LORA, 0.05), (None, 0.0)):
        torch.manual_seed(0)
        pol = LMPolicy(MODEL, lora=lora, max_new_tokens=5, dtype="float64")
        if lora is None:
            for name, p in pol.model.named_parameters():
                p.requires_grad_("proj" in name or "lm_head" in name)
        else:
            for _, p in pol.trainable():
                p.data.normal_(0, 0.1)
        batch = _batch(pol, env, list(range(5)), G)
        A = group_advantages(batch.grouped(batch.returns))[0].reshape(-1, 1)
        space = make_space(pol, dim=None)
        rows = space.user_gradients(batch, A, kl_coef=kl)
        C = 0.7 * float(rows.norm(dim=1).median())
        n = rows.norm(dim=1)
        total, norms = space.clipped_user_sum(batch, A, lambda v: clip_scale(v, C), kl_coef=kl)
        torch.testing.assert_close(norms, n, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(total, (rows * clip_scale(n, C)[:, None]).sum(0), rtol=1e-9, atol=1e-12)


def test_completion_features_are_each_completions_own_gradient(small_prompts):
    """``features`` (NPG's rows) = grad log pi(y_b | x_b) of every completion (its prompt repeated); their
    per-user mean under the advantages is ``user_gradients`` (shared KV cache: the same up to rounding)."""
    pol = _policy()
    env = PromptsEnv(small_prompts, REWARD)
    G = 2
    batch = _batch(pol, env, list(range(4)), G, seed=1)
    space = make_space(pol, dim=None)
    phi = space.features(batch)
    params = [p for _, p in pol.trainable()]
    for b in range(batch.ids.shape[0]):
        i = b // G
        lp = pol.token_log_probs(batch.prompt_ids[i:i + 1], batch.prompt_mask[i:i + 1], batch.ids[b:b + 1],
                                 batch.token_mask[b:b + 1]).sum()
        brute = torch.cat([g.reshape(-1) for g in torch.autograd.grad(lp, params)]).double()
        torch.testing.assert_close(phi[b], brute, rtol=1e-7, atol=1e-9)
    A = torch.randn(batch.ids.shape[0], 1, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    per_user = (phi * A).reshape(batch.users, G, -1).sum(1) / G
    torch.testing.assert_close(space.user_gradients(batch, A), per_user, rtol=1e-5, atol=1e-6)


def test_per_user_gradients_do_not_depend_on_the_micro_batch(small_prompts):
    pol = _policy()
    env = PromptsEnv(small_prompts, REWARD)
    batch = _batch(pol, env, list(range(4)), 2)
    A = torch.ones(8, 1, dtype=torch.float64)
    space = make_space(pol, dim=None)
    whole = space.user_gradients(batch, A)
    pol.micro_batch = 2  # one user per forward pass (G = 2 sequences)
    torch.testing.assert_close(space.user_gradients(batch, A), whole)


def test_a_random_subspace_of_the_adapter_projects_the_gradients(small_prompts):
    """``policy.dim=k`` on a language model: the same engine, then the fixed public projection P^T."""
    pol = _policy()
    env = PromptsEnv(small_prompts, REWARD)
    batch = _batch(pol, env, list(range(3)), 2)
    A = torch.randn(6, 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    full, small = make_space(pol, dim=None), make_space(pol, dim=16, seed=3)
    assert small.dim == 16 and small.projection.shape == (pol.num_trainable(), 16)
    torch.testing.assert_close(small.user_gradients(batch, A), full.user_gradients(batch, A) @ small.projection)


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
    pid, pm = pol.encode(prompts)
    u = torch.rand(15, pol.max_new_tokens, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    comp = pol.sample(pid, pm, u, group=3)
    with torch.no_grad():
        shared = pol.token_log_probs(pid, pm, comp.ids, comp.mask, group=3).sum(1)
        rep = pol.token_log_probs(pid.repeat_interleave(3, 0), pm.repeat_interleave(3, 0), comp.ids, comp.mask).sum(1)
    torch.testing.assert_close(shared.double(), comp.logp, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(rep.double(), comp.logp, rtol=1e-7, atol=1e-9)
    assert all(m[: int(m.sum())].all() for m in comp.mask)  # the mask is a prefix (EOS included)
