"""PPO and DP-PPO: one actor-critic learner; DP-PPO is PPO with the round's composed Gaussian sums injected.

One round, read top to bottom in ``update`` (CleanRL's ``ppo.py`` with the user as the unit):

1. Collect (the env's collector, ``dppo.envs.rollout.EpisodeCollector``): m fresh users, each runs G rollouts
   of the released policy from its own start state with actions from its own stream (optionally cut at
   ``user_horizon``, with AR(1)-correlated sampling uniforms).
2. Advantages, per episode: GAE(gamma, lambda) from the released critic's values and the episode's own
   clipped rewards (plus, with ``explore_bonus``, its per-step state-range bonus: ``dppo.algos.core``), delta_t = r_t + gamma V(s_{t+1}) - V(s_t), with V(s_T) = V(final observation) when the
   episode was truncated at the horizon and 0 when it terminated. ``adv_norm`` rescales A over the user's
   own steps only (``scale``: A / rms_u(A); ``standardize``: (A - mean_u) / std_u; ``none``). Value targets
   R_t = A_t + V(s_t) (before the rescaling). No statistic mixes users.
3. ``epochs`` epochs; each partitions the round's users into ``minibatches`` minibatches (``schedule``: one-pass,
   by position, a public permutation; multi-pass, each user's minibatch a public draw keyed by the seed, round,
   epoch and its population index only); for each minibatch b, user u's objectives are means over its own steps,

       J_u(theta) = mean_t [ min(rho_t A_t, clip(rho_t, 1 - clip_range, 1 + clip_range) A_t) + ent_coef H_t ],
       L_u(phi)   = mean_t 1/2 (V_phi(s_t) / c - R_t / c)^2,      rho_t = pi_theta(a_t|s_t) / pi_old(a_t|s_t),

   (c = ``value_scale``, a public constant), and the step releases two sums over b's users,
   sum_u clip_C(grad J_u) and sum_u clip_Cv(grad L_u) (C = ``max_grad_norm``, Cv = ``critic_max_grad_norm``),
   divided by |b| (multi-pass: by the public expected size q N / minibatches, never the realised one); Adam
   ascends J (the space's ``ascend``) and descends L along them.

Per-user gradients come from the one per-user-gradient engine (``dppo.policies.per_user_grads``: the actor's
through its parameter space's ``gradients``, the critic's directly): it differentiates sum_r w_r f(x_r) per
user, and every term above is of that form. A minibatch whose (b, P) rows would exceed ``PER_USER_MEMORY`` forms
each clipped sum by the engine's fused path (``fused``: the users' norms and the sum of their clipped gradients,
never the rows; the space's ``clipped_rows_sum`` for the actor) with the release's clipping factors, unless the
actor's space is projected (under torchrun each rank so forms its own users' sum); a smaller one materialises the
rows (cheaper for small networks), clipped by the release. The two are equal to float32 rounding. The surrogate's
gradient is sum_t w_t grad log pi(a_t|s_t) with w_t = rho_t A_t [not clipped] / n_u (clipped terms have zero gradient);
the entropy's, exactly, sum_a -pi(a|s) log pi(a|s) grad log pi(a|s) (one row per action) for a softmax
policy, and 1/2 [grad log pi(mu + sqrt2 sigma | s) + grad log pi(mu - sqrt2 sigma | s)] = sum_k grad log sigma_k(s)
for a Gaussian one; the critic's, sum_t (R_t - V(s_t)) / c^2 grad V(s_t) / n_u.

Privacy (DP-PPO): user u's two gradients are functions of its own rollouts and of the released policy,
critic and earlier releases of the round only. Each user is in one minibatch per epoch, so it takes part
in k = 2 x epochs releases of its round (``epochs`` actor sums, ``epochs`` critic sums, the two parts
splitting the budget by ``actor_share``), and ``dppo.privacy.composed`` calibrates their noise so that the
k releases together are (eps, delta)-DP under replace-one adjacency (exact Gaussian-DP composition; the
sensitivity 2C of each clipped sum is derived there). Rounds take disjoint users: parallel composition.
Multi-pass (``privacy.multi_pass``): Poisson-sampled users, add/remove adjacency; each user's minibatch of an
epoch is fixed in advance by public randomness of its own (``schedule``), so a user still affects exactly its
k releases and nobody else's minibatch, and the round is the one subsampled Gaussian that
``dppo.privacy.composed``' ``Poisson`` sampling accounts for any ``minibatches`` (derived there).
Everything else (Adam, the learning-rate schedule, the next round's values and ratios) is post-processing.
PPO (``eps=null``) runs the same code with the noiseless clipped sums.
"""
from __future__ import annotations

