"""Per-user gradients from one backward (per-layer rules) equal the torch.func vmap and a brute-force loop."""
import gymnasium as gym
import pytest
import torch
from torch import nn

from dppo.policies.per_user_grads import Groups, per_user_gradients, per_user_gradients_func
from dppo.policies.base import Policy
from dppo.policies.loglinear import LogLinearPolicy
from dppo.policies.mlp import MLPPolicy

TOL = dict(rtol=0, atol=1e-6)  # float64 throughout: the two paths differ by summation order only
# Where two computations differ by the shape of the batch around a user (which CPU kernels may sum in another
# order), rows agree to rounding, not bit for bit: 1e-12 of the row's norm in float64, 1e-6 in float32.
ROW_REL = {torch.float64: 1e-12, torch.float32: 1e-6}


def assert_rows_close(got, expect):
    """Each row within ROW_REL of its norm (the stated tolerance for results computed in different batches)."""
    assert got.shape == expect.shape and got.dtype == expect.dtype
    err = (got - expect).double().norm(dim=1)
    scale = expect.double().norm(dim=1).clamp_min(torch.finfo(expect.dtype).tiny)
    assert bool((err <= ROW_REL[expect.dtype] * scale).all()), float((err / scale).max())


def brute_force(policy, obs, actions, weights):
    """One ordinary backward per user (the definition)."""
    rows = []
    params = [p for p in policy.parameters() if p.requires_grad]
    for i in range(obs.shape[0]):
        policy.zero_grad()
        (policy(obs[i], actions[i]) * weights[i]).sum().backward()
        rows.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]))
    return torch.stack(rows)


class GaussianPolicy(nn.Module):
    """Continuous actions: mean = Linear(tanh(Linear(s))), a state-independent log-std owned by the root."""

    def __init__(self, d_obs=3, d_act=2):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_obs, 16), nn.Tanh())
        self.mean = nn.Linear(16, d_act)
        self.log_std = nn.Parameter(torch.linspace(-0.5, 0.3, d_act))

    def forward(self, obs, actions):
        mu = self.mean(self.body(obs))
        return torch.distributions.Normal(mu, self.log_std.exp()).log_prob(actions).sum(-1)


class Scale(nn.Module):
    """A layer without a registered rule (exercises the per-module torch.func fallback)."""

    def __init__(self, d):
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * self.gain


class TokenPolicy(Policy):
    """Embedding + LayerNorm + Linear (+ RMSNorm) over a window of tokens (a toy language-model policy)."""

    def __init__(self, vocab=11, dim=8, n_actions=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.norm = nn.LayerNorm(dim)
        self.scale = Scale(dim)
        self.proj = nn.Linear(dim, dim)
        self.rms = nn.RMSNorm(dim)
        self.out = nn.Linear(dim, n_actions)

    def logits(self, tokens):
        h = self.scale(self.norm(self.embed(tokens)))
        h = torch.tanh(self.proj(h)) + h
        return self.out(self.rms(h).mean(1))


def _batch(m, T, obs_fn, n_actions=None, act_shape=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = obs_fn(g)
    if act_shape is not None:
        actions = torch.randn(m, T, *act_shape, generator=g, dtype=torch.float64)
    else:
        actions = torch.randint(0, n_actions, (m, T), generator=g)
    lengths = torch.randint(1, T + 1, (m,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    weights = torch.randn(m, T, generator=g, dtype=torch.float64) * mask
    return obs, actions, weights


def _cases():
    torch.manual_seed(0)
    m, T = 6, 9
    mlp = MLPPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)).double()
    loglin = LogLinearPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), init_scale=0.5).double()
    gauss = GaussianPolicy().double()
    tok = TokenPolicy().double()
    return {
        "mlp": (mlp, _batch(m, T, lambda g: torch.randn(m, T, 4, generator=g, dtype=torch.float64), 3)),
        "loglinear": (loglin, _batch(m, T, lambda g: torch.randn(m, T, 4, generator=g, dtype=torch.float64), 3)),
        "gaussian": (gauss, _batch(m, T, lambda g: torch.randn(m, T, 3, generator=g, dtype=torch.float64),
                                   act_shape=(2,))),
        "tokens": (tok, _batch(m, T, lambda g: torch.randint(0, 11, (m, T, 7), generator=g), 5)),
    }


