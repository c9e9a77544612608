"""REBEL and DP-REBEL ([PO] Sec. 5; Gao et al. 2024): NPG with REBEL's own regression rows.

Each of m fresh users runs G rollouts from its own start state (a context and G responses in the
bandit; G trajectories from the user's seeded reset in a gym env). REBEL regresses relative rewards
onto log-ratio differences,

    theta_{t+1} = argmin_theta sum_i ( (1/eta) [log pi_theta(tau)/pi_t(tau) - log pi_theta(tau')/pi_t(tau')]
                                       - (R(tau) - R(tau')) )^2,

and linearizing log pi_theta(tau) = log pi_t(tau) + w . x(tau), x(tau) = sum_t phi(s_t, a_t) (exact for
a log-linear bandit policy), this is the least squares min_w sum_i (w . x_i - y_i)^2. With G rollouts
per user we use the *group form*: user i contributes G rows, rollout g's centered features and rewards

    x_ig = x(tau_ig) - mean_g' x(tau_ig'),    y_ig = eta (R_ig - mean_g' R_ig'),

weighted 1/G (one user, one unit). For G = 2 the two rows are +-(x - x', eta (R - R')) / 2, i.e. the
paper's pair regression up to a common factor 1/2 (the same minimizer); for G > 2 it compares every
rollout with the user's own group mean instead of with one partner, which uses all G responses at
the cost of one row each (all pairs would need G(G-1)/2 rows for the same information: their
least squares is the group form's, since sum_{g<g'} (w.(x_g - x_g') - (y_g - y_g'))^2 =
G sum_g (w.(x_g - xbar) - (y_g - ybar))^2). ``normalize_rows`` divides each row by max(||x_ig||, 1).
Everything else (collection, oracle, public Fisher, step) is NPG's. On ``env=prompts`` a response is a
completion and x its log-likelihood's gradient in the adapter.
"""
from __future__ import annotations

from dppo.algos.base import Learner
from dppo.algos.npg import NaturalPolicyGradient
from dppo.errors import ConfigError


class REBEL(NaturalPolicyGradient):
    """REBEL / DP-REBEL: the group-form REBEL regression through a (private) least-squares oracle.

    Args:
        eta: REBEL's eta (the targets are eta (R - mean R)).
        normalize_rows: divide each row (x_ig, y_ig) by max(||x_ig||, 1) (keeps w . x = y; reweights rows).
        explore_bonus: c of the state-range bonus added to each rollout's return (``dppo.algos.core``; 0: off).
        redraw_subspace: as NPG's (off by default: REBEL's defaults and its CartPole tuning are the fixed subspace's).
        average_last: as NPG's (0 by default: the last iterate, as REBEL's defaults were measured).
        (others as in ``NaturalPolicyGradient``, without ``advantage``, ``group_std``, ``leave_one_out`` and
        ``gamma``: the centered reward is REBEL's target)
    """

    names = ("rebel", "dp_rebel")
    private_oracle = "dp_gd"
    default_run_shape = Learner.default_run_shape   # not NPG's (tuned for NPG on CartPole): the common one
    APPLIES = {k: v for k, v in NaturalPolicyGradient.APPLIES.items() if k != "explore_bonus"}  # always group-form

    def __init__(self, policy, env, privacy, sampler, oracle, *, space=None, logger=None, seed: int, rounds: int,
                 group_size: int, reward_bound: float | None, eta: float = 0.01, normalize_rows: bool = True,
                 explore_bonus: float = 0.0,
                 step: str = "kl", lr: float = 0.05, max_kl: float = 0.05, max_step_norm: float | None = 1.0,
                 momentum: float = 0.8, step_decay: float = 0.0, fisher_episodes: int = 4, fisher_states: int = 500,
                 redraw_subspace: bool = False, average_last: int = 0):
        if group_size is None or int(group_size) < 2:
            raise ConfigError(f"REBEL compares a user's responses and needs group_size >= 2, got {group_size}")
        super().__init__(policy, env, privacy, sampler, oracle, space=space, logger=logger, seed=seed, rounds=rounds,
                         group_size=group_size, reward_bound=reward_bound, advantage="group",
                         explore_bonus=explore_bonus, step=step, lr=lr,
                         max_kl=max_kl, max_step_norm=max_step_norm, momentum=momentum, step_decay=step_decay,
                         fisher_episodes=fisher_episodes, fisher_states=fisher_states,
                         redraw_subspace=redraw_subspace, average_last=average_last)
        self.eta, self.normalize_rows = float(eta), bool(normalize_rows)

    def regression_rows(self, batch) -> tuple[list, dict]:
        """Per-user (X_i (G, dim), y_i (G,)): the group-centered trajectory features and rewards."""
        x = batch.grouped(self.space.episode_features(batch))
        R = batch.grouped(self.returns(batch)).double()
        x = x - x.mean(1, keepdim=True)
        y = self.eta * (R - R.mean(1, keepdim=True))
        if self.normalize_rows:
            scale = x.norm(dim=2).clamp_min(1.0)
            x, y = x / scale[..., None], y / scale
        zero = (R.max(1).values - R.min(1).values) <= 1e-12
        return list(zip(x, y)), {"diag/zero_spread_fraction": float(zero.double().mean()),
                                 "diag/reward_gap": float((R - R.mean(1, keepdim=True)).abs().mean())}
