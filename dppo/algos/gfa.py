"""DP-GFA: private online RL with general function approximation (REFERENCE.md section 3, [GFA]).

K episodes (one user each) in M = ceil(K/B) batches; at the start of batch i the policy is updated once
by sampling f from the exponential mechanism ``P(f) ~ exp(beta S(f))`` over a finite class F (exactly,
by Gumbel-max: ``argmax_f beta S(f) + G_f`` with i.i.d. standard Gumbel G_f), then every episode of the
batch acts greedily, ``a_h = argmax_a f_h(s_h, a)``. Only the sampled f's are released (billboard
model: (eps, delta)-JDP). ``eps = null`` replaces the mechanism by the greedy ``argmax_f S(f)``.

* ``GFAOutcomeLearner`` (Algorithm 2): deterministic transitions, one outcome reward per episode,
  ``S(f) = eta E_{s_1 ~ rho} max_a f_1(s_1, a) - L_BR(f)``.
* ``GFALearner`` (Algorithm 1): stochastic tabular MDP with per-step rewards,
  ``S(f) = eta E_{s_1 ~ p0} max_a f_1(s_1, a) - L_BE(f)`` (Bellman error with the inner infimum).

Privacy: ``beta = eps_0 / (2 Delta_S)`` (``exp_mech_beta``), eps_0 the largest per-release budget with
which the M - 1 data-dependent releases compose to the target eps under ``privacy.accountant``
(``advanced``: Dwork-Rothblum-Vadhan; ``zcdp``: eps_0-bounded range => eps_0^2/8-zCDP). The first
release (batch 0) sees no data and costs nothing; it is still written to the ledger (eps = 0).

Budget split (``budget_decay`` = p; ``dppo.privacy.calibration.ExponentialSchedule``): release i = 1..M-1
gets ``eps_i = s i^{-p}`` with s the largest scale whose composition (the same accountant) meets the
target, and ``beta_i = eps_i / (2 Delta_S)``.
p = 0 (default) is the paper's equal split. p = 1 front-loads the budget: a wrong member's score gap
grows linearly with the data n_i = i B, so eps_i ~ 1/i keeps ``beta_i x gap`` the same at every
release instead of wasting budget on late releases whose data already separates Q*. Either way each
release is eps_i-DP with its own calibration, and the accountant composes exactly the recorded eps_i.
"""
from __future__ import annotations

import math

import torch

from dppo.algos.base import EpisodeLearner
from dppo.errors import ConfigError, DataError
from dppo.privacy.calibration import ExponentialSchedule
from dppo.privacy.mechanisms import exponential_mechanism

COMPOSITION_ACCOUNTANTS = {"advanced": "advanced", "zcdp": "zcdp"}


def paper_batch_size(episodes: int, batch_const: float) -> int:
    """The paper's rule B = c K^{3/5} (Thm: regret O~(K^{3/5}) with B = O~(K^{3/5})), rounded, >= 1."""
    return max(1, int(round(batch_const * episodes ** 0.6)))


def gumbel_max(logits: torch.Tensor, gumbel: torch.Tensor) -> int:
    """Index of ``max(logits + gumbel)``: an exact sample of ``softmax(logits)`` when gumbel ~ Gumbel(0, 1)."""
    return int(torch.argmax(logits + gumbel))