CASES = _cases()


@pytest.mark.parametrize("pad_multiple", [1, 4])
@pytest.mark.parametrize("name", sorted(CASES))
def test_hook_gradients_equal_torch_func_and_brute_force(name, pad_multiple):
    policy, (obs, actions, weights) = CASES[name]
    hooks = per_user_gradients(policy, (obs, actions), weights, pad_multiple=pad_multiple)
    func = per_user_gradients_func(policy, (obs, actions), weights)
    brute = brute_force(policy, obs, actions, weights)
    assert hooks.dtype == torch.float64 and hooks.shape == brute.shape
    assert torch.allclose(hooks, func, **TOL)
    assert torch.allclose(hooks, brute, **TOL)
    assert hooks.abs().max() > 1e-3  # not trivially zero


@pytest.mark.parametrize("name", sorted(CASES))
def test_flat_rows_grouped_by_user_index_equal_padded_users(name):
    """G rollouts per user as flat rows in any order: the user index groups them (contract C5)."""
    policy, (obs, actions, weights) = CASES[name]
    m, T = weights.shape
    # users 0..m-1 each own two "rollouts": row block i and i + m, shuffled
    obs2, act2, w2 = torch.cat([obs, obs.flip(0)]), torch.cat([actions, actions.flip(0)]), torch.cat([weights, weights.flip(0) * 0.5])
    user = torch.cat([torch.arange(m), torch.arange(m).flip(0)]).repeat_interleave(T)
    flat = lambda t: t.reshape(2 * m * T, *t.shape[2:])  # noqa: E731
    perm = torch.randperm(2 * m * T, generator=torch.Generator().manual_seed(1))
    got = per_user_gradients(policy, (flat(obs2)[perm], flat(act2)[perm]), flat(w2)[perm], user[perm], num_users=m + 1)
    expect = per_user_gradients_func(policy, (obs, actions), weights) + 0.5 * per_user_gradients_func(policy, (obs, actions), weights)
    assert got.shape[0] == m + 1 and torch.equal(got[m], torch.zeros_like(got[m]))  # a user without rows
    assert torch.allclose(got[:m], expect, **TOL)


def test_only_trainable_parameters_get_gradients():
    policy, (obs, actions, weights) = CASES["tokens"]
    policy.embed.weight.requires_grad_(False)
    policy.norm.bias.requires_grad_(False)
    try:
        got = per_user_gradients(policy, (obs, actions), weights)
        brute = brute_force(policy, obs, actions, weights)
        n_trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        assert got.shape == (obs.shape[0], n_trainable)
        assert torch.allclose(got, brute, **TOL)
    finally:
        policy.embed.weight.requires_grad_(True)
        policy.norm.bias.requires_grad_(True)


def test_float32_hook_gradients_match_func_to_float32_rounding():
    """The default float32 MLP: same numbers up to float32 summation-order rounding (~1e-7 relative)."""
    torch.manual_seed(0)
    policy = MLPPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    obs, actions, weights = torch.randn(10, 103, 4), torch.randint(0, 2, (10, 103)), torch.randn(10, 103)
    hooks = per_user_gradients(policy, (obs, actions), weights)
    func = per_user_gradients_func(policy, (obs, actions), weights)
    assert hooks.dtype == torch.float32
    assert torch.allclose(hooks, func, rtol=1e-5, atol=1e-5 * float(func.abs().max()))


def test_an_in_place_edit_after_a_layer_falls_back_to_torch_func():
    class InPlace(Policy):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

        def logits(self, obs):
            h = self.a(obs)
            h.mul_(2.0)  # changes the captured output: the hook path cannot use it
            return self.b(torch.tanh(h))

    policy = InPlace().double()
    obs, actions = torch.randn(3, 5, 3, dtype=torch.float64), torch.randint(0, 2, (3, 5))
    w = torch.randn(3, 5, dtype=torch.float64)
    assert torch.allclose(per_user_gradients(policy, (obs, actions), w), brute_force(policy, obs, actions, w), **TOL)


