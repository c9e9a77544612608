"""PPO and DP-PPO: one actor-critic learner; DP-PPO is PPO with the round's composed Gaussian sums injected.

One round, read top to bottom in ``update`` (CleanRL's ``ppo.py`` with the user as the unit):

1. Collect (``dppo.algos.core``): m fresh users, each runs G rollouts of the released policy from its own
   start state with actions from its own stream.
2. Advantages, per episode: GAE(gamma, lambda) from the released critic's values and the episode's own
   clipped rewards, delta_t = r_t + gamma V(s_{t+1}) - V(s_t), with V(s_T) = V(final observation) when the
   episode was truncated at the horizon and 0 when it terminated. ``adv_norm`` rescales A over the user's
   own steps only (``scale``: A / rms_u(A); ``standardize``: (A - mean_u) / std_u; ``none``). Value targets
   R_t = A_t + V(s_t) (before the rescaling). No statistic mixes users.
3. ``epochs`` epochs; each partitions the round's users (by position, a public permutation) into
   ``minibatches`` minibatches; for each minibatch b, user u's objectives are means over its own steps,

       J_u(theta) = mean_t [ min(rho_t A_t, clip(rho_t, 1 - clip_range, 1 + clip_range) A_t) + ent_coef H_t ],
       L_u(phi)   = mean_t 1/2 (V_phi(s_t) / c - R_t / c)^2,      rho_t = pi_theta(a_t|s_t) / pi_old(a_t|s_t),

   (c = ``value_scale``, a public constant), and the step releases two sums over b's users,
   sum_u clip_C(grad J_u) and sum_u clip_Cv(grad L_u) (C = ``max_grad_norm``, Cv = ``critic_max_grad_norm``),
   divided by |b|; Adam ascends J and descends L along them.

Per-user gradients come from the per-user-gradient engine (``per_user_grads``, the one call): it
differentiates sum_r w_r f(x_r) per user, and every term above is of that form. The surrogate's gradient is
sum_t w_t grad log pi(a_t|s_t) with w_t = rho_t A_t [not clipped] / n_u (clipped terms have zero gradient);
the entropy's, exactly, sum_a -pi(a|s) log pi(a|s) grad log pi(a|s) (one row per action) for a softmax
policy, and 1/2 [grad log pi(mu + sqrt2 sigma | s) + grad log pi(mu - sqrt2 sigma | s)] = sum_k grad log sigma_k(s)
for a Gaussian one; the critic's, sum_t (R_t - V(s_t)) / c^2 grad V(s_t) / n_u.

Privacy (DP-PPO): user u's two gradients are functions of its own rollouts and of the released policy,
critic and earlier releases of the round only. Each user is in one minibatch per epoch, so it takes part
in k = 2 x epochs releases of its round, and ``dppo.privacy.composed`` calibrates their noise so that the
k releases together are (eps, delta)-DP under replace-one adjacency (exact Gaussian-DP composition; the
sensitivity 2C of each clipped sum is derived there). Rounds take disjoint users: parallel composition.
Everything else (Adam, the learning-rate schedule, the next round's values and ratios) is post-processing.
PPO (``eps=null``) runs the same code with the noiseless clipped sums.
"""
from __future__ import annotations

import copy
import math

import torch

from dppo.algos.core import GroupPolicyOptimizer
from dppo.algos.per_user_grads import per_user_gradients
from dppo.algos.rollout import RolloutEngine
from dppo.data import streams
from dppo.errors import ConfigError, DataError
from dppo.policies.critic import ValueMLP
from dppo.privacy.composed import composed_sums

ADV_NORMS = ("none", "scale", "standardize")
SQRT2 = math.sqrt(2.0)


def per_user_grads(module, obs, actions, weights, user_index, num_users: int) -> torch.Tensor:
    """(num_users, P) per-user gradients of sum_r weights_r module(obs_r, actions_r): the one call into the
    per-user-gradient engine."""
    return per_user_gradients(module, obs, actions, weights, user_index, num_users=num_users)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, bootstrap: torch.Tensor,
        gamma: float, lam: float) -> torch.Tensor:
    """GAE per episode (rows): A_t = sum_k (gamma lam)^k delta_{t+k}; ``bootstrap`` (N,) = V after the last
    step (0 for a terminal state). Zero on padding. (N, T) float64."""
    N, T = rewards.shape
    lengths = mask.sum(1)
    v = values.double() * mask
    nxt = torch.zeros_like(v)
    nxt[:, :-1] = v[:, 1:]
    last = (lengths - 1).clamp_min(0)
    nxt[torch.arange(N), last] = bootstrap.double()
    delta = (rewards.double() + gamma * nxt - v) * mask
    A = torch.zeros_like(delta)
    running = torch.zeros(N, dtype=torch.float64)
    for t in range(T - 1, -1, -1):
        running = delta[:, t] + gamma * lam * running * mask[:, t]
        A[:, t] = running
    return A * mask


