"""Policy optimization of a language model on ``env=prompts``: one prompt = one user, G completions each.

A round takes m fresh private prompts (users) from the one-pass sampler, samples G completions per prompt
(``group_size``; user u's sampling uses its own stream ``user_generator(seed, u, round)``), scores them with
the env's reward (clipped to ``reward_bound``) and makes one update of the trainable (LoRA) parameters:

- ``GroupPolicyGradient`` (``algo=pg|dp_pg``; GRPO form with one on-policy step): user i's objective is
  J_i = (1/G) sum_g [A_ig log pi(y_ig|x_i) - kl_coef KL_k3(pi || pi_0)(x_i, y_ig)], with the group advantage
  A_ig = (r_ig - mean_g r_i.) / (std_g r_i. + 1e-8) (``advantage=group``, ``group_std``; optionally the
  leave-one-out mean): user i's own group only, none of TRL's batch-level normalizers. The update
  direction is mean_i grad J_i (PG) or (sum_i clip_C(grad J_i) + N(0, sigma^2 I)) / m (DP-PG,
  sigma = analytic Gaussian for the replace-one sensitivity 2C, ``GaussianSumPrivatizer``); a step of
  the configured optimizer follows (post-processing). pi_0 is the initial public model (adapter off).
- ``PromptNPG`` (``algo=npg|dp_npg``): the compatible least squares with one block of G rows per user,
  rows (grad log pi(y_ig|x_i), A_ig), solved by the injected oracle (``dp_gd``: per-user clipped noisy
  gradient steps; ``exact`` when non-private); theta += eta_t w.
- ``PromptREBEL`` (``algo=rebel|dp_rebel``): REBEL's regression on pairs (y_i,2j, y_i,2j+1) of a user's
  group, rows (grad log pi(y) - grad log pi(y'), eta (r - r')) (linearized at theta_t, as in
  ``dppo.algos.rebel``), the same oracle.

Privacy: every quantity entering user i's contribution (its gradient, or its regression rows) is a
function of user i's prompt, its own G completions, their rewards and the released current policy;
the user's G completions form one clipped unit. Each round is (eps, delta)-DP in its users and each
prompt is used once, so parallel composition gives the run's guarantee (the ``parallel`` accountant).
Logged raw statistics of the round's users are ``diag/*``; ``eval/return`` and the text completions
use held-out *public* prompts only.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from dppo.algos.base import Learner
from dppo.algos.core import ADVANTAGES
from dppo.algos.core import group_advantages as core_group_advantages
from dppo.data.streams import public_generator, user_generator
from dppo.errors import ConfigError, DataError
from dppo.policies.lm_grads import per_user_gradients, summed_gradient
from dppo.privacy.clipping import GaussianSumPrivatizer

GENERIC_ONLY = ("gamma", "subspace", "dim", "head_dim", "fisher_states", "head_basis")


def group_advantages(rewards: torch.Tensor, advantage: str = "group", group_std: bool = True,
                     leave_one_out: bool = False) -> torch.Tensor:
    """(U, G) advantages, each row from that user's own G rewards only (the shared core's rule).

    ``group``: ``dppo.algos.core.group_advantages`` (r_g - the group mean, or the mean of the other G - 1
    with ``leave_one_out``; divided by the group's std with ``group_std``: GRPO); ``to_go``: a one-step
    env's return-to-go is the reward, standardized over the user's own G completions, as the core does.
    """
    if advantage not in ADVANTAGES:
        raise ConfigError(f"algo.advantage must be one of {ADVANTAGES}, got '{advantage}'")
    if advantage == "to_go":
        return core_group_advantages(rewards, std=True)[0] if rewards.shape[1] > 1 else rewards.double()
    return core_group_advantages(rewards, std=group_std, leave_one_out=leave_one_out)[0]


@dataclass
class GroupBatch:
    """One round's data: ``prompt_ids/mask`` (U, P), completions ``ids/mask`` (U*G, T) user-major, rewards
    (U, G) clipped, and bookkeeping."""

    rows: list
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    ids: torch.Tensor
    mask: torch.Tensor
    texts: list
    rewards: torch.Tensor
    clipped: int
    tokens: int
    seconds: float

    @property
    def users(self) -> int:
        return len(self.rows)


def prompt_twin(cls):
    """The learner of ``cls``'s family for ``env=prompts`` (PG -> GRPO form, NPG, REBEL)."""
    from dppo.algos.npg import NaturalPolicyGradient
    from dppo.algos.pg import PolicyGradient
    from dppo.algos.rebel import REBEL

    if issubclass(cls, PromptLearner):
        return cls
    for base, twin in ((REBEL, PromptREBEL), (NaturalPolicyGradient, PromptNPG), (PolicyGradient, GroupPolicyGradient)):
        if issubclass(cls, base):
            return twin
    raise ConfigError(f"algo {cls.__name__} does not support env=prompts; use algo=pg|dp_pg|npg|dp_npg|rebel|dp_rebel")


class PromptLearner(Learner):
    """Shared collection, evaluation, logging and state of the prompt learners (module docstring).

    Args:
        policy: an ``LMPolicy``; env: a ``PromptsEnv``; privacy, sampler, logger: injected.
        seed, rounds, users_per_round, reward_bound: injected top-level keys.
        group_size: G completions per prompt (null: the class default).
        advantage, group_std, leave_one_out: the advantage (``group_advantages``), from the user's group only.
        not_applicable: keys of the generic conf/algo yaml that have no meaning on prompts
            (``gamma``: one-step env; ``subspace``, ``dim``, ``fisher_states``: gym-policy options; the
            update is on all adapter parameters); any other unknown key is an error.
    """

    name = "prompts"
    env_kind = "prompts"  # the builder applies the algo yaml's ``on_prompts`` block to these learners
    default_group_size = 4

    def __init__(self, policy, env, privacy, sampler, logger=None, *, seed: int = 0, rounds: int = 100,
                 users_per_round: int = 10, group_size: int | None = None, reward_bound: float | None = 1.0,
                 advantage: str = "group", group_std: bool = True, leave_one_out: bool = False, **not_applicable):
        unknown = sorted(set(not_applicable) - set(GENERIC_ONLY))
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} for algo {type(self).__name__} on env=prompts")
        if getattr(env, "kind", None) != "prompts" or not hasattr(policy, "token_log_probs"):
            raise ConfigError(f"{type(self).__name__} needs env=prompts and policy=lm")
        if privacy.multi_pass:
            raise ConfigError("env=prompts supports one-pass training only (privacy.multi_pass=false)")
        self.policy, self.env, self.privacy, self.sampler, self.logger = policy, env, privacy, sampler, logger
        self.seed, self.num_rounds, self.reward_bound = int(seed), int(rounds), reward_bound
        self.group_size = int(group_size if group_size is not None else self.default_group_size)
        if self.group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {self.group_size}")
        self.advantage, self.group_std, self.leave_one_out = advantage, bool(group_std), bool(leave_one_out)
        self.advantages(torch.zeros(1, self.group_size))  # validates the options (group needs G >= 2)
        env.check_capacity(self.num_rounds, int(users_per_round))
        self.check_prompt_lengths()

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_advantages(rewards, self.advantage, self.group_std, self.leave_one_out)

    def check_prompt_lengths(self) -> None:
        """Refuse (before anything is released) prompts that do not fit the context with a completion."""
        ctx = self.policy.context
        if ctx is None:
            return
        room = ctx - self.policy.max_new_tokens
        for part, rows in (("public", self.env.public), ("private", self.env.private)):
            lengths = self.policy.prompt_lengths(self.env.prompts(rows)) if rows else []
            too_long = [i for i, n in enumerate(lengths) if n > room or n == 0]
            if too_long:
                raise ConfigError(f"{len(too_long)} {part} prompt(s) of {self.env.path} (first: {part} row "
                                  f"{too_long[0]}) are empty or longer than the model's context ({ctx} tokens) minus "
                                  f"policy.max_new_tokens ({self.policy.max_new_tokens})")

    # ---- collection -----------------------------------------------------------------------------
    def collect(self, round_idx: int, users: list[int]) -> GroupBatch:
        """G completions per user from the user's own stream; rewards clipped as they arrive."""
        rows = self.env.user_rows(users)
        G, T = self.group_size, self.policy.max_new_tokens
        pid, pmask = self.policy.encode(self.env.prompts(rows))
        u = torch.cat([torch.rand(G, T, generator=user_generator(self.seed, uid, round_idx), dtype=torch.float64)
                       for uid in users])
        t0 = time.perf_counter()
        comp = self.policy.sample(pid, pmask, u, group=G)
        seconds = time.perf_counter() - t0
        rewards, clipped = self.env.rewards(rows, comp.texts, G, self.reward_bound)
        return GroupBatch(rows, pid, pmask, comp.ids, comp.mask, comp.texts, torch.as_tensor(rewards), clipped,
                          comp.tokens, seconds)

    def group_log_probs(self, batch: GroupBatch):
        """logp(us) = (n*G, T) token log-probs of the completions of users ``us`` (a slice), the prompt's KV
        cache shared by its own G completions."""
        G = self.group_size

        def logp(us: slice) -> torch.Tensor:
            seq = slice(us.start * G, us.stop * G)
            return self.policy.token_log_probs(batch.prompt_ids[us], batch.prompt_mask[us], batch.ids[seq],
                                               batch.mask[seq], group=G)

        return logp

    def round_metrics(self, batch: GroupBatch, round_idx: int) -> dict:
        r = batch.rewards
        m = {"rollout/users": batch.users, "rollout/episodes": batch.users * self.group_size,
             "diag/return": float(r.mean()),
             "diag/reward_clip_fraction": batch.clipped / max(r.numel(), 1),
             "diag/completion_tokens": batch.tokens / max(r.numel(), 1),
             "diag/zero_spread_fraction": float((r.max(1).values == r.min(1).values).double().mean()),
             "perf/tokens_per_s": batch.tokens / max(batch.seconds, 1e-9)}
        if self.env.eval_every and (round_idx + 1) % self.env.eval_every == 0:
            m["eval/return"] = self.evaluate(self.env.eval_size)
        if self.logger is not None and self.env.show_every and round_idx % self.env.show_every == 0:
            self.log_completions(round_idx)
        return m

    @staticmethod
    def rename_stats(stats: dict) -> dict:
        """Raw statistics of the round's users go under ``diag/`` (contract C3)."""
        return {("diag/clip_fraction" if k == "privacy/clip_fraction" else k): v for k, v in stats.items()}

    # ---- evaluation (public prompts only) ---------------------------------------------------------
    def public_completions(self, rows: list[dict], greedy: bool, stream_round: int = 0, group: int = 1):
        pid, pmask = self.policy.encode(self.env.prompts(rows))
        u = None
        if not greedy:
            u = torch.rand(len(rows) * group, self.policy.max_new_tokens,
                           generator=public_generator(0, "eval", stream_round), dtype=torch.float64)
        return self.policy.sample(pid, pmask, u, group=group)

    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean reward (unclipped) on the first ``episodes`` held-out public prompts: ``env.eval_samples``
        completions each from a fixed public stream (the same for every run and round), or one greedy one."""
        rows = self.env.eval_rows(episodes)
        if not rows:
            return float("nan")
        k = 1 if greedy else self.env.eval_samples
        comp = self.public_completions(rows, greedy, group=k)
        rewards, _ = self.env.rewards(rows, comp.texts, k, None)
        return float(rewards.mean())

    def log_completions(self, round_idx: int) -> None:
        """Greedy completions of a few held-out public prompts as TensorBoard text (never private ones)."""
        rows = self.env.eval_rows(self.env.show_completions)
        if not rows:
            return
        comp = self.public_completions(rows, greedy=True)
        rewards, _ = self.env.rewards(rows, comp.texts, 1, None)
        lines = ["|prompt|completion|reward|", "|-|-|-|"]
        lines += [f"|`{p}`|`{c}`|{float(r):.3f}|" for p, c, r in zip(self.env.prompts(rows), comp.texts, rewards[:, 0])]
        self.logger.text("eval/completions", "\n".join(lines), round_idx)

    # ---- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"adapter": self.policy.adapter_state()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_adapter_state(state["adapter"])

    def export_artifacts(self, run_dir: str, round_idx: int) -> None:
        """The adapter in peft's layout: ``checkpoints/adapter_<round>/`` and ``adapter/`` (the latest)."""
        self.policy.save_adapter(os.path.join(run_dir, "checkpoints", f"adapter_{round_idx}"))
        self.policy.save_adapter(os.path.join(run_dir, "adapter"))

    def summary(self) -> dict:
        try:  # public prompts; a reward that fails here has already failed the run (DataError)
            greedy = self.evaluate(self.env.eval_size, greedy=True)
        except DataError:
            greedy = None
        return {"trainable_parameters": self.policy.num_trainable(), "group_size": self.group_size,
                "eval_samples": self.env.eval_samples, "final_greedy_return": greedy}


