"""NPG and DP-NPG ([PO] Alg. 1 with the least-squares PrivUpdate of Sec. 4); REBEL is NPG with its own rows.

One round: m fresh users each get G rollouts (``dppo.algos.core``); the compatible least squares

    w_t = argmin_w sum_i (1/n_i) sum_{g, t} (w . phi(s_igt, a_igt) - A_igt)^2 + ridge ||w||^2,
    phi(s, a) = grad_theta log pi_theta(a|s)   (in the policy's parameter space, ``dppo.policies.spaces``),

with n_i the user's number of rows and A from user i's own group, is solved by the injected oracle
(``exact`` when non-private; ``ssp`` / ``dp_gd`` / ``exp_mech`` make it (eps, delta)- or eps-DP in the
round's users), and theta <- theta + eta_t d_t with d_t = momentum d_{t-1} + w_t. On ``env=prompts`` a
step is a whole completion and phi its log-likelihood's gradient in the adapter.

Privacy: user i's rows (all G rollouts) are one block, a function of user i's group and of the
released policy; the oracle clips each user's block as one unit, so its guarantee is the round's and
one-pass parallel composition gives the run's. Everything after the oracle is post-processing: the
step eta_t = sqrt(2 max_kl / d^T F d) uses the policy's Fisher matrix F at *public* states (rollouts of
the current released policy from public reset seeds, never a user's; ``fisher_episodes``), the same
matrix the ssp oracle takes as its public Gram matrix (it then spends the whole budget on X^T y); the
final policy with ``average_last`` k is the mean of the last k rounds' released parameters theta_t
(tail averaging, a public schedule of released quantities).
Private and non-private runs run the same code; only the injected oracle differs.
"""
from __future__ import annotations

import math

import torch

from dppo.algos.core import GroupPolicyOptimizer
from dppo.errors import ConfigError, DataError

STEPS = ("kl", "norm", "fixed")