class _GFABase(torch.nn.Module, EpisodeLearner):
    """Batching, the exponential mechanism, accounting and logging shared by both algorithms.

    A ``torch.nn.Module`` like the tabular learners: the class tables (``class_*`` buffers, shared
    with the function class and re-pointed after device moves), the data-free optimism term and the
    history statistics (the ``stats`` submodule) are buffers; the episode counter, per-episode regret,
    the member in use and the RNG states are extra state. So ``state_dict`` / ``load_state_dict``,
    checkpoints and ``.to(device)`` work as for every other learner.
    """

    CLASS_TENSORS: tuple = ()          # names of the function class's tensor attributes (its tables)

    def __init__(self, *, privacy, sampler, seed: int, episodes: int, batch_size: int | None,
                 batch_const: float, eta: float, size: int, budget_decay: float = 0.0):
        if "_buffers" not in self.__dict__:
            torch.nn.Module.__init__(self)
        K = int(episodes)
        if K < 1:
            raise ConfigError(f"episodes must be >= 1, got {K}")
        if not batch_const > 0 or not eta >= 0:
            raise ConfigError(f"need algo.batch_const > 0 and algo.eta >= 0, got {batch_const}, {eta}")
        if not (math.isfinite(budget_decay) and budget_decay >= 0):
            raise ConfigError(f"algo.budget_decay must be >= 0, got {budget_decay}")
        self.budget_decay = float(budget_decay)
        self.privacy, self.sampler = privacy, sampler
        self.K = K
        self.B = int(batch_size) if batch_size is not None else paper_batch_size(K, batch_const)
        if self.B < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.B}")
        self.num_rounds = math.ceil(K / self.B)
        self.eta = float(eta)
        self.generator = torch.Generator().manual_seed(int(seed) + 31337)       # user data (contexts, env)
        self.eval_generator = torch.Generator().manual_seed(int(seed) + 271828)
        self.episodes_done = 0
        self.regret = []                       # exact expected regret of each episode's policy
        self.current = None                    # index of the member in use
        self.eps0 = self.beta = None           # budget and beta of the first data-dependent release
        self.eps_schedule = []                 # eps_i of the data-dependent releases i = 1..M-1
        self.round_eps = self.round_beta = None
        self.size = size

    needs = ("env", "privacy", "sampler", "seed", "episodes", "batch_size")
    # one user per episode (``EpisodeLearner``), in batches of B (the rounds)

    @property
    def horizon(self) -> int:
        """H, the steps of every episode (a model-free env's episode is padded to H in its absorbing state, as the
        tabular learners count it): its rounds report no ``diag/env_steps``, so the step axis counts episodes x H."""
        return int(self.env.H)

    @property
    def planned_episodes(self) -> int:
        return int(self.K)

    @classmethod
    def extension_refusal(cls, algo: str) -> str:
        return (f"algo={algo} splits its budget over the batches of the planned episodes (its releases compose): "
                f"more episodes would spend more than the target eps")

    # ---- privacy -----------------------------------------------------------------------------
    uses_composition = True        # its releases compose: privacy.accountant=advanced (default) | zcdp

    @classmethod
    def releases_pure_dp(cls, cfg) -> bool:
        return True                # exponential-mechanism releases only

    @classmethod
    def accountant_name(cls, privacy_cfg, algo_cfg: dict | None = None) -> str:
        """The default accountant of the M releases (``privacy.accountant`` null): ``advanced``, or ``zcdp`` where
        the deprecated ``privacy.composition`` says so."""
        comp = getattr(privacy_cfg, "composition", None) or "advanced"
        if comp not in COMPOSITION_ACCOUNTANTS:
            raise ConfigError(f"privacy.composition must be 'advanced' or 'zcdp', got '{comp}'")
        return COMPOSITION_ACCOUNTANTS[comp]

    def _calibrate(self, sensitivity: float) -> None:
        """eps_i of the M - 1 data-dependent releases (largest meeting the target) and beta = eps_1/(2 Delta_S)."""
        self.sensitivity = float(sensitivity)
        if not self.privacy.private:
            return
        acc = self.privacy.accountant
        if not hasattr(acc, "largest_eps0"):
            raise ConfigError(f"GFA accounts its releases by composition; privacy.accountant={acc.name} cannot, "
                              f"use privacy.accountant=advanced (the default) or zcdp")
        releases = max(self.num_rounds - 1, 1)
        self.schedule = ExponentialSchedule(acc, self.privacy.eps, self.privacy.delta, releases, self.budget_decay,
                                            self.sensitivity)
        self.eps_schedule, self.eps0, self.beta = self.schedule.eps, self.schedule.eps0, self.schedule.beta

    def release_budget(self, round_idx: int) -> tuple[float, float]:
        """(eps, beta) of the release at the start of round ``round_idx`` (``ExponentialSchedule.budget``)."""
        return self.schedule.budget(round_idx)

    def select(self, round_idx: int, score: torch.Tensor) -> tuple[int, float]:
        """Pick the member for this batch: exponential mechanism (private) or argmax (ties at random)."""
        if self.privacy.private:
            users = self.episodes_done
            eps, beta = self.release_budget(round_idx)
            self.round_eps, self.round_beta = (eps if users > 0 else 0.0), beta
            idx, _ = exponential_mechanism(self.privacy, score, beta=beta, round=round_idx, users=users,
                                           eps=self.round_eps, sensitivity=self.sensitivity, class_size=self.size)
            idx = int(idx)
        else:
            best = score.max()
            ties = torch.nonzero(score >= best - 1e-9 * max(1.0, float(best.abs()))).squeeze(1)
            idx = int(ties[torch.randint(len(ties), (1,), generator=self.generator)])
        return idx, float(score.max() - score[idx])

    # ---- loop --------------------------------------------------------------------------------
    def train_round(self, round_idx: int) -> dict[str, float]:
        """One batch: release f (policy update), play B episodes (users), add their statistics.

        The returned diagnostics (return, regret, score gap) are computed from raw data for the
        experimenter's logs, under ``diag/`` as in every dppo learner; only f is DP-released.
        """
        score = self.score()
        self.current, gap = self.select(round_idx, score)
        self._set_policy(self.current)
        n = min(self.B, self.K - self.episodes_done)
        users = self.sampler.take(n) if self.sampler is not None else list(range(n))
        ret, regret = self.play_and_record(len(users))
        self.episodes_done += len(users)
        self.regret.extend([regret] * len(users) if regret is not None else [])
        metrics = {"diag/return": ret, "rollout/users": float(len(users)), "diag/score_gap": gap,
                   "gfa/batch": float(len(users))}
        if regret is not None:
            metrics["regret/per_episode"] = regret
            metrics["regret/cumulative"] = float(sum(self.regret))
        if self.privacy.private:
            metrics["gfa/beta"] = self.round_beta
            metrics["gfa/eps0"] = self.round_eps
            metrics["privacy/epsilon"] = self.privacy.spent()[0]
        return metrics

    def summary(self) -> dict:
        out = {"episodes": self.episodes_done, "batch_size": self.B, "class_size": self.size,
               "sensitivity": self.sensitivity, "eps0": self.eps0, "beta": self.beta,
               "budget_decay": self.budget_decay}
        if self.regret:
            out["cumulative_regret"] = float(sum(self.regret))
            out["final_regret_per_episode"] = float(self.regret[-1])
        return out

    # ---- module state ------------------------------------------------------------------------
    def _register_class(self) -> None:
        """The function class's tables as buffers of this module (the class keeps pointing at them)."""
        for attr in self.CLASS_TENSORS:
            self.register_buffer(f"class_{attr}", getattr(self.fclass, attr))

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        for attr in self.CLASS_TENSORS:             # after .to(device) / .double(): the class reads the moved tables
            setattr(self.fclass, attr, getattr(self, f"class_{attr}"))
        if self.current is not None:
            self._set_policy(int(self.current))
        return out

    def get_extra_state(self) -> dict:
        return {"episodes_done": self.episodes_done, "regret": list(self.regret), "current": self.current,
                "generator": self.generator.get_state(), "eval_generator": self.eval_generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.episodes_done = int(state["episodes_done"])
        self.regret = [float(r) for r in state["regret"]]
        self.current = state["current"]
        self.generator.set_state(state["generator"])
        self.eval_generator.set_state(state["eval_generator"])

    def held_out_generator(self) -> torch.Generator:
        """A copy of ``eval_generator``, which never advances: every evaluation draws the same held-out
        episodes, and evaluating moves nothing the users' episodes or a later evaluation draw from."""
        gen = torch.Generator()
        gen.set_state(self.eval_generator.get_state())
        return gen

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):
        out = super().load_state_dict(state, strict=strict, assign=assign)
        if self.current is not None:
            self._set_policy(int(self.current))
        return out

    # subclass hooks: score(), _set_policy(i), play_and_record(n) -> (mean return, regret or None)