class GroupPolicyGradient(PromptLearner):
    """PG / DP-PG in the GRPO form (module docstring).

    Args:
        lr, optimizer, momentum: the step on the (noisy) mean gradient (``adam`` or ``sgd``).
        max_grad_norm: C, the per-user clip of DP-PG (injected).
        kl_coef: weight of the k3 KL estimate to the initial (public) model, per completion token.
        advantage, group_std, leave_one_out: the group advantage (GRPO: group, std, no leave-one-out).
    """

    name = "pg"
    default_group_size = 8

    def __init__(self, policy, env, privacy, sampler, logger=None, *, seed: int = 0, rounds: int = 100,
                 users_per_round: int = 10, group_size: int | None = None, reward_bound: float | None = 1.0,
                 max_grad_norm: float = 1.0, lr: float = 0.01, optimizer: str = "adam", momentum: float = 0.0,
                 advantage: str = "group", group_std: bool = True, leave_one_out: bool = False,
                 kl_coef: float = 0.0, **not_applicable):
        super().__init__(policy, env, privacy, sampler, logger, seed=seed, rounds=rounds,
                         users_per_round=users_per_round, group_size=group_size, reward_bound=reward_bound,
                         advantage=advantage, group_std=group_std, leave_one_out=leave_one_out, **not_applicable)
        if kl_coef < 0:
            raise ConfigError(f"algo.kl_coef must be >= 0, got {kl_coef}")
        self.kl_coef = float(kl_coef)
        if self.kl_coef > 0:
            with policy.reference():
                pass  # raises ConfigError without an adapter
        params = [p for _, p in policy.trainable()]
        if optimizer == "adam":
            self.optimizer = torch.optim.Adam(params, lr=lr)
        elif optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum)
        else:
            raise ConfigError(f"algo.optimizer must be 'adam' or 'sgd', got '{optimizer}'")
        self.privatizer = GaussianSumPrivatizer(privacy, max_grad_norm) if privacy.private else None

    def user_objective(self, batch: GroupBatch, A: torch.Tensor):
        """objective(us) = (1/G) [A_b log pi(y_b|x_b) - kl_coef sum_t k3_t] for each completion b of users ``us``."""
        logp, G = self.group_log_probs(batch), self.group_size
        coef = (A.reshape(-1) / G).float()
        ref = None
        if self.kl_coef > 0:
            with torch.no_grad(), self.policy.reference():
                ref = logp(slice(0, batch.users))

        def objective(us: slice) -> torch.Tensor:
            sl = slice(us.start * G, us.stop * G)
            lp = logp(us)
            obj = coef[sl].to(lp.device) * lp.sum(1)
            if ref is not None:
                d = (ref[sl] - lp) * batch.mask[sl]
                obj = obj - self.kl_coef / self.group_size * (torch.exp(d) - d - 1).sum(1)
            return obj

        return objective

    def mean_gradient(self, objective, users: int, round_idx: int) -> tuple[torch.Tensor, dict]:
        """PG: mean_i grad J_i by one backward pass. DP-PG: the privatizer's clipped noisy mean."""
        if self.privatizer is None:
            return summed_gradient(self.policy, objective, users, self.group_size) / users, {}
        per_user = per_user_gradients(self.policy, objective, users, self.group_size)
        d, stats = self.privatizer.release_mean(per_user, round_idx)
        return d, self.rename_stats(stats)

    def train_round(self, round_idx: int) -> dict:
        users = self.sampler.next_round()
        batch = self.collect(round_idx, users)
        A = self.advantages(batch.rewards)
        direction, stats = self.mean_gradient(self.user_objective(batch, A), batch.users, round_idx)
        if not torch.isfinite(direction).all():
            raise DataError("the policy-gradient direction became NaN/inf; aborting before the update")
        offset = 0
        for _, p in self.policy.trainable():
            n = p.numel()
            p.grad = -direction[offset:offset + n].view_as(p).to(device=p.device, dtype=p.dtype)
            offset += n
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {**self.round_metrics(batch, round_idx), **stats, "losses/update_norm": float(direction.norm())}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])