class NaturalPolicyGradient(GroupPolicyOptimizer):
    """NPG / DP-NPG: compatible least squares through a (private) least-squares oracle.

    Args:
        policy, env, privacy, sampler, space, logger: injected by the builder.
        oracle: the least-squares oracle (``oracle=...``; the builder's default: ``default_oracle``).
        step: ``kl`` (eta = sqrt(2 max_kl / d^T F d), F the public Fisher), ``norm`` (eta = lr / ||d||)
            or ``fixed`` (eta = lr).
        lr: the step of ``norm`` / ``fixed``.
        max_kl: the KL radius of ``kl``.
        max_step_norm: cap on ||eta d|| (None: no cap).
        momentum: beta of the step direction d_t = beta d_{t-1} + w_t (a running sum of released w's; with
            ``redraw_subspace`` d_{t-1} is carried into the new subspace's coordinates, P_t^T P_{t-1} d_{t-1}).
        step_decay: the step (and its cap) is divided by 1 + step_decay * round (a public schedule).
        fisher_episodes: public rollouts per round whose states give the Fisher matrix (read by ``step=kl``
            and by an oracle taking a public Gram matrix, ``ssp``).
        fisher_states: at most this many of their states are used (evenly spaced).
        average_last: the final policy is the average (1/k) sum_{t=T-k+1..T} theta_t of the parameters after the
            last k rounds' steps (tail averaging of released iterates: post-processing; 0 or 1: the last
            iterate). Applied after round T-1's step; rollouts always use the current iterate. On CartPole the
            last iterate jitters by tens of return points from round to round; 10 of the default 200 rounds
            raised the worst tuning seed's final return by ~20 (docs/npg_defaults.md).
        redraw_subspace: with a random subspace (``policy.dim``), draw round t's from the run seed and t
            (``ParameterSpace.redraw``: a public schedule): each release stays ``dim``-dimensional while the
            updates span the whole space over rounds (a fixed 8-dim subspace of CartPole's 65-dim head left
            some seeds' policies stalled below 300, twin included; docs/npg_defaults.md).
        seed, rounds, group_size, reward_bound, advantage, group_std, leave_one_out, gamma, explore_bonus:
            ``dppo.algos.core``.
    """

    names = ("npg", "dp_npg")
    needs = (*GroupPolicyOptimizer.needs, "oracle")
    private_oracle = "ssp"          # the default private oracle (``default_oracle``)
    # more, smaller updates from one-pass users, chosen on CartPole seeds 100-109 (docs/npg_defaults.md); an
    # experiment file behind a reference table pins the shape its table was made with
    default_run_shape = {"rounds": 200, "users_per_round": 15, "group_size": 4}
    APPLIES = {**GroupPolicyOptimizer.APPLIES, "lr": ("step", ("norm", "fixed")), "max_kl": ("step", ("kl",))}

    @classmethod
    def check_config(cls, algo: dict, *, oracle=None, oracle_keys=(), **context) -> None:
        """Besides ``APPLIES``: the public Fisher's keys are read only by ``step=kl`` or an oracle taking a public
        Gram matrix (ssp), and with that Gram matrix ssp's keys shaping a released Gram matrix do nothing."""
        super().check_config(algo, **context)
        values = {**cls.defaults(), **algo}
        public_gram = oracle is not None and oracle.uses_public_gram and values["fisher_episodes"] > 0
        if values["step"] != "kl" and not public_gram:  # fisher_episodes=0 is the switch that turns it off
            for key in ("fisher_episodes", "fisher_states"):
                if key in algo and not (key == "fisher_episodes" and algo[key] == 0):
                    raise ConfigError(f"algo.{key} sets the public Fisher matrix, which algo.step={values['step']} "
                                      f"with oracle={oracle.name if oracle is not None else None} does not read: remove it")
        if public_gram:
            for key in oracle.PUBLIC_GRAM_IGNORES:
                if key in oracle_keys:
                    raise ConfigError(f"oracle.{key} shapes the released Gram matrix, which {cls.names[1]} replaces "
                                      f"by its public Fisher matrix: remove it, or set algo.fisher_episodes=0 "
                                      f"(and algo.step=norm) to release the Gram matrix")

    def __init__(self, policy, env, privacy, sampler, oracle, *, space=None, logger=None, seed: int, rounds: int,
                 group_size: int, reward_bound: float | None, advantage: str = "group", group_std: bool = True,
                 leave_one_out: bool = False, gamma: float = 0.99, explore_bonus: float = 0.0, step: str = "kl",
                 lr: float = 0.05, max_kl: float = 0.05, max_step_norm: float | None = 1.0, momentum: float = 0.0,
                 step_decay: float = 0.0, fisher_episodes: int = 4, fisher_states: int = 500,
                 redraw_subspace: bool = True, average_last: int = 10):
        super().__init__(policy, env, privacy, sampler, space=space, logger=logger, seed=seed, rounds=rounds,
                         group_size=group_size, reward_bound=reward_bound, advantage=advantage,
                         group_std=group_std, leave_one_out=leave_one_out, gamma=gamma, explore_bonus=explore_bonus,
                         average_last=average_last)
        if step not in STEPS:
            raise ConfigError(f"algo.step must be one of {STEPS}, got '{step}'")
        if step == "kl" and fisher_episodes < 1:
            raise ConfigError("algo.step=kl needs the public Fisher matrix: set algo.fisher_episodes >= 1")
        if privacy.private and privacy.multi_pass:
            raise ConfigError("NPG/REBEL support one-pass training only (privacy.multi_pass=false)")
        if privacy.private and not oracle.private_capable:
            raise ConfigError(f"oracle '{oracle.name}' is not private; with eps set choose oracle=ssp|dp_gd|exp_mech")
        if oracle.max_dim is not None and self.space.dim > oracle.max_dim:
            raise ConfigError(f"oracle={oracle.name} works with d x d statistics or a cover of R^d, unusable for "
                              f"d = {self.space.dim} dimensions (at most {oracle.max_dim}); use oracle=dp_gd (noisy "
                              f"gradient steps) or a smaller policy.dim")
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"algo.momentum must lie in [0, 1), got {momentum}")
        if step_decay < 0:
            raise ConfigError(f"algo.step_decay must be >= 0, got {step_decay}")
        self.oracle = oracle
        self.step_rule, self.lr, self.max_kl, self.max_step_norm = step, float(lr), float(max_kl), max_step_norm
        self.momentum, self.step_decay = float(momentum), float(step_decay)
        self.fisher_episodes, self.fisher_states = int(fisher_episodes), int(fisher_states)
        # the public Fisher is collected only when the step or the oracle reads it
        self.uses_fisher = self.fisher_episodes > 0 and (step == "kl" or oracle.uses_public_gram)
        self.public_per_round = self.fisher_episodes if self.uses_fisher else 0
        if self.uses_fisher and getattr(self.collector, "has_public", True) is False:
            raise ConfigError("the public Fisher matrix (algo.step=kl, or an oracle reading a public Gram matrix) "
                              "needs public prompts and this run has none (every row is private): give evaluation "
                              "prompts (env.eval_path / eval_dataset, or a split column), or set algo.step=norm with "
                              "oracle=dp_gd, or use algo=dp_pg")
        self.direction = torch.zeros(self.space.dim, dtype=torch.float64)
        self.redraw_subspace = bool(redraw_subspace)

    def resolved_hparams(self) -> dict:
        """The oracle it was built with (its name; ``oracle`` null in the config gets the family's default)."""
        return {"oracle": self.oracle.name}

    @classmethod
    def default_oracle(cls, private: bool, dim: int) -> str:
        """The oracle of ``oracle=null``: ``exact`` without privacy; with privacy the family's own
        (``private_oracle``), or ``dp_gd`` when the space is too large for ssp's d x d statistics."""
        if not private:
            return "exact"
        if cls.private_oracle == "ssp" and dim > 2048:
            return "dp_gd"
        return cls.private_oracle

    # ---- one round -----------------------------------------------------------------------
    def regression_rows(self, batch) -> tuple[list, dict]:
        """Per-user (X_i, y_i): every step of the user's G rollouts, phi(s, a) against its advantage."""
        A, zero_frac = self.step_advantages(batch)
        phi = self.space.features(batch)
        y = A[batch.mask]
        sizes = [int(n) for n in batch.grouped(batch.lengths).sum(1)]
        return list(zip(phi.split(sizes), y.split(sizes))), {"diag/zero_spread_fraction": zero_frac}

    def public_fisher(self, round_idx: int):
        """F at the states of ``fisher_episodes`` public rollouts of the current policy (None if unused)."""
        if not self.uses_fisher:
            return None
        batch = self.public_batch
        if batch is None:  # not collected with this round's users
            batch = self.collector.public(self.policy, "fisher", round_idx, self.fisher_episodes)
        return self.space.fisher(batch, self.fisher_states)

    def update(self, batch, round_idx: int, users: list[int]) -> dict:
        if batch is None:  # no users on this rank: fine under torchrun (the oracle gathers every rank's rows)
            if not self.oracle.sharded:
                raise DataError("NPG/REBEL rounds need at least one user")
            rows, stats = [], {}
        if self.redraw_subspace:  # round t's public subspace; d carried over in the new coordinates
            change = self.space.redraw(round_idx)
            if change is not None:
                self.direction = change @ self.direction
        if batch is not None:
            rows, stats = self.regression_rows(batch)
        F = self.public_fisher(round_idx)
        gram = F.matrix if F is not None and self.oracle.uses_public_gram else None
        w = self.oracle.solve(rows, privacy=self.privacy, round=round_idx, public_gram=gram, ids=users)
        if not torch.isfinite(w).all():
            raise DataError("the least-squares oracle returned a non-finite w; aborting before the update")
        self.direction = self.momentum * self.direction + w  # released w's only: post-processing
        decay = 1.0 + self.step_decay * round_idx
        update = self.step_size(self.direction, F) * self.direction / decay
        cap = None if self.max_step_norm is None else self.max_step_norm / decay
        if cap is not None and update.norm() > cap:
            update = update * (cap / update.norm())
        self.space.step(update)
        self.average_tail(round_idx)
        release = self.oracle.last_release or {}
        if "noise_multiplier" in release:
            stats["privacy/noise_multiplier"] = release["noise_multiplier"]
        return {**stats, "losses/w_norm": float(w.norm()), "losses/step_norm": float(update.norm())}

    def step_size(self, d: torch.Tensor, F) -> float:
        """eta_t from released quantities only: KL-normalized with the public Fisher, lr / ||d||, or lr."""
        if self.step_rule == "kl":
            return math.sqrt(2 * self.max_kl / max(F.quadratic(d), 1e-12))
        if self.step_rule == "norm":
            return self.lr / max(float(d.norm()), 1e-12)
        return self.lr

    def distribute(self, shards) -> None:
        """Multi-process: this rank's users' regression rows reach rank 0's oracle (``shards``)."""
        self.oracle = shards.oracle(self.oracle)
        self.sampler = shards.sampler(self.sampler)

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {**super().state_dict(), "direction": self.direction.clone(), "oracle": self.oracle.state_dict()}
        if self.redraw_subspace and self.space.projection is not None:  # the current round's public subspace
            state["projection"] = self.space.projection.clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.direction = state["direction"].clone()
        self.oracle.load_state_dict(state["oracle"])
        if "projection" in state and self.space.projection is not None:
            self.space.projection = state["projection"].clone()