def normalize_per_user(A: torch.Tensor, mask: torch.Tensor, users: int, mode: str) -> torch.Tensor:
    """Rescale advantages over each user's own steps (rows are user-major: ``users`` x G rollouts)."""
    if mode == "none":
        return A
    a, m = A.reshape(users, -1), mask.reshape(users, -1).double()
    n = m.sum(1, keepdim=True).clamp_min(1)
    if mode == "standardize":
        mu = (a * m).sum(1, keepdim=True) / n
        a = a - mu
    rms = ((a * m) ** 2).sum(1, keepdim=True).div(n).sqrt()
    return (a / (rms + 1e-8) * m).reshape_as(A)


class PPO(GroupPolicyOptimizer):
    """PPO over users; private (DP-PPO, each round (eps, delta)-DP) iff ``eps`` is set (module docstring).

    Args:
        policy, env, privacy, sampler: injected by the builder.
        max_grad_norm: per-user clip C of the actor's gradient (top-level key).
        group_size: G rollouts per user (top-level ``group_size``).
        gamma, gae_lambda: discount and GAE's lambda.
        epochs, minibatches: passes over the round's users and minibatches per pass.
        clip_range: PPO's ratio clip.
        ent_coef: entropy bonus coefficient.
        lr, critic_lr: Adam's step sizes (critic_lr null: lr); anneal_lr: both decay linearly to 0 over
            the rounds (a public schedule).
        adam_eps: Adam's epsilon.
        critic_max_grad_norm: per-user clip Cv of the critic's gradient (null: C).
        critic_hidden_sizes, critic_activation: the critic MLP (``dppo.policies.critic``).
        value_scale: c, the critic predicts V / c (``auto``: reward_bound / (1 - gamma), or 1 without a
            reward bound; a number: that constant).
        adv_norm: ``none`` | ``scale`` | ``standardize`` (over the user's own steps).
        action_noise_corr: rho of temporally correlated exploration: a user's sampling uniforms are
            Phi(z_t) with z an AR(1) process of correlation rho (each u_t still exactly U(0, 1), so each
            action is marginally pi(.|s_t); 0: independent uniforms), drawn from the user's own stream.
        user_horizon: cut each user's episodes after this many steps (null: the env's horizon); the cut
            episodes are bootstrapped from the critic like any truncated one, evaluation keeps the full
            horizon. Fewer users' env steps per user, more users per env step.
        optimizer, momentum: ``adam`` (default) or ``sgd`` (with ``momentum``) on the released means.
        composition: ``gdp`` (exact) or ``rdp``: how the round's releases are composed
            (``dppo.privacy.composed``).
    """

    name = "ppo"

    def __init__(self, policy, env, privacy, sampler, *, seed: int = 0, rounds: int = 100,
                 max_grad_norm: float = 1.0, reward_bound: float | None = 1.0, group_size: int = 1,
                 gamma: float = 0.99, gae_lambda: float = 0.95, epochs: int = 4, minibatches: int = 1,
                 clip_range: float = 0.2, ent_coef: float = 0.0, lr: float = 3e-4, critic_lr: float | None = None,
                 anneal_lr: bool = False, adam_eps: float = 1e-5, critic_max_grad_norm: float | None = None,
                 critic_hidden_sizes=(64, 64), critic_activation: str = "tanh", value_scale="auto",
                 adv_norm: str = "scale", action_noise_corr: float = 0.0, user_horizon: int | None = None,
                 optimizer: str = "adam", momentum: float = 0.9, composition: str = "gdp"):
        super().__init__(policy, env, privacy, sampler, seed=seed, rounds=rounds, reward_bound=reward_bound,
                         group_size=group_size, advantage="to_go", gamma=gamma)  # (PPO's advantages: GAE below)
        if adv_norm not in ADV_NORMS:
            raise ConfigError(f"algo.adv_norm must be one of {ADV_NORMS}, got '{adv_norm}'")
        if int(epochs) < 1 or int(minibatches) < 1:
            raise ConfigError(f"algo.epochs and algo.minibatches must be >= 1, got {epochs}, {minibatches}")
        if not 0 <= action_noise_corr < 1:
            raise ConfigError(f"algo.action_noise_corr must lie in [0, 1), got {action_noise_corr}")
        if not 0 < clip_range < 1 or not 0 <= gae_lambda <= 1 or not 0 < gamma <= 1:
            raise ConfigError("algo.clip_range must lie in (0, 1), algo.gae_lambda in [0, 1], algo.gamma in (0, 1]")
        for key, c in (("max_grad_norm", max_grad_norm), ("algo.critic_max_grad_norm", critic_max_grad_norm)):
            if c is not None and not c > 0:
                raise ConfigError(f"{key} must be > 0, got {c}")
        if ent_coef < 0 or lr <= 0 or (critic_lr is not None and critic_lr <= 0):
            raise ConfigError("algo.ent_coef must be >= 0 and algo.lr, algo.critic_lr > 0")
        if ent_coef > 0 and not hasattr(policy, "mean_and_log_std" if getattr(policy, "continuous", False)
                                        else "logits"):
            raise ConfigError("algo.ent_coef > 0 needs the policy's distribution: logits(obs) (Discrete) or "
                              "mean_and_log_std(obs) (Gaussian); set algo.ent_coef=0")
        if users_per_round := getattr(sampler, "users_per_round", None):
            if int(minibatches) > int(users_per_round):
                raise ConfigError(f"algo.minibatches={minibatches} exceeds users_per_round={users_per_round}: "
                                  f"every minibatch needs at least one user")
        self.gae_lambda, self.epochs, self.minibatches = float(gae_lambda), int(epochs), int(minibatches)
        self.clip_range, self.ent_coef, self.adv_norm = float(clip_range), float(ent_coef), adv_norm
        self.clip, self.critic_clip = float(max_grad_norm), float(critic_max_grad_norm or max_grad_norm)
        self.action_noise_corr, self._ar1 = float(action_noise_corr), None
        if value_scale == "auto":
            value_scale = reward_bound / (1.0 - gamma) if reward_bound is not None and gamma < 1 else 1.0
        self.value_scale = float(value_scale)
        if not self.value_scale > 0:
            raise ConfigError(f"algo.value_scale must be > 0 or auto, got {value_scale}")
        self.critic = ValueMLP(env.observation_space, critic_hidden_sizes, critic_activation)
        self.critic_params = list(self.critic.parameters())
        self.lr, self.critic_lr, self.anneal_lr = float(lr), float(critic_lr or lr), bool(anneal_lr)
        groups = [{"params": self.params, "lr": self.lr}, {"params": self.critic_params, "lr": self.critic_lr}]
        if optimizer == "adam":
            self.optimizer = torch.optim.Adam(groups, eps=adam_eps)
        elif optimizer == "sgd":
            self.optimizer = torch.optim.SGD(groups, momentum=momentum)
        else:
            raise ConfigError(f"algo.optimizer must be 'adam' or 'sgd', got '{optimizer}'")
        self.user_env = None
        if user_horizon is not None and int(user_horizon) < int(env.horizon):
            if int(user_horizon) < 1 or not hasattr(env, "make"):
                raise ConfigError(f"algo.user_horizon must be >= 1 and needs a gym env factory, got {user_horizon}")
            self.user_env = copy.copy(env)
            self.user_env.horizon = int(user_horizon)
            self.user_rollouts = RolloutEngine(self.user_env)
        # each user: one minibatch per epoch, two sums (actor, critic) per minibatch step
        self.release = composed_sums(privacy, releases_per_user=2 * self.epochs, composition=composition)

    # ---- one round ------------------------------------------------------------------------------
    def update(self, batch, round_idx: int) -> dict:
        users, m = self.round_users, batch.users
        t = self.round_targets(batch)
        self.set_lr(round_idx)
        self.release.open_round(round_idx, users, (self.clip, self.critic_clip))
        sums = {"diag/clip_fraction": 0.0, "diag/critic_clip_fraction": 0.0, "diag/ratio_clip_fraction": 0.0}
        steps = 0
        for epoch in self.schedule(round_idx, m):
            for mb in epoch:
                g_actor, g_critic, ratio_frac = self.minibatch_gradients(t, mb)
                ids = [users[int(i)] for i in mb]
                d_actor, s_a = self.release.release_sum(g_actor, ids, self.clip)
                d_critic, s_c = self.release.release_sum(g_critic, ids, self.critic_clip)
                self.step(d_actor / len(mb), d_critic / len(mb))
                sums["diag/clip_fraction"] += s_a["diag/clip_fraction"]
                sums["diag/critic_clip_fraction"] += s_c["diag/clip_fraction"]
                sums["diag/ratio_clip_fraction"] += ratio_frac
                steps += 1
        mask = batch.mask
        return {**{k: v / steps for k, v in sums.items()},
                "losses/actor_update_norm": float(d_actor.norm() / len(mb)),
                "losses/critic_update_norm": float(d_critic.norm() / len(mb)),
                "privacy/noise_multiplier": self.release.noise_multiplier,
                "diag/value_error": float(((t["returns"] - t["values"]) ** 2 * mask).sum() / mask.sum()),
                "diag/advantage_rms": float((t["A"] ** 2 * mask).sum().div(mask.sum()).sqrt())}

    def schedule(self, round_idx: int, m: int) -> list[list[torch.Tensor]]:
        """The round's minibatches: per epoch, a public random partition of the positions 0..m-1 into
        ``minibatches`` parts (sizes differ by at most one), each sorted (public: data-independent)."""
        gen = streams.public_generator(self.seed, "minibatch", round_idx)
        return [[mb.sort().values for mb in torch.tensor_split(torch.randperm(m, generator=gen), self.minibatches)]
                for _ in range(self.epochs)]

    @torch.no_grad()
    def round_targets(self, batch) -> dict:
        """What the round's minibatch steps need, from the users' own episodes and the released policy and
        critic at the start of the round: advantages A, value targets R, old log-probabilities, n_u."""
        obs, actions, mask = batch.obs, batch.actions, batch.mask
        values = self.value_scale * self.critic.value(obs.flatten(0, 1)).reshape(mask.shape).double()
        final_v = self.value_scale * self.critic.value(batch.final_obs).double()
        logp_old = self.policy.log_prob(obs.flatten(0, 1), actions.flatten(0, 1)).reshape(mask.shape).double()
        A = gae(batch.rewards, values, mask, torch.where(batch.terminated, 0.0, final_v), self.gamma, self.gae_lambda)
        returns = (A + values) * mask
        return {"obs": obs, "actions": actions, "mask": mask, "values": values, "returns": returns,
                "A": normalize_per_user(A, mask, batch.users, self.adv_norm), "logp_old": logp_old,
                "steps_per_user": batch.grouped(batch.lengths).sum(1).double().clamp_min(1),  # n_u: means
                "group_size": batch.group_size}

    def minibatch_gradients(self, t: dict, mb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Per-user (actor, critic) gradients of the users at positions ``mb`` at the current parameters, and
        the fraction of their steps whose ratio is clipped."""
        G = t["group_size"]
        rows = (mb[:, None] * G + torch.arange(G)).reshape(-1)  # their episodes
        n_u = t["steps_per_user"][mb]
        g_actor, frac = self.actor_gradients(t["obs"][rows], t["actions"][rows], t["mask"][rows], t["A"][rows],
                                             t["logp_old"][rows], n_u, G)
        g_critic = self.critic_gradients(t["obs"][rows], t["mask"][rows], t["returns"][rows], n_u, G)
        return g_actor, g_critic, frac

    def actor_gradients(self, obs, actions, mask, A, logp_old, n_u, G) -> tuple[torch.Tensor, float]:
        """(b, P) per-user gradients of J_u (module docstring), and the fraction of steps whose ratio is clipped."""
        b = len(n_u)
        keep = mask.reshape(-1)
        o, a = obs.flatten(0, 1)[keep], actions.flatten(0, 1)[keep]
        user = torch.arange(b).repeat_interleave(G * mask.shape[1])[keep]
        scale = 1.0 / n_u[user]
        with torch.no_grad():
            ratio = torch.exp(self.policy.log_prob(o, a).double() - logp_old.reshape(-1)[keep])
        adv = A.reshape(-1)[keep]
        clipped = ((adv > 0) & (ratio > 1 + self.clip_range)) | ((adv < 0) & (ratio < 1 - self.clip_range))
        w = torch.where(clipped, 0.0, ratio * adv) * scale
        if self.ent_coef > 0:
            eo, ea, ew, eu = self.entropy_rows(o, user, scale)
            o, a, w, user = torch.cat([o, eo]), torch.cat([a, ea]), torch.cat([w, ew]), torch.cat([user, eu])
            order = torch.argsort(user, stable=True)  # rows grouped by user
            o, a, w, user = o[order], a[order], w[order], user[order]
        g = per_user_grads(self.policy, o, a, w, user, b)
        if not torch.isfinite(g).all():
            raise DataError("the PPO actor gradient became NaN/inf; aborting before the release")
        return g, float(clipped.double().mean())

    @torch.no_grad()
    def entropy_rows(self, obs, user, scale):
        """Rows (obs, action, weight, user) whose weighted score sum is ent_coef grad sum_t H(pi(.|s_t)) / n_u."""
        if getattr(self.policy, "continuous", False):
            mu, log_std = self.policy.mean_and_log_std(obs)
            off = SQRT2 * torch.exp(log_std)
            acts = torch.cat([mu + off, mu - off])
            w = (0.5 * self.ent_coef * scale).repeat(2)
            return torch.cat([obs, obs]), acts, w, user.repeat(2)
        logp = torch.log_softmax(self.policy.logits(obs).double(), -1)
        k = logp.shape[-1]
        acts = torch.arange(k).repeat(obs.shape[0])
        w = (-(logp.exp() * logp) * self.ent_coef * scale[:, None]).reshape(-1)
        return obs.repeat_interleave(k, 0), acts, w, user.repeat_interleave(k)

    def critic_gradients(self, obs, mask, returns, n_u, G) -> torch.Tensor:
        """(b, P_critic) per-user gradients of -L_u (ascent direction)."""
        b = len(n_u)
        keep = mask.reshape(-1)
        o = obs.flatten(0, 1)[keep]
        user = torch.arange(b).repeat_interleave(G * mask.shape[1])[keep]
        c = self.value_scale
        with torch.no_grad():
            v = self.critic.value(o).double()
        w = (returns.reshape(-1)[keep] / c - v) / n_u[user]
        g = per_user_grads(self.critic, o, torch.zeros(len(o)), w, user, b)
        if not torch.isfinite(g).all():
            raise DataError("the PPO critic gradient became NaN/inf; aborting before the release")
        return g

    def step(self, d_actor: torch.Tensor, d_critic: torch.Tensor) -> None:
        """One Adam step: ascent on J along ``d_actor``, descent on L along -``d_critic`` (released means)."""
        for params, d in ((self.params, d_actor), (self.critic_params, d_critic)):
            lo = 0
            for p in params:
                n = p.numel()
                p.grad = -d[lo:lo + n].reshape(p.shape).to(p.dtype)
                lo += n
        self.optimizer.step()

    def set_lr(self, round_idx: int) -> None:
        frac = 1.0 - round_idx / self.num_rounds if self.anneal_lr else 1.0
        for group, lr in zip(self.optimizer.param_groups, (self.lr, self.critic_lr)):
            group["lr"] = lr * frac

    def action_uniforms(self, generator: torch.Generator, shape: tuple) -> torch.Tensor:
        """A user's uniforms (G, horizon, ...): iid, or Phi of an AR(1) process along the horizon
        (``action_noise_corr``), z_0 = e_0, z_t = rho z_{t-1} + sqrt(1 - rho^2) e_t, e iid N(0, 1) from the
        user's own generator (so z_t ~ N(0, 1) and u_t ~ U(0, 1) at every t)."""
        rho = self.action_noise_corr
        if rho == 0.0:
            return super().action_uniforms(generator, shape)
        e = torch.randn(shape, generator=generator, dtype=torch.float64)
        H = shape[1]
        if self._ar1 is None or self._ar1.shape[0] != H:
            t = torch.arange(H, dtype=torch.float64)
            lag = (t[:, None] - t[None, :]).clamp_min(0)
            L = torch.where(t[:, None] >= t[None, :], rho ** lag, 0.0) * math.sqrt(1 - rho * rho)
            L[:, 0] = rho ** t     # z_t = rho^t e_0 + sqrt(1 - rho^2) sum_{1<=k<=t} rho^(t-k) e_k
            self._ar1 = L
        z = torch.einsum("tk,gk...->gt...", self._ar1, e)
        return torch.special.ndtr(z).clamp(1e-12, 1 - 1e-12)

    def collect(self, users, round_idx: int):
        """The users' episodes (``dppo.algos.core``), cut at ``user_horizon`` when it is set."""
        self.round_users = [int(u) for u in users]
        if self.user_env is None:
            return super().collect(users, round_idx)
        full = self.env, self.rollouts
        self.env, self.rollouts = self.user_env, self.user_rollouts
        try:
            return super().collect(users, round_idx)
        finally:
            self.env, self.rollouts = full

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])