class PromptNPG(PromptLearner):
    """NPG / DP-NPG on the adapter parameters through a least-squares oracle (module docstring).

    Args:
        oracle: injected (``dp_gd`` for DP-NPG; ``exact`` non-private).
        step: ``fixed`` (eta = lr), ``norm`` (eta = lr / ||d||) or ``kl`` (eta = sqrt(2 max_kl / d^T F d),
            F the Fisher matrix estimated on ``fisher_episodes`` held-out *public* prompts with completions
            from a public stream: data-independent, so the same rule serves NPG and DP-NPG).
        lr, max_kl, max_step_norm, momentum, step_decay: as in ``dppo.algos.npg``.
    """

    name = "npg"
    default_group_size = 4

    def __init__(self, policy, env, privacy, sampler, oracle, logger=None, *, seed: int = 0, rounds: int = 100,
                 users_per_round: int = 10, group_size: int | None = None, reward_bound: float | None = 1.0,
                 advantage: str = "group", group_std: bool = True, leave_one_out: bool = False,
                 step: str = "norm", lr: float = 0.05, max_kl: float = 0.01, max_step_norm: float | None = None,
                 momentum: float = 0.0, step_decay: float = 0.0, fisher_episodes: int = 32, **not_applicable):
        super().__init__(policy, env, privacy, sampler, logger, seed=seed, rounds=rounds,
                         users_per_round=users_per_round, group_size=group_size, reward_bound=reward_bound,
                         advantage=advantage, group_std=group_std, leave_one_out=leave_one_out, **not_applicable)
        if step not in ("fixed", "norm", "kl"):
            raise ConfigError(f"algo.step must be fixed|norm|kl, got '{step}'")
        if privacy.private and not oracle.private_capable:
            raise ConfigError(f"oracle '{oracle.name}' is not private; with eps set choose oracle=dp_gd|ssp|exp_mech")
        if not 0.0 <= momentum < 1.0 or step_decay < 0:
            raise ConfigError("algo.momentum must lie in [0, 1) and algo.step_decay be >= 0")
        d = policy.num_trainable()
        if oracle.name in ("ssp", "exp_mech") and d > 2048:
            raise ConfigError(f"oracle={oracle.name} works with d x d statistics or a cover of R^d, unusable for "
                              f"d = {d} adapter parameters; use oracle=dp_gd (noisy gradient steps) on env=prompts")
        self.oracle, self.step_rule, self.lr, self.max_kl = oracle, step, float(lr), float(max_kl)
        self.max_step_norm, self.momentum, self.step_decay = max_step_norm, float(momentum), float(step_decay)
        self.fisher_prompts = int(fisher_episodes)
        self.direction = torch.zeros(policy.num_trainable(), dtype=torch.float64)

    def sequence_gradients(self, batch: GroupBatch) -> torch.Tensor:
        """(U*G, d): row b = grad log pi(y_b | x_b) (each completion on its own: prompts repeated, no sharing)."""
        G = self.group_size
        pid, pm = batch.prompt_ids.repeat_interleave(G, 0), batch.prompt_mask.repeat_interleave(G, 0)

        def logp(sl: slice) -> torch.Tensor:
            return self.policy.token_log_probs(pid[sl], pm[sl], batch.ids[sl], batch.mask[sl]).sum(1)

        return per_user_gradients(self.policy, logp, batch.ids.shape[0], 1)

    def regression_rows(self, batch: GroupBatch) -> list:
        """User i's block: G rows (grad log pi(y_ig|x_i), A_ig)."""
        phi = self.sequence_gradients(batch)
        A = self.advantages(batch.rewards)
        G = self.group_size
        return [(phi[i * G:(i + 1) * G], A[i]) for i in range(batch.users)]

    def fisher_quadratic(self, d: torch.Tensor) -> float:
        """d^T F d, F = mean over public prompts and completions of grad log pi grad log pi^T."""
        rows = self.env.eval_rows(self.fisher_prompts)
        if not rows:
            raise ConfigError("algo.step=kl needs public prompts for the Fisher estimate (env has none)")
        comp = self.public_completions(rows, greedy=False, stream_round=1)
        pid, pm = self.policy.encode(self.env.prompts(rows))
        phi = per_user_gradients(
            self.policy, lambda sl: self.policy.token_log_probs(pid[sl], pm[sl], comp.ids[sl], comp.mask[sl]).sum(1),
            len(rows), 1)
        return float(((phi @ d) ** 2).mean())

    def step_size(self, d: torch.Tensor) -> float:
        if self.step_rule == "kl":
            return math.sqrt(2 * self.max_kl / max(self.fisher_quadratic(d), 1e-12))
        if self.step_rule == "norm":
            return self.lr / max(float(d.norm()), 1e-12)
        return self.lr

    def train_round(self, round_idx: int) -> dict:
        users = self.sampler.next_round()
        batch = self.collect(round_idx, users)
        w = self.oracle.solve(self.regression_rows(batch), privacy=self.privacy, round=round_idx)
        if not torch.isfinite(w).all():
            raise DataError("the least-squares oracle returned a non-finite w; aborting before the update")
        self.direction = self.momentum * self.direction + w  # released w's only: post-processing
        d = self.direction if self.momentum > 0 else w
        update = self.step_size(d) * d / (1.0 + self.step_decay * round_idx)
        if self.max_step_norm is not None:
            cap = self.max_step_norm / (1.0 + self.step_decay * round_idx)
            update = update * min(1.0, cap / max(float(update.norm()), 1e-300))
        self.policy.add_to_trainable(update)
        return {**self.round_metrics(batch, round_idx), "losses/w_norm": float(w.norm()),
                "losses/update_norm": float(update.norm())}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "direction": self.direction.clone(), "oracle": self.oracle.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.direction = state["direction"].clone()
        self.oracle.load_state_dict(state["oracle"])