def test_layout_pads_each_user_with_its_own_first_row_and_sums_per_user():
    user = torch.tensor([1, 0, 1, 1, 0])
    g = Groups(user, 3, pad_multiple=2)
    # user 0 (2 rows), then user 1 (3 rows + a copy of its first row, row 0)
    assert g.src[:6].tolist() == [1, 4, 0, 2, 3, 0]
    assert g.weight_src[:6].tolist() == [1, 4, 0, 2, 3, 5]  # index 5 = the appended zero weight
    assert [(s0, list(u), L) for s0, u, L in g.buckets][:2] == [(0, [0], 2), (2, [1], 4)]
    left_out = Groups(torch.tensor([1, 0, 1, 1, 0, 0]), 3, pad_multiple=2, keep=torch.tensor([1, 1, 1, 1, 0, 1]).bool())
    assert left_out.src[:4].tolist() == [1, 5, 0, 2] and left_out.weight_src[:4].tolist() == [1, 5, 0, 2]
    assert g.slot_user[:6].tolist() == [0, 0, 1, 1, 1, 1] and g.num_slots >= 32  # phantom user up to MIN_ROWS
    w = g.layout_weights(torch.arange(5.0))
    x = w[:, None]
    assert torch.equal(g.sum(x)[:3, 0], torch.tensor([5.0, 5.0, 0.0]))
    assert torch.equal(g.block_matmul(torch.ones_like(x), x)[:3, 0, 0], torch.tensor([5.0, 5.0, 0.0]))


def test_peft_lora_adapters_are_covered_by_the_linear_rule():
    peft = pytest.importorskip("peft")

    class Net(Policy):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 3)

        def logits(self, obs):
            return self.fc2(torch.tanh(self.fc1(obs)))

    torch.manual_seed(0)
    base = Net().double()
    model = peft.inject_adapter_in_model(peft.LoraConfig(r=2, lora_alpha=4, target_modules=["fc1", "fc2"],
                                                         init_lora_weights=False), base)
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    assert sum(p.requires_grad for p in model.parameters()) == 4
    obs, actions = torch.randn(4, 6, 4, dtype=torch.float64), torch.randint(0, 3, (4, 6))
    w = torch.randn(4, 6, dtype=torch.float64)
    got = per_user_gradients(model, (obs, actions), w)
    assert got.shape == (4, sum(p.numel() for p in model.parameters() if p.requires_grad))
    assert torch.allclose(got, brute_force(model, obs, actions, w), **TOL)
    assert torch.allclose(got, per_user_gradients_func(model, (obs, actions), w), **TOL)


@pytest.mark.parametrize("name", ["mlp", "tokens", "gaussian"])
def test_rule_covered_models_do_not_fall_back_to_the_whole_model_vmap(name, monkeypatch):
    from dppo.policies.per_user_grads import materialised

    def refuse(*a, **k):
        raise AssertionError("fell back to the whole-model torch.func path")

    monkeypatch.setattr(materialised, "per_user_gradients_func", refuse)
    policy, (obs, actions, weights) = CASES[name]
    assert torch.allclose(per_user_gradients(policy, (obs, actions), weights),
                          brute_force(policy, obs, actions, weights), **TOL)