import math

import torch

from dppo.algos.core import GroupPolicyOptimizer
from dppo.algos.dp_adam import AdamBC
from dppo.data import streams
from dppo.envs.rollout import EpisodeCollector
from dppo.errors import ConfigError
from dppo.policies.base import pad_rows
from dppo.policies.critic import ValueMLP
from dppo.policies.per_user_grads import clipped_gradient_sum, per_user_gradients
from dppo.policies.spaces import finite_or_fail, make_space
from dppo.privacy.composed import composed_sums

ADV_NORMS = ("none", "scale", "standardize")
OPTIMIZERS = ("adam", "sgd", "adam_bc")
INPUT_ELEMENTS = 2 ** 23   # network-input entries per forward over a round's steps (more: in slices)
PER_USER_MEMORY = 64 * 2 ** 20   # bytes of per-user gradient rows at once (a minibatch beyond it runs in blocks)
SQRT2 = math.sqrt(2.0)


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

    Every default below is the one home of that hyper-parameter (``conf/algo/dp_ppo.yaml`` names only the
    target; ``conf/experiment/<env>_{ppo,dp_ppo}.yaml`` hold the tuned differences).

    Args:
        policy, env, privacy, sampler, logger: injected by the builder.
        space: the policy's parameter space (``dppo.policies.spaces``); PPO's default is every trainable
            parameter (``policy.subspace=full``, ``policy.dim=null``); ``policy.dim=k`` restricts the actor to a
            fixed random k-dim subspace. The closed-form head (``subspace=head``) has no surrogate gradient.
        seed, rounds, group_size, reward_bound: top-level keys (G rollouts per user, rewards clipped).
        max_grad_norm: per-user clip C of the actor's gradient (top-level key).
        gamma, gae_lambda: discount and GAE's lambda.
        epochs, minibatches: passes over the round's users and minibatches of users per pass (multi-pass: each
            user's minibatch a public per-user draw, ``schedule``).
        clip_range: PPO's ratio clip.
        ent_coef: entropy bonus coefficient.
        lr, critic_lr: step sizes (critic_lr null: lr); anneal_lr: both decay linearly to 0 over the rounds
            (a public schedule).
        adam_eps: Adam's epsilon (optimizer=adam).
        critic_max_grad_norm: per-user clip Cv of the critic's gradient (null: C).
        critic_hidden_sizes, critic_activation: the critic MLP (``dppo.policies.critic``).
        value_scale: c, the critic predicts V / c (``auto``: reward_bound / (1 - gamma), or 1 without a
            reward bound; a number: that constant).
        adv_norm: ``none`` | ``scale`` | ``standardize`` (over the user's own steps).
        action_noise_corr: rho of temporally correlated exploration (``EpisodeCollector``: a user's sampling
            uniforms are Phi of an AR(1) process of its own stream; each action still marginally pi(.|s_t)).
        user_horizon: cut each user's episodes after this many steps (null: the env's horizon); the cut
            episodes are bootstrapped from the critic like any truncated one, evaluation keeps the full
            horizon. Fewer env steps per user, more users per env step.
        optimizer, momentum: ``adam``, ``sgd`` (with ``momentum``) or ``adam_bc`` (Adam with the release's public
            noise variance (sigma / |b|)^2 taken out of its second moment, ``dppo.algos.dp_adam``) on the
            released means.
        accountant: ``gdp`` (exact) or ``rdp``: how the round's releases are composed
            (``dppo.privacy.composed``); ``composition`` is its deprecated name (the builder says so in one line).
        actor_share: the actor's share of the round's privacy budget (in mu^2 under Gaussian DP, the same
            (eps, delta) in all): its ``epochs`` releases get multiplier z sqrt(1 / (2 actor_share)), the
            critic's z sqrt(1 / (2 (1 - actor_share))) (z: the equal multiplier of 2 x epochs releases);
            0.5: equal noise.
        average_last: the final policy is the mean of the actor's parameters after the last k rounds (tail
            averaging of released iterates: post-processing; 0: the last iterate).
        init_critic: injected by the builder when ``policy.init_from`` names an actor-critic run (its
            ``policy.pt`` or checkpoint): the critic starts from that run's critic (public, or released by it).
        explore_bonus: c of the state-range bonus, spread over the steps as rewards (``dppo.algos.core``:
            ``range_bonus_steps``, a function of the episode's own states and the public observation bounds;
            0: off). Value targets and GAE see it; evaluation returns do not.
        critic_normalize_obs: the critic sees observations scaled onto [-1, 1] by the public bounds (as
            ``policy.normalize_obs`` does for the actor).
        fused: form each clipped sum without the users' gradient rows (the engine's fused path) where the
            actor's space allows: null (by size) when a minibatch's rows would exceed
            ``PER_USER_MEMORY`` (for small networks the rows are cheaper: on CPU the fused update of the
            114-parameter CartPole actor and its critic takes about 5x the time), true always, false never (module
            docstring; the two paths give the same sums to float32 rounding).
    """

    names = ("ppo", "dp_ppo")
    needs = (*GroupPolicyOptimizer.needs, "max_grad_norm", "init_critic")
    space_defaults = {"subspace": "full", "dim": None}   # the builder's space for PPO unless policy.* says otherwise
    APPLIES = {"momentum": ("optimizer", ("sgd",)), "adam_eps": ("optimizer", ("adam", "adam_bc"))}

    @classmethod
    def check_env(cls, env) -> None:
        if getattr(env, "kind", None) == "prompts" or not hasattr(env, "observation_space"):
            raise ConfigError("algo=ppo|dp_ppo learns from episodes of a gymnasium env (env=cartpole, env=pendulum, "
                              "env.id=...); use algo=pg|dp_pg for prompts and algo=ubev|dp_ubev for tabular MDPs")

    @classmethod
    def releases_gaussian_sums(cls, cfg) -> bool:
        """Its releases are rounds of ``dppo.privacy.composed``'s release (correlated noise applies)."""
        return True

    def __init__(self, policy, env, privacy, sampler, *, space=None, logger=None, seed: int, rounds: int,
                 group_size: int, reward_bound: float | None, max_grad_norm: float, gamma: float = 0.99,
                 gae_lambda: float = 0.95, epochs: int = 4, minibatches: int = 1, clip_range: float = 0.2,
                 ent_coef: float = 0.0, lr: float = 0.01, critic_lr: float | None = None, anneal_lr: bool = False,
                 adam_eps: float = 1e-5, critic_max_grad_norm: float | None = None, critic_hidden_sizes=(16,),
                 critic_activation: str = "tanh", value_scale="auto", adv_norm: str = "scale",
                 action_noise_corr: float = 0.0, user_horizon: int | None = None, optimizer: str = "adam",
                 momentum: float = 0.9, accountant: str = "gdp", explore_bonus: float = 0.0,
                 critic_normalize_obs: bool = False, actor_share: float = 0.5, average_last: int = 0,
                 init_critic: dict | None = None, composition: str | None = None, fused: bool | None = None):
        self.check_env(env)
        if composition is not None:   # the deprecated name of accountant
            if accountant not in ("gdp", composition):
                raise ConfigError(f"algo.accountant={accountant} and the deprecated algo.composition={composition} "
                                  f"disagree; set algo.accountant only")
            accountant = composition
        if space is None:
            space = make_space(policy, **self.space_defaults, seed=seed)
        if space.kind == "head":
            raise ConfigError("algo=ppo differentiates a clipped surrogate, which policy.subspace=head (closed-form "
                              "scores only) cannot; use policy.subspace=full")
        if not 0 <= action_noise_corr < 1:
            raise ConfigError(f"algo.action_noise_corr must lie in [0, 1), got {action_noise_corr}")
        if user_horizon is not None and int(user_horizon) < 1:
            raise ConfigError(f"algo.user_horizon must be >= 1 or null, got {user_horizon}")
        # the env side: users' episodes cut at user_horizon, AR(1) sampling uniforms (both per user)
        collector = EpisodeCollector(env, seed, user_horizon=user_horizon, action_noise_corr=action_noise_corr)
        super().__init__(policy, env, privacy, sampler, space=space, logger=logger, seed=seed, rounds=rounds,
                         reward_bound=reward_bound, group_size=group_size, advantage="to_go", gamma=gamma,
                         explore_bonus=explore_bonus, average_last=average_last, collector=collector)
        if adv_norm not in ADV_NORMS:
            raise ConfigError(f"algo.adv_norm must be one of {ADV_NORMS}, got '{adv_norm}'")
        if int(epochs) < 1 or int(minibatches) < 1:
            raise ConfigError(f"algo.epochs and algo.minibatches must be >= 1, got {epochs}, {minibatches}")
        if not 0 < clip_range < 1 or not 0 <= gae_lambda <= 1 or not 0 < gamma <= 1:
            raise ConfigError("algo.clip_range must lie in (0, 1), algo.gae_lambda in [0, 1], algo.gamma in (0, 1]")
        for key, c in (("max_grad_norm", max_grad_norm), ("algo.critic_max_grad_norm", critic_max_grad_norm)):
            if key == "max_grad_norm" and c is None or c is not None and not c > 0:
                raise ConfigError(f"{key} must be > 0, got {c}")
        if ent_coef < 0 or lr <= 0 or (critic_lr is not None and critic_lr <= 0):
            raise ConfigError("algo.ent_coef must be >= 0 and algo.lr, algo.critic_lr > 0")
        if ent_coef > 0 and not hasattr(policy, "mean_and_log_std" if getattr(policy, "continuous", False)
                                        else "logits"):
            raise ConfigError("algo.ent_coef > 0 needs the policy's distribution: logits(obs) (Discrete) or "
                              "mean_and_log_std(obs) (Gaussian); set algo.ent_coef=0")
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"algo.optimizer must be one of {OPTIMIZERS}, got '{optimizer}'")
        if int(minibatches) > sampler.users_per_round:
            raise ConfigError(f"algo.minibatches={minibatches} exceeds users_per_round={sampler.users_per_round}: "
                              f"every minibatch needs at least one user")
        self.gae_lambda, self.epochs, self.minibatches = float(gae_lambda), int(epochs), int(minibatches)
        if fused not in (None, True, False):
            raise ConfigError(f"algo.fused must be true, false or null (by size), got {fused!r}")
        self.fused = fused
        self.clip_range, self.ent_coef, self.adv_norm = float(clip_range), float(ent_coef), adv_norm
        self.clip, self.critic_clip = float(max_grad_norm), float(critic_max_grad_norm or max_grad_norm)
        if value_scale == "auto":
            value_scale = reward_bound / (1.0 - gamma) if reward_bound is not None and gamma < 1 else 1.0
        self.value_scale = float(value_scale)
        if not self.value_scale > 0:
            raise ConfigError(f"algo.value_scale must be > 0 or auto, got {value_scale}")
        self.critic = ValueMLP(env.observation_space, critic_hidden_sizes, critic_activation,
                               normalize_obs=critic_normalize_obs)
        if init_critic is not None:
            try:
                self.critic.load_state_dict(init_critic)
            except (RuntimeError, KeyError) as err:
                raise ConfigError(f"policy.init_from's critic does not fit this critic (algo.critic_hidden_sizes, "
                                  f"algo.critic_activation, algo.critic_normalize_obs): {str(err).splitlines()[0]}") from None
        self.critic_params = list(self.critic.parameters())
        self.lr, self.critic_lr, self.anneal_lr = float(lr), float(critic_lr or lr), bool(anneal_lr)
        # Adam (or SGD) per parameter: one optimizer for the actor's space, one for the critic
        make = {"adam": lambda params, lr: torch.optim.Adam(params, lr=lr, eps=adam_eps),
                "adam_bc": lambda params, lr: AdamBC(params, lr=lr, eps=adam_eps),
                "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=momentum)}[optimizer]
        self.optimizer, self.critic_optimizer = make(self.space.params, self.lr), make(self.critic_params,
                                                                                         self.critic_lr)
        # each user: one minibatch per epoch, two sums (actor, critic) per minibatch step
        if not 0 < actor_share < 1:
            raise ConfigError(f"algo.actor_share must lie in (0, 1) (the actor's share of the round's budget), "
                              f"got {actor_share}")
        self.release = composed_sums(privacy, composition=accountant, parts={
            "actor": (self.epochs, float(actor_share)), "critic": (self.epochs, 1.0 - float(actor_share))},
            sampler=sampler, rounds=self.num_rounds)

    # ---- one round ------------------------------------------------------------------------------
    def update(self, batch, round_idx: int, users: list[int]) -> dict:
        """One round (module docstring) on ``batch``, the groups of ``users`` (ids, in the batch's order)."""
        m = 0 if batch is None else batch.users   # None: a Poisson round drew nobody (its sums are noise only)
        if len(users) != m:
            raise ValueError(f"PPO.update: {len(users)} user ids for a batch of {m} users")
        t = None if batch is None else self.round_targets(batch)
        self.set_lr(round_idx)
        # the round's users and where ours start among them (multi-process: every rank's; one process: ours, 0)
        everyone, lo = self.release.round_users(users)
        self.release.open_round(round_idx, everyone, (self.clip, self.critic_clip))
        sums = {"diag/clip_fraction": 0.0, "diag/critic_clip_fraction": 0.0, "diag/ratio_clip_fraction": 0.0}
        steps = 0
        for epoch in self.schedule(round_idx, everyone):
            for mb in epoch:
                ours = mb[(mb >= lo) & (mb < lo + m)] - lo   # the minibatch's users in this batch
                ids = [users[int(i)] for i in ours]
                d_actor, d_critic, diag = self.release_minibatch(t, ours, ids)
                n = self.release.batch_size(len(mb), self.minibatches)   # the count, or multi-pass: q N / b
                self.step(d_actor / n, d_critic / n, n)
                for k, v in diag.items():
                    sums[k] += v
                steps += 1
        self.average_tail(round_idx)
        stats = {**{k: v / steps for k, v in sums.items()},
                 "losses/actor_update_norm": float(d_actor.norm() / n),
                 "losses/critic_update_norm": float(d_critic.norm() / n),
                 "privacy/noise_multiplier": self.release.noise_multiplier,
                 "privacy/actor_noise_multiplier": self.release.multipliers.get("actor", 0.0),
                 "privacy/critic_noise_multiplier": self.release.multipliers.get("critic", 0.0)}
        if t is not None:
            mask = t["mask"]
            stats["diag/value_error"] = float(((t["returns"] - t["values"]) ** 2 * mask).sum() / mask.sum())
            stats["diag/advantage_rms"] = float((t["A"] ** 2 * mask).sum().div(mask.sum()).sqrt())
        return stats

    def schedule(self, round_idx: int, users: list[int]) -> list[list[torch.Tensor]]:
        """The round's minibatches of the round's ``users`` (ids, every rank's): per epoch, ``minibatches`` sorted
        tensors of positions in ``users``, each user in exactly one (public: data-independent).

        One-pass (replace-one: the round's size is public): a public random partition of the positions into parts
        whose sizes differ by at most one. Multi-pass (Poisson, add/remove): user u's minibatch in epoch e is
        drawn uniformly from public randomness keyed by (run seed, round, e, u's population index) only
        (``streams.user_minibatches``), so adding or removing one user moves no other user; a minibatch may be
        empty (its sums are noise only) and every mean divides by q N / b. Why the round's guarantee is that of
        b = 1 (derived in ``ComposedGaussianSums`` with ``Poisson`` sampling): u is in exactly one minibatch per epoch, fixed in advance by
        public randomness, so its presence affects the same k = 2 x epochs releases, all under its one inclusion
        event (probability q); every other release, given the history, sums the same users and divides by the
        same public q N / b with or without u, so the round is the same k-fold composed subsampled Gaussian."""
        b = self.minibatches
        if self.privacy.multi_pass:
            out = []
            for e in range(self.epochs):
                draws = streams.user_minibatches(self.seed, round_idx, e, users, b)
                out.append([torch.nonzero(draws == j).reshape(-1) for j in range(b)])
            return out
        gen = streams.public_generator(self.seed, "minibatch", round_idx)
        return [[mb.sort().values for mb in torch.tensor_split(torch.randperm(len(users), generator=gen), b)]
                for _ in range(self.epochs)]

    @torch.no_grad()
    def round_targets(self, batch) -> dict:
        """What the round's minibatch steps need, from the users' own episodes and the released policy and
        critic at the start of the round: advantages A, value targets R, old log-probabilities, n_u."""
        obs, actions, mask = batch.obs, batch.actions, batch.mask
        width = max(1, getattr(getattr(self.policy, "obs_layout", None), "feature_dim", 1) or 1)
        step = max(4096, INPUT_ELEMENTS // width)   # rows per call: a one-hot input (716 wide) in slices
        flat_obs, flat_act = obs.flatten(0, 1), actions.flatten(0, 1)
        # the critic's values over the padded rows as they are (a width-1 output layer rounds by batch shape); the
        # policy's log-probabilities over the steps taken only (its rows are batch-invariant from MIN_ROWS rows),
        # zero on the padding, which every use leaves out (``actor_rows`` reads the mask's rows)
        values = self.value_scale * torch.cat([self.critic.value(flat_obs[lo:lo + step])
                                               for lo in range(0, flat_obs.shape[0], step)]).reshape(mask.shape).double()
        final_v = self.value_scale * self.critic.value(batch.final_obs).double()
        keep = mask.reshape(-1)
        taken_obs, taken_act = pad_rows(flat_obs[keep]), pad_rows(flat_act[keep])
        n = int(keep.sum())
        logp_old = torch.zeros(mask.numel(), dtype=torch.float64)
        logp_old[keep] = torch.cat([self.policy.log_prob(taken_obs[lo:lo + step], taken_act[lo:lo + step])
                                    for lo in range(0, taken_obs.shape[0], step)])[:n].double()
        logp_old = logp_old.reshape(mask.shape)
        A = gae(self.step_rewards(batch), values, mask, torch.where(batch.terminated, 0.0, final_v), self.gamma, self.gae_lambda)
        returns = (A + values) * mask
        return {"obs": obs, "actions": actions, "mask": mask, "values": values, "returns": returns,
                "A": normalize_per_user(A, mask, batch.users, self.adv_norm), "logp_old": logp_old,
                "steps_per_user": batch.grouped(batch.lengths).sum(1).double().clamp_min(1),  # n_u: means
                "group_size": batch.group_size}

    def release_minibatch(self, t: dict, mb: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The released sums of the actor's and the critic's clipped per-user gradients over the users at
        positions ``mb`` (ids ``ids``), at the current parameters, and the step's raw clip fractions. Fused
        (``fused_sums``: the release's clipping factors, ``release_clipped_sum``) where the learner and the actor's
        space allow, else from the rows (``minibatch_blocks``, clipped by ``release_sum``)."""
        rel = self.release
        fused = self.fused_sums(t, mb) if self.fuses(len(mb)) else None
        if fused is None:
            g_actor, g_critic, ratio = self.minibatch_blocks(t, mb)
            d_actor, s_a = rel.release_sum(g_actor, ids, self.clip, part="actor")
            d_critic, s_c = rel.release_sum(g_critic, ids, self.critic_clip, part="critic")
            frac = ratio()
        else:
            (actor, actor_norms, frac), (critic, critic_norms) = fused
            d_actor, s_a = rel.release_clipped_sum(actor, actor_norms, ids, self.clip, part="actor")
            d_critic, s_c = rel.release_clipped_sum(critic, critic_norms, ids, self.critic_clip, part="critic")
        return d_actor, d_critic, {"diag/clip_fraction": s_a["diag/clip_fraction"],
                                   "diag/critic_clip_fraction": s_c["diag/clip_fraction"],
                                   "diag/ratio_clip_fraction": frac}

    def fuses(self, users: int) -> bool:
        """Whether a minibatch of ``users`` users (this rank's, under torchrun) takes the fused path (``fused``;
        public: sizes only): by default when its rows would not fit in ``PER_USER_MEMORY`` at once (the
        materialised path would run in blocks)."""
        if not users or self.fused is False:
            return False
        return self.fused is True or users > self.users_per_block()

    def users_per_block(self) -> int:
        """Users whose actor and critic gradient rows (float32 and float64 copies) fit in ``PER_USER_MEMORY``."""
        params = sum(p.numel() for p in self.space.params) + sum(p.numel() for p in self.critic.parameters())
        return max(1, PER_USER_MEMORY // max(1, 8 * 4 * params))

    def fused_sums(self, t: dict, mb: torch.Tensor) -> tuple | None:
        """((actor sum, actor norms, ratio clip fraction), (critic sum, critic norms)) of the users at positions
        ``mb``: each sum_u c_u g_u with c_u the release's clipping factors of ||g_u|| (``Release.clip_scale``,
        with its fused margin: every user's term has norm <= C), formed by the engine without the (b, P) rows;
        None when the actor's space has no such path (a projection)."""
        (o, a), w, user, frac = self.actor_rows(*self._actor_inputs(t, mb))
        actor = self.space.clipped_rows_sum((o, a), w, user, lambda n: self.release.clip_scale(n, self.clip),
                                            num_users=len(mb))
        if actor is None:
            return None
        inputs, w, user = self.critic_rows(*self._critic_inputs(t, mb))
        critic = clipped_gradient_sum(self.critic, inputs, w, lambda n: self.release.clip_scale(n, self.critic_clip),
                                      user, num_users=len(mb))
        actor = tuple(finite_or_fail(x, "the PPO actor gradient") for x in actor)
        critic = tuple(finite_or_fail(x, "the PPO critic gradient") for x in critic)
        return (*actor, frac), critic

    def minibatch_blocks(self, t: dict, mb: torch.Tensor):
        """(actor rows, critic rows, ratio()) of ``mb``: its ``minibatch_gradients``, or, when its users x
        parameters matrices would exceed ``PER_USER_MEMORY`` bytes, iterables of blocks of its users computed
        one after the other (the release clips each block as it comes: ``dppo.privacy.composed.clipped_total``).
        ``ratio()`` is the fraction of steps whose ratio is clipped (read once the actor's rows are released).
        Every block sees the same parameters: nothing is stepped until both sums are released."""
        if not len(mb):   # none of the minibatch's users is in this batch (another rank holds them)
            return (torch.zeros(0, self.space.dim, dtype=torch.float64),
                    torch.zeros(0, sum(p.numel() for p in self.critic_params), dtype=torch.float64), lambda: 0.0)
        per_block = self.users_per_block()
        if len(mb) <= per_block:
            g_actor, g_critic, frac = self.minibatch_gradients(t, mb)
            return g_actor, g_critic, lambda: frac
        blocks = [mb[lo:lo + per_block] for lo in range(0, len(mb), per_block)]
        fracs = []

        def actor():
            for b in blocks:
                g, frac = self.actor_gradients(*self._actor_inputs(t, b))
                fracs.append(frac * len(b))
                yield g

        def critic():
            for b in blocks:
                yield self.critic_gradients(*self._critic_inputs(t, b))

        return actor(), critic(), lambda: sum(fracs) / len(mb)

    def _rows(self, t: dict, mb: torch.Tensor) -> torch.Tensor:
        G = t["group_size"]
        return (mb[:, None] * G + torch.arange(G)).reshape(-1)  # their episodes

    def _actor_inputs(self, t: dict, mb: torch.Tensor) -> tuple:
        rows = self._rows(t, mb)
        return (t["obs"][rows], t["actions"][rows], t["mask"][rows], t["A"][rows], t["logp_old"][rows],
                t["steps_per_user"][mb], t["group_size"])

    def _critic_inputs(self, t: dict, mb: torch.Tensor) -> tuple:
        rows = self._rows(t, mb)
        return (t["obs"][rows], t["mask"][rows], t["returns"][rows], t["steps_per_user"][mb], t["group_size"])

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
        inputs, w, user, frac = self.actor_rows(obs, actions, mask, A, logp_old, n_u, G)
        g = finite_or_fail(self.space.gradients(inputs, w, user, num_users=len(n_u)), "the PPO actor gradient")
        return g, frac

    def actor_rows(self, obs, actions, mask, A, logp_old, n_u, G) -> tuple[tuple, torch.Tensor, torch.Tensor, float]:
        """The engine's rows of J_u: ((obs, action), weight w, user), the weighted score sum of user u's rows its
        gradient (module docstring), grouped by user; and the fraction of steps whose ratio is clipped."""
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
        return (o, a), w, user, float(clipped.double().mean())

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
        inputs, w, user = self.critic_rows(obs, mask, returns, n_u, G)
        g = per_user_gradients(self.critic, inputs, w, user, num_users=len(n_u)).double()
        return finite_or_fail(g, "the PPO critic gradient")

    def critic_rows(self, obs, mask, returns, n_u, G) -> tuple[tuple, torch.Tensor, torch.Tensor]:
        """The engine's rows of -L_u: ((obs,), w, user), w_t = (R_t / c - V(s_t) / c) / n_u (the critic's forward
        is V / c), so that sum_t w_t grad (V(s_t) / c) = -grad L_u."""
        b = len(n_u)
        keep = mask.reshape(-1)
        o = obs.flatten(0, 1)[keep]
        user = torch.arange(b).repeat_interleave(G * mask.shape[1])[keep]
        c = self.value_scale
        with torch.no_grad():
            v = self.critic.value(o).double()
        return (o,), (returns.reshape(-1)[keep] / c - v) / n_u[user], user

    def step(self, d_actor: torch.Tensor, d_critic: torch.Tensor, users: int) -> None:
        """One optimizer step each: the space ascends J along ``d_actor``; the critic descends L along
        -``d_critic`` (both released means of ``users`` users; AdamBC is told their public noise variance)."""
        for opt, clip, part in ((self.optimizer, self.clip, "actor"), (self.critic_optimizer, self.critic_clip,
                                                                        "critic")):
            if isinstance(opt, AdamBC):  # the std of this release's noise (correlated: its stream's, not sigma)
                opt.noise_var = (self.release.noise_std(clip, part) / users) ** 2
        self.space.ascend(d_actor, self.optimizer)
        lo = 0
        for p in self.critic_params:
            n = p.numel()
            p.grad = -d_critic[lo:lo + n].reshape(p.shape).to(p.dtype)
            lo += n
        self.critic_optimizer.step()

    def distribute(self, shards) -> None:
        """Multi-process: this rank's share of each round's users; each clipped sum adds every rank's users' sums on
        rank 0, whose release draws the noise once (``dppo.training.distributed.ShardedSums``)."""
        self.sampler = shards.sampler(self.sampler)
        self.release = shards.round_release(self.release, self.sampler)

    def set_lr(self, round_idx: int) -> None:
        frac = 1.0 - round_idx / self.num_rounds if self.anneal_lr else 1.0
        for opt, lr in ((self.optimizer, self.lr), (self.critic_optimizer, self.critic_lr)):
            for group in opt.param_groups:
                group["lr"] = lr * frac

    # ---- state ------------------------------------------------------------------------------------
    def released_modules(self) -> dict:
        return {**super().released_modules(), "critic": self.critic}   # released like the policy

    def state_dict(self) -> dict:
        return {**super().state_dict(), "critic": self.critic.state_dict(), "optimizer": self.optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