class PromptREBEL(PromptNPG):
    """REBEL / DP-REBEL on pairs of a user's completions (module docstring).

    Args:
        eta: REBEL's eta (targets eta (r - r')).
        normalize_rows: divide each pair's (x, y) by max(||x||, 1) (keeps w . x = y; reweights pairs).
        (others as in ``PromptNPG``; ``group_size`` must be even: G/2 pairs per user)
    """

    name = "rebel"
    default_group_size = 2

    def __init__(self, policy, env, privacy, sampler, oracle, logger=None, *, seed: int = 0, rounds: int = 100,
                 users_per_round: int = 10, group_size: int | None = None, reward_bound: float | None = 1.0,
                 eta: float = 1.0, normalize_rows: bool = True, step: str = "fixed", lr: float = 1.0,
                 max_kl: float = 0.01, max_step_norm: float | None = None, momentum: float = 0.0,
                 step_decay: float = 0.0, fisher_episodes: int = 32, **not_applicable):
        super().__init__(policy, env, privacy, sampler, oracle, logger, seed=seed, rounds=rounds,
                         users_per_round=users_per_round, group_size=group_size, reward_bound=reward_bound,
                         step=step, lr=lr, max_kl=max_kl, max_step_norm=max_step_norm,
                         momentum=momentum, step_decay=step_decay, fisher_episodes=fisher_episodes,
                         **not_applicable)
        if self.group_size % 2:
            raise ConfigError(f"REBEL pairs a user's completions: group_size must be even, got {self.group_size}")
        self.eta, self.normalize_rows = float(eta), bool(normalize_rows)

    def regression_rows(self, batch: GroupBatch) -> list:
        """User i's block: G/2 rows (grad log pi(y) - grad log pi(y'), eta (r - r'))."""
        phi = self.sequence_gradients(batch)
        G = self.group_size
        x = phi[0::2] - phi[1::2]                                    # (U*G/2, d), user-major
        y = self.eta * (batch.rewards[:, 0::2] - batch.rewards[:, 1::2]).reshape(-1).double()
        if self.normalize_rows:
            scale = x.norm(dim=1).clamp_min(1.0)
            x, y = x / scale[:, None], y / scale
        h = G // 2
        return [(x[i * h:(i + 1) * h], y[i * h:(i + 1) * h]) for i in range(batch.users)]