@pytest.mark.parametrize("pad_multiple", [1, 4])
@pytest.mark.parametrize("name", ["mlp", "tokens", "gaussian"])
def test_a_users_gradient_does_not_depend_on_the_rest_of_the_batch(name, pad_multiple):
    """Per-user sums run over that user's rows only, so a user's gradient computed with a different set of
    other users (what a sharded run does) is the same gradient: equal to 1e-12 of its norm (float64). Not
    bit for bit on every CPU: the batched products around it have another shape, and a CPU's kernels may
    then sum in another order (the last bits differed on an AMD EPYC)."""
    policy, (obs, actions, weights) = CASES[name]
    m = obs.shape[0]
    flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
    user = torch.arange(m).repeat_interleave(obs.shape[1])
    keep = flat(weights) != 0
    args = [flat(obs)[keep], flat(actions)[keep], flat(weights)[keep], user[keep]]
    everyone = per_user_gradients(policy, (args[0], args[1]), args[2], args[3], num_users=m, pad_multiple=pad_multiple)
    for subset in ([0, 1, 2], [4], [5, 3]):
        sel = torch.isin(args[3], torch.tensor(subset))
        remap = torch.full((m,), -1, dtype=torch.long)
        remap[torch.tensor(subset)] = torch.arange(len(subset))
        part = per_user_gradients(policy, (args[0][sel], args[1][sel]), args[2][sel], remap[args[3][sel]], num_users=len(subset),
                                  pad_multiple=pad_multiple)
        assert_rows_close(part, everyone[subset])


def test_a_tiny_llama_with_its_rmsnorm_rule_matches_brute_force():
    transformers = pytest.importorskip("transformers")
    from dppo.policies.per_user_grads import rules

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
                                   attn_implementation="eager")
    lm = transformers.LlamaForCausalLM(cfg).double()

    class Completion(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, prompts, completions):
            logits = self.lm(torch.cat([prompts, completions], 1)).logits[:, prompts.shape[1] - 1:-1]
            return torch.log_softmax(logits, -1).gather(-1, completions[..., None]).squeeze(-1).sum(-1)

    policy = Completion()
    g = torch.Generator().manual_seed(3)
    prompts, completions = torch.randint(0, 13, (4, 3, 5), generator=g), torch.randint(0, 13, (4, 3, 4), generator=g)
    w = torch.randn(4, 3, generator=g, dtype=torch.float64)
    used = []
    original = rules.module_vjp
    rules.module_vjp = lambda mod, *a: used.append(type(mod).__name__) or original(mod, *a)
    try:
        got = per_user_gradients(policy, (prompts, completions), w)
    finally:
        rules.module_vjp = original
    assert used == []  # every trainable layer of the Llama has a rule
    assert torch.allclose(got, brute_force(policy, prompts, completions, w), **TOL)


def test_the_sorted_fast_layout_equals_the_general_layout(monkeypatch):
    """Users' rows in id order (the learners' layout): the few-op layout gives the general one's slots."""
    g = torch.Generator().manual_seed(5)
    user = torch.tensor([0] * 7 + [1] * 7 + [3] * 4 + [4] * 30)  # user 2 has no rows, 5 is past the last row
    keep = torch.rand(len(user), generator=g) > 0.2
    fast = Groups(user, 6, keep=keep)
    monkeypatch.setattr(Groups, "_init_sorted", lambda *a: False)
    general = Groups(user, 6, keep=keep)
    assert general.src.tolist() == fast.src.tolist() and general.weight_src.tolist() == fast.weight_src.tolist()
    assert general.slot_user.tolist() == fast.slot_user.tolist() and general.num_slots == fast.num_slots
    assert general.buckets == fast.buckets
    assert fast.identity is False and Groups(user[:40], 5).identity is True  # 40 rows >= MIN_ROWS, nothing left out


def _general_path(monkeypatch):
    """Force the general per-module loop and the gathered layout (the paths the fast ones must equal)."""
    from dppo.policies.per_user_grads import materialised

    monkeypatch.setattr(materialised, "_linear_layers", lambda *a: (_ for _ in ()).throw(AssertionError("fast path")))
    real_hook = materialised._hook_gradients

    def general(policy, objective, plan, *args):
        saved, plan.linear = plan.linear, None
        try:
            return real_hook(policy, objective, plan, *args)
        finally:
            plan.linear = saved

    monkeypatch.setattr(materialised, "_hook_gradients", general)
    monkeypatch.setattr(Groups, "_init_strided", lambda *a: False)