class GFAOutcomeLearner(_GFABase):
    """Algorithm 2: deterministic transitions, outcome reward, Bellman-residual score (module docstring).

    Args:
        env: a deterministic outcome-reward MDP (``ContextBitsMDP``).
        privacy, sampler, seed, episodes, batch_size: injected (``episodes``: K; ``batch_size``: B).
        episodes: K, the episodes (users) of the run (top-level ``episodes``).
        batch_const: c in the default batch size B = c K^{3/5} (default 1.5: the c of {0.5, 1, 1.25, 1.5, 2}
            with the smallest mean plateau over the four private rows of the plateau table, selected on
            seeds 100-119, disjoint from the reported seeds 0-19; docs/gfa.md).
        eta: weight of the optimism term (default 50, the scale of the paper's eta = Theta(sqrt(K H)) = 45
            at K = 500, H = 4; results are flat for eta >= 50).
        class_size, class_scales, class_seed: the structured class (``ContextBitsClass``).
        sensitivity: ``worst_case`` (any class with values in [0, V_max]) or ``class`` (exact maximum
            of one loss term over this finite class and domain; see ``residual_sensitivity``).
        budget_decay: p in the per-release budgets eps_i ~ i^{-p} (0 = the paper's equal split).
    """

    name = "gfa_outcome"
    names = ("gfa_outcome", "gfa_outcome")  # non-private, private (eps=null runs it without the mechanism)
    CLASS_TENSORS = ("codes", "masks", "scales", "targets", "target_code", "lut")

    def __init__(self, env, privacy, sampler=None, seed: int = 0, episodes: int = 500,
                 batch_size: int | None = None, batch_const: float = 1.5,
                 eta: float = 50.0, class_size: int = 243, class_scales=(0.5, 0.75, 1.0), class_seed: int = 0,
                 sensitivity: str = "class", budget_decay: float = 0.0):
        from dppo.function_classes.context_bits import ContextBitsClass
        from dppo.function_classes.losses import BellmanResidualLoss

        torch.nn.Module.__init__(self)
        if not hasattr(env, "trajectory_sa"):
            raise ConfigError(f"algo=gfa_outcome needs a deterministic outcome-reward env (env=context_bits), "
                              f"got {type(env).__name__}")
        self.env = env
        self.fclass = ContextBitsClass(env, size=class_size, scales=class_scales, seed=class_seed)
        super().__init__(privacy=privacy, sampler=sampler, seed=seed, episodes=episodes, batch_size=batch_size,
                         batch_const=batch_const, eta=eta,
                         size=self.fclass.size, budget_decay=budget_decay)
        self.stats = BellmanResidualLoss(self.fclass.size)
        self._register_class()
        rho = env.rho.double()
        self.register_buffer("optimism", self.fclass.values(env.initial_sa()).double().amax(-1) @ rho)  # f1_bar
        self.v_star = env.optimal_value()
        if sensitivity not in ("worst_case", "class"):
            raise ConfigError(f"algo.sensitivity must be 'worst_case' or 'class', got '{sensitivity}'")
        self.sensitivity_kind = sensitivity
        self._calibrate(self.residual_sensitivity(sensitivity))
        self.policy = None

    def residual_sensitivity(self, kind: str) -> float:
        """Replace-one sensitivity Delta_S of ``S(f) = eta f1_bar - L_BR(f)``.

        The optimism term does not depend on the data; replacing one user swaps one loss term
        ``l_f = (G_f(tau) - r)^2 >= 0``, so ``|S_D(f) - S_D'(f)| <= max l_f``. Since
        ``f_h(s_h, a_h) <= V^f_h(s_h)``, ``G_f(tau) = f_1(s_1, a_1) + sum_{h>=2} [f_h(s_h, a_h) - V^f_h(s_h)]``
        lies in ``[-(H-1) V_max, V_max]`` for values in [0, V_max], and r is clipped to [r_lo, r_hi]:

            worst_case:  Delta_S = max(V_max - r_lo, r_hi + (H-1) V_max)^2
                         (= H^2 = 16 for values and rewards in [0, 1], H = 4: the paper's O(H^2));
            class:       Delta_S = max_{f in F, tau} max(G_f(tau) - r_lo, r_hi - G_f(tau))^2,
                         enumerated over every trajectory of the finite domain (data-independent).

        ``class`` is a worst case over all possible users, from public information only (the class and
        the domain); it is 1 for the default class (residuals in [0, 1]). That is the smallest value any
        class containing Q* can have: G_{Q*}(tau) is the true reward, which is 1 on some trajectory, and
        replacing that user's reward 1 by 0 moves Q*'s loss term from 0 to 1.
        """
        H, vmax = self.env.H, self.fclass.value_max
        lo, hi = self.env.reward_low, self.env.reward_high
        if kind == "worst_case":
            return max(vmax - lo, hi + (H - 1) * vmax) ** 2
        from dppo.function_classes.losses import trajectory_residuals

        gmax, gmin = -math.inf, math.inf
        all_traj = torch.arange(self.env.num_trajectories)
        for chunk in all_traj.split(64):
            sa, nxt = self.env.trajectory_sa(chunk)
            G = trajectory_residuals(self.fclass, sa, nxt, self.env.num_actions)
            gmax, gmin = max(gmax, float(G.max())), min(gmin, float(G.min()))
        return max(gmax - lo, hi - gmin) ** 2

    def score(self) -> torch.Tensor:
        """``S(f) = eta f1_bar(f) - L_BR(f)`` for all f, float64 ``[|F|]``."""
        return self.eta * self.optimism - self.stats.loss

    def _set_policy(self, i: int) -> None:
        table = self.fclass.member_table(i).view(self.env.num_states, self.env.num_actions)
        self.policy = table.argmax(-1)

    def play_and_record(self, n: int) -> tuple[float, float]:
        from dppo.function_classes.losses import trajectory_residuals

        env = self.env
        x = env.sample_contexts(n, self.generator)
        traj, r = env.rollout(x, self.policy)
        if not torch.isfinite(r).all():
            raise DataError("the environment returned a non-finite outcome reward")
        r = r.clamp(env.reward_low, env.reward_high)              # the declared range the sensitivity uses
        uniq, inv = torch.unique(traj, return_inverse=True)
        count = torch.zeros(len(uniq)).index_add_(0, inv, torch.ones(n))
        rsum = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, r)
        rsq = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, r * r)
        sa, nxt = env.trajectory_sa(uniq)
        self.stats.update(trajectory_residuals(self.fclass, sa, nxt, env.num_actions), count, rsum, rsq)
        regret = self.v_star - env.policy_value(self.policy)
        return float(r.mean()), float(regret)

    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean outcome reward of the current greedy policy on ``episodes`` held-out contexts (not users), the
        same at every call (``held_out_generator``)."""
        if self.policy is None:
            self._set_policy(int(self.score().argmax()))
        x = self.env.sample_contexts(max(1, episodes), self.held_out_generator())
        return float(self.env.rollout(x, self.policy)[1].mean())


def tabular_features(H: int, S: int, A: int) -> torch.Tensor:
    """Features of (h, s, a) for the linear-grid class: ``tau^2, tau sigma, tau a/(A-1)`` with
    ``tau = (H - h)/H`` the remaining horizon fraction and ``sigma = s/(S-1)``. ``[H S A, 3]``."""
    h = torch.arange(H).view(H, 1, 1).expand(H, S, A).reshape(-1).float()
    s = torch.arange(S).view(1, S, 1).expand(H, S, A).reshape(-1).float()
    a = torch.arange(A).view(1, 1, A).expand(H, S, A).reshape(-1).float()
    tau = (H - h) / H
    return torch.stack([tau * tau, tau * s / max(S - 1, 1), tau * a / max(A - 1, 1)], 1)


class GFALearner(_GFABase):
    """Algorithm 1: stochastic tabular MDP, Bellman-error score with the inner infimum (module docstring).

    Rewards are clipped to [0, 1] per step and scaled by 1/H inside the learner, so returns and
    values lie in [0, 1] (R_max = 1/H, V_max = 1); regret is reported in the env's return units.

    Args:
        env: a tabular MDP (``env=riverswim``, ``env=random_mdp``) or a Discrete gymnasium env factory.
        privacy, sampler, seed, episodes, batch_size: injected.
        episodes, batch_const, eta: as for ``GFAOutcomeLearner``.
        grid_low, grid_high, grid_points: the weight grid of the linear epsilon-net class
            (``LinearGridClass`` on ``tabular_features``), |F| = grid_points^3.
        budget_decay: as for ``GFAOutcomeLearner``.
    """

    name = "gfa"
    names = ("gfa", "gfa")
    CLASS_TENSORS = ("table",)

    def __init__(self, env, privacy, sampler=None, seed: int = 0, episodes: int = 2000,
                 batch_size: int | None = None, batch_const: float = 1.0,
                 eta: float = 50.0, grid_low: float = -0.5, grid_high: float = 0.5, grid_points: int = 11,
                 budget_decay: float = 0.0):
        from dppo.envs.tabular import make_tabular
        from dppo.function_classes.linear_grid import LinearGridClass
        from dppo.function_classes.losses import BellmanErrorLoss, masked_max

        torch.nn.Module.__init__(self)
        if hasattr(env, "trajectory_sa"):
            raise ConfigError("algo=gfa needs a stochastic tabular env (env=riverswim, env=random_mdp or a Discrete "
                              "gymnasium env); for env=context_bits use algo=gfa_outcome")
        self.env = make_tabular(env, seed=seed)
        H, S, A = self.env.H, self.env.S, self.env.A
        from dppo.algos.ucb import admissible_table

        table = admissible_table(env, self.env)     # the env's public action masks: masked maxima and policy
        self.action_ok = None if table is None else torch.as_tensor(table)
        self.fclass = LinearGridClass(tabular_features(H, S, A), torch.linspace(grid_low, grid_high, grid_points),
                                      value_max=1.0)
        super().__init__(privacy=privacy, sampler=sampler, seed=seed, episodes=episodes, batch_size=batch_size,
                         batch_const=batch_const, eta=eta,
                         size=self.fclass.size, budget_decay=budget_decay)
        self.stats = BellmanErrorLoss(H, S, A, self.action_ok)
        self._register_class()
        self.r_max = 1.0 / H
        p0 = getattr(self.env, "p0", None)
        first = masked_max(self.fclass.table.view(-1, H, S, A)[:, 0].double(), self.action_ok)   # [|F|, S]
        self.register_buffer("optimism", first @ p0 if p0 is not None else first.mean(1))
        self.has_model = bool(getattr(self.env, "has_model", False))
        self.v_star = self.env.optimal_value() if self.has_model else None
        self._calibrate(self.bellman_error_sensitivity())
        self.policy = None

    def bellman_error_sensitivity(self) -> float:
        """Replace-one sensitivity of ``S(f) = eta f1(s_1) - L_BE(f)``: ``Delta_S = 2 H (R_max + V_max)^2``.

        One residual ``g(s_h, a_h) - r_h - V^f_{h+1}(s_{h+1})`` lies in ``[-(R_max + V_max), V_max]``, so each
        squared term is in ``[0, (R_max + V_max)^2]``; a user's episode adds H of them to
        ``sum_h E_h(f_h, f_{h+1})`` (changes it by <= H (R_max + V_max)^2) and the infimum over f' of
        functions that each change by <= that changes by <= that too. With R_max = V_max = 1 this is
        the paper's 8H; here R_max = 1/H (rewards scaled by 1/H), V_max = 1.
        """
        return 2 * self.env.H * (self.r_max + self.fclass.value_max) ** 2

    def score(self) -> torch.Tensor:
        return self.eta * self.optimism - self.stats.loss(self.fclass.table)

    def _set_policy(self, i: int) -> None:
        H, S, A = self.env.H, self.env.S, self.env.A
        q = self.fclass.member_table(i).view(H, S, A)
        if self.action_ok is not None:                  # greedy among the admissible actions only
            q = q.masked_fill(~self.action_ok.to(q.device), -math.inf)
        self.policy = q.argmax(-1)

    def _episodes(self, n: int, generator, seeds=None):
        """``n`` episodes of the current policy: from ``generator`` on a model, else on the real env, the next
        users' or, given ``seeds``, held-out ones."""
        if hasattr(self.env, "sample_episodes"):
            return self.env.sample_episodes(self.policy, n, generator)
        pol = self.policy.tolist()
        eps = [self.env.run_episode(pol, seed=s) for s in (seeds if seeds is not None else [None] * n)]
        states = torch.tensor([e[0] + [e[0][-1]] for e in eps])
        return states, torch.tensor([e[1] for e in eps]), torch.tensor([e[2] for e in eps], dtype=torch.float64)

    def play_and_record(self, n: int) -> tuple[float, float | None]:
        states, actions, rewards = self._episodes(n, self.generator)
        if not torch.isfinite(rewards).all():
            raise DataError("the environment returned a non-finite reward")
        rewards = rewards.clamp(0.0, 1.0)                         # declared per-step range [0, 1]
        self.stats.update(states, actions, rewards * self.r_max)
        ret = float(self.env.to_native_return(rewards.sum(1).mean()))
        if not self.has_model:
            return ret, None
        regret = self.v_star - self.env.policy_value(self.policy)
        return ret, float(self.env.to_native_regret(regret))

    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean native return of the current greedy policy over ``episodes`` held-out episodes, the same at every
        call (``held_out_generator``; a model-free env: its public ``eval_seeds``)."""
        if self.policy is None:
            self._set_policy(int(self.score().argmax()))
        n = max(1, episodes)
        seeds = None if hasattr(self.env, "sample_episodes") else self.env.eval_seeds(n)
        _, _, rewards = self._episodes(n, self.held_out_generator(), seeds)
        return float(self.env.to_native_return(rewards.sum(1).mean()))