def _mlp_batch(seed=3, m=7, T=40, empty=(2,), gap=False):
    g = torch.Generator().manual_seed(seed)
    obs, actions = torch.randn(m, T, 4, generator=g), torch.randint(0, 3, (m, T), generator=g)
    lengths = torch.randint(5, T + 1, (m,), generator=g)
    lengths[list(empty)] = 0  # users without rows
    w = torch.randn(m, T, generator=g) * (torch.arange(T)[None] < lengths[:, None])
    if gap:
        w[0, 1] = 0.0  # a zero-weight row inside user 0's episode: its kept rows are no longer a prefix
    return obs, actions, w


@pytest.mark.parametrize("gap", [False, True])
@pytest.mark.parametrize("frozen", [None, "body.0.bias", "head.weight"])
def test_the_linear_fast_path_and_strided_layout_equal_the_general_path(frozen, gap, monkeypatch):
    """MLPs (every trainable module an nn.Linear used once) take the fast path on the padded episodes
    without gathering rows; the result is the general path's to float32 rounding (1e-6 of each row's norm:
    the two paths run products of different shapes), and a user without rows gets exact zeros (by
    construction: nothing is ever added to its row)."""
    torch.manual_seed(0)
    policy = MLPPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
    if frozen:
        policy.get_parameter(frozen).requires_grad_(False)
    obs, actions, w = _mlp_batch(gap=gap)
    fast = per_user_gradients(policy, (obs, actions), w)
    assert torch.equal(fast[2], torch.zeros_like(fast[2])) and fast.abs().max() > 1e-4
    with monkeypatch.context() as mp:
        _general_path(mp)
        general = per_user_gradients(policy, (obs, actions), w)
    assert_rows_close(fast, general)
    assert torch.equal(general[2], torch.zeros_like(general[2]))
    with monkeypatch.context() as mp:  # a large output: the in-place general path
        mp.setattr("dppo.policies.per_user_grads.materialised.FAST_PATH_MAX_ELEMENTS", 0)
        in_place = per_user_gradients(policy, (obs, actions), w)
        assert_rows_close(in_place, fast)
        assert torch.equal(in_place[2], torch.zeros_like(in_place[2]))
    assert torch.allclose(fast.double(), per_user_gradients_func(policy, (obs, actions), w).double(), rtol=1e-4,
                          atol=1e-6)


def test_a_linear_layer_used_twice_or_not_at_all_leaves_the_fast_path():
    class Odd(Policy):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.unused = nn.Linear(4, 4), nn.Linear(4, 3), nn.Linear(4, 4)

        def logits(self, obs):
            return self.b(torch.tanh(self.a(torch.tanh(self.a(obs)))))  # a used twice; unused never

    policy = Odd().double()
    obs, actions = torch.randn(5, 8, 4, dtype=torch.float64), torch.randint(0, 3, (5, 8))
    w = torch.randn(5, 8, dtype=torch.float64)
    got = per_user_gradients(policy, (obs, actions), w)
    assert torch.allclose(got, brute_force(policy, obs, actions, w), **TOL)
    P_unused = sum(p.numel() for p in policy.unused.parameters())
    assert torch.equal(got[:, -P_unused:], torch.zeros(5, P_unused, dtype=torch.float64))


def test_capture_hooks_are_registered_once_and_do_nothing_outside_a_capture():
    import copy

    from dppo.policies.per_user_grads import capture

    torch.manual_seed(0)
    policy = MLPPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    obs, actions, w = torch.randn(3, 12, 4), torch.randint(0, 2, (3, 12)), torch.randn(3, 12)
    first = per_user_gradients(policy, (obs, actions), w)
    policy.head.bias.requires_grad_(False)  # a new plan for the same modules: no second hook
    per_user_gradients(policy, (obs, actions), w)
    policy.head.bias.requires_grad_(True)
    assert all(len(mod._forward_hooks) == 1 for mod in (policy.body[0], policy.body[2], policy.head))
    assert not capture._CAPTURES.stack
    with torch.no_grad():
        policy.sample(obs[0])  # sampling outside a capture records nothing
    assert not capture._CAPTURES.stack
    clone = copy.deepcopy(policy)  # a copy carries the inert hook and gets its own plan
    assert torch.equal(per_user_gradients(clone, (obs, actions), w), first)
    assert torch.equal(per_user_gradients(policy, (obs, actions), w), first)
