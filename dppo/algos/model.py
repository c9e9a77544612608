"""Model-based learning on released counts for finite MDPs: ``algo=model`` (non-private) and ``algo=dp_model``.

A run is ``episodes`` users (one episode each: a patient of ICU-Sepsis), in rounds of FRESH users whose sizes grow
geometrically (``first_round``, ``round_growth``: few releases, so little summed noise). Round k:

1. its users come from the one-pass sampler (each user in exactly one round; the privacy context's gate checks that
   every user of a release was taken for that round) and are treated by the behaviour policy: the greedy policy of
   the last plan with probability ``1 - eps_k``, a uniformly random admissible action (``dppo.envs.masks``) with
   probability ``eps_k``; round 0 has no plan (uniform). ``eps_k = max(explore_min, explore explore_decay^(k-1))``
   is a public schedule. Gymnasium envs run through ``EpisodeCollector`` (per-user reset seeds and uniforms, reward
   clipping to the declared range; the native vector env on ICU-Sepsis); tabular MDPs (``env=riverswim``) through
   their own sampler;
2. one release of the round's capped counts and rewards (``dppo.privacy.count_release``: each user's first
   ``transition_cap`` transitions, each distinct (s, a, s') once; analytic Gaussian noise on every entry of the
   public index set, the admissible rows of the env's published mask table); (eps, delta)-DP per round, the run by
   parallel composition (accountant ``parallel``);
3. the released sums are added up with public weights ``w_k`` (``weighting=size``: ``w_k`` proportional to the
   round's size, the weights that maximise the signal-to-noise ratio of the sum, ``sum w_k N_k / sqrt(sum w_k^2)``;
   any fixed weights keep the ratio ``m / n`` an estimate of P), whose noise std is ``sigma sqrt(sum w_k^2)``;
4. planning (``dppo.algos.model_plan``): denoised certainty-equivalent model, value iteration over the env's horizon
   with masked maxima, the greedy policy released (``policy_table``).

The twin (``eps=null``) runs the same code without noise (equal weights, no threshold). Everything the policy is
computed from is a released sum or public, so the released policy and every behaviour policy are post-processing.
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch

from dppo.algos.base import EpisodeLearner
from dppo.algos.model_plan import IndexSet, plan
from dppo.envs.masks import mask_table
from dppo.envs.tabular import TabularMDP
from dppo.errors import ConfigError
from dppo.privacy.count_release import CountRelease, capped_contributions

WEIGHTINGS = ("size", "equal")
ICU = re.compile(r"(icu_sepsis:)?Sepsis/ICU-Sepsis-v\d+")


class TablePolicy(torch.nn.Module):
    """A stationary table policy: ``actions[s]`` (the released greedy policy) and the behaviour probabilities
    ``probs[s, a]``; ``logits(obs)`` reads the state index from the first column of the stored observation."""

    def __init__(self, S: int, A: int):
        super().__init__()
        self.register_buffer("actions", torch.zeros(S, dtype=torch.long))
        self.probs = torch.full((S, A), 1.0 / A, dtype=torch.float64)    # not released in policy.pt: behaviour only

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        s = obs.reshape(obs.shape[0], -1)[:, 0].long().clamp(0, self.probs.shape[0] - 1)
        return torch.log(self.probs[s])


def round_sizes(total: int, first: int, growth: float) -> list[int]:
    """Sizes of the rounds: ``first``, ``first g``, ``first g^2``, ... (rounded), the last cut to reach ``total``."""
    sizes, size, done = [], float(first), 0
    while done < total:
        n = min(max(1, int(round(size))), total - done)
        sizes.append(n)
        done += n
        size *= growth
    return sizes


def published_rewards(env, index, reward_range) -> np.ndarray:
    """The reward of every entry of the index set, in [0, 1], from the env's published reward table (ICU-Sepsis's
    R[s, a, s'], part of the env's definition like its terminal states); refused in one line for an env without one."""
    if not ICU.fullmatch(str(getattr(env, "id", ""))):
        raise ConfigError(f"algo.reward_model=public needs an env that publishes its reward table (ICU-Sepsis); "
                          f"{getattr(env, 'id', type(env).__name__)} does not: use algo.reward_model=transition")
    from dppo.envs.icu_sepsis_vector import package_tables

    R = np.asarray(package_tables()["R"], np.float64)[index.rows_s, index.rows_a]       # [rows, S]
    lo, hi = reward_range
    out = np.zeros((len(index.rows_s), index.cols))
    out[:, :R.shape[1]] = (np.clip(R, lo, hi) - lo) / (hi - lo)
    return out


def published_terminal_states(env) -> list | None:
    """Terminal states an env publishes as part of its definition (ICU-Sepsis's tables), else None."""
    if ICU.fullmatch(str(getattr(env, "id", ""))):
        from dppo.envs.icu_sepsis_vector import package_tables

        return list(package_tables()["terminal"])
    return None


class ModelLearner(EpisodeLearner):
    """Certainty-equivalence planning on released counts (module docstring); private iff ``eps`` is set.

    Args:
        env, privacy, sampler, seed, episodes, reward_bound: injected (``episodes``: the users of the run).
        episodes_default: the users of a run with ``episodes`` null.
        first_round: users of round 0; round k has ``first_round round_growth^k`` (the last one cut).
        round_growth: the factor g >= 1 of the round sizes.
        transition_cap: K, the transitions of each user that enter the release (its first K).
        reward_noise: c, the reward part's noise multiplier relative to the counts'.
        threshold: tau; released counts below ``tau sigma_total`` are set to 0 (default 0: negatives only; on
            ICU-Sepsis, seeds 100-102, 1 sigma changed nothing and 2-3 sigma cut real transitions, 0.821 / 0.798
            against 0.833; on FrozenLake, 50,000 users at eps 3, tau = gate = 3 released a policy that never reached
            the goal, 0 / 0 one that reaches it a third of the time).
        gate: a pair is known when its denoised visits are at least ``gate sigma_total`` (and ``min_visits``).
        min_visits: the least visits of a known pair.
        reward_prior: the weight of the pooled reward mean, in units of the reward sums' noise std.
        reward_model: ``transition`` (rewards released per (s, a, s') entry: any env), ``next_state`` (per next
            state: envs whose reward is a function of the next state; ``dppo.privacy.count_release``) or ``public``
            (the env publishes its reward as a function of the transition, as ICU-Sepsis publishes "1 on entering the
            survival state" with its tables: no reward is released, only the transition counts, Delta_2 = sqrt(2K)).
        explore, explore_decay, explore_min: the public exploration schedule (module docstring).
        weighting: ``size`` (w_k proportional to round k's size) or ``equal``; the twin's sums are unweighted.
        chunk: users collected at once (memory: a chunk's episodes are held together).
    """

    names = ("model", "dp_model")
    needs = ("env", "privacy", "sampler", "seed", "episodes", "reward_bound")

    def __init__(self, env, *, privacy, sampler=None, seed: int = 0, episodes: int | None = None,
                 reward_bound: float | None = 1.0, episodes_default: int = 10000, first_round: int = 1000,
                 round_growth: float = 2.0, transition_cap: int = 20, reward_noise: float = 2.0,
                 threshold: float = 0.0, gate: float = 0.0, min_visits: float = 1.0, reward_prior: float = 1.0,
                 explore: float = 0.3, explore_decay: float = 0.5, explore_min: float = 0.05,
                 weighting: str = "size", reward_model: str = "transition", chunk: int = 10000):
        if privacy is not None and privacy.multi_pass:
            raise ConfigError("algo=dp_model releases each round's users once (one-pass); set privacy.multi_pass=false")
        if int(first_round) < 1 or not float(round_growth) >= 1.0:
            raise ConfigError(f"algo.first_round must be >= 1 and algo.round_growth >= 1, got {first_round}, "
                              f"{round_growth}")
        if not 0.0 <= float(explore_min) <= 1.0 or not 0.0 <= float(explore) <= 1.0 or float(explore_decay) < 0:
            raise ConfigError("algo.explore and algo.explore_min must lie in [0, 1], algo.explore_decay >= 0")
        if weighting not in WEIGHTINGS:
            raise ConfigError(f"algo.weighting must be one of {WEIGHTINGS}, got '{weighting}'")
        if reward_noise is None and reward_model != "public":
            raise ConfigError("algo.reward_noise must be > 0: the planner needs the released rewards (or "
                              "algo.reward_model=public where the env publishes its reward table)")
        if min(threshold, gate, reward_prior) < 0 or int(chunk) < 1:
            raise ConfigError("algo.threshold, algo.gate and algo.reward_prior must be >= 0, algo.chunk >= 1")
        self.env, self.privacy, self.sampler, self.seed = env, privacy, sampler, int(seed)
        self.private = privacy is not None and privacy.private
        self.T = int(episodes if episodes is not None else episodes_default)
        if self.T < 1:
            raise ConfigError(f"episodes must be >= 1, got {self.T}")
        self.sizes = round_sizes(self.T, int(first_round), float(round_growth))
        self.num_rounds = len(self.sizes)
        self.threshold, self.gate, self.min_visits = float(threshold), float(gate), float(min_visits)
        self.reward_prior = float(reward_prior)
        self.explore, self.explore_decay, self.explore_min = float(explore), float(explore_decay), float(explore_min)
        self.weighting, self.chunk = weighting, int(chunk)
        self._setup_env(env, reward_bound)
        self.index = IndexSet.build(self.S, self.A, mask_table(env), self.terminal, self.sink)
        self.public_rewards = None
        if reward_model == "public":
            self.public_rewards = published_rewards(env, self.index, self.reward_range)
        self.release = CountRelease(privacy, self.index.entries, cap=int(transition_cap), reward_noise=reward_noise,
                                    cols=self.index.cols, reward_model=reward_model)
        E = self.index.entries
        self.sum_m, self.sum_y = np.zeros(E), np.zeros(self.release.reward_entries)      # the weighted sums of the released counts / rewards
        self.weight_sq = 0.0                                   # sum_k w_k^2
        self.episodes_done, self.releases = 0, 0
        self.policy = TablePolicy(self.S, self.A)
        self.greedy = TablePolicy(self.S, self.A)
        self._set_behaviour(None)
        self.known_fraction = 0.0
        self.sim_gen = torch.Generator().manual_seed(self.seed * 3 + 21)
        self.eval_gen = torch.Generator().manual_seed(self.seed * 3 + 23)

    # ---- env ---------------------------------------------------------------------------------------------
    def _setup_env(self, env, reward_bound) -> None:
        """Tabular MDP (its own sampler, rewards in [0, 1], fixed horizon) or a gymnasium factory with Discrete
        spaces (``EpisodeCollector``; the native reward range clipped to [-reward_bound, reward_bound])."""
        if isinstance(env, TabularMDP):
            self.mdp, self.collector = env, None
            self.S, self.A, self.H = env.S, env.A, env.H
            self.terminal, self.sink, self.reward_range = None, False, (0.0, 1.0)
            return
        from gymnasium.spaces import Discrete

        from dppo.envs.rollout import EpisodeCollector

        obs, act = getattr(env, "observation_space", None), getattr(env, "action_space", None)
        if not (isinstance(obs, Discrete) and isinstance(act, Discrete)) or int(obs.start) or int(act.start):
            raise ConfigError(f"algo=model|dp_model needs a finite MDP: Discrete observation and action spaces "
                              f"starting at 0 (got {obs} and {act}); use env=riverswim, FrozenLake-v1, Taxi-v3, ICU-Sepsis")
        self.mdp, self.S, self.A, self.H = None, int(obs.n), int(act.n), int(env.horizon)
        self.terminal = published_terminal_states(env)
        self.sink = self.terminal is None
        declared = getattr(env, "reward_range", None)
        lo, hi = declared if declared is not None else (-math.inf, math.inf)
        if reward_bound is not None:
            lo, hi = max(lo, -float(reward_bound)), min(hi, float(reward_bound))
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ConfigError("algo=model|dp_model needs a reward range: set env.reward_range=[low, high] or reward_bound")
        self.reward_range, self.reward_bound = (float(lo), float(hi)), reward_bound
        self.collector = EpisodeCollector(env, self.seed)

    @classmethod
    def extension_refusal(cls, algo: str) -> str:
        return f"algo={algo} sizes its rounds for the planned episodes (the round schedule is fixed when it is built)"

    # ---- policies ------------------------------------------------------------------------------------------
    def explore_rate(self, round_idx: int) -> float:
        """eps_k of the public schedule (1 before the first plan)."""
        if self.releases == 0:
            return 1.0
        return max(self.explore_min, self.explore * self.explore_decay ** max(round_idx - 1, 0))

    def _set_behaviour(self, eps: float | None) -> None:
        """Behaviour probabilities: (1 - eps) on the greedy action + eps uniform over the admissible actions."""
        ok = self.index.mask.astype(np.float64)
        uniform = ok / ok.sum(1, keepdims=True)
        if eps is None:
            probs = uniform
        else:
            greedy = np.zeros_like(uniform)
            greedy[np.arange(self.S), self.greedy.actions.numpy()] = 1.0
            probs = (1.0 - eps) * greedy + eps * uniform
        self.policy.probs = torch.from_numpy(probs)

    def policy_table(self) -> np.ndarray:
        """The released greedy policy, an action per state [S] (int64)."""
        return self.greedy.actions.numpy().copy()

    def released_modules(self) -> dict:
        return {"policy": self.greedy}

    # ---- collection ----------------------------------------------------------------------------------------
    def _steps(self, round_idx: int, users: list[int], offset: int):
        """One chunk of users' episodes as flat step arrays (user, t, entry, reward in [0, 1]) and their returns."""
        if self.mdp is not None:
            probs = self.policy.probs
            states, actions, rewards = self.mdp.sample_episodes(probs, len(users), self.sim_gen)
            n, H = actions.shape
            s, a, s2 = states[:, :-1].numpy(), actions.numpy(), states[:, 1:].numpy()
            r = rewards.numpy()
            valid = np.ones((n, H), bool)
            returns = self.mdp.to_native_return(rewards.sum(1)).numpy()
            r01 = r
        else:
            batch, _ = self.collector.users(self.policy, users, round_idx, 1, self.reward_bound)
            st = batch.obs[..., 0].long().numpy() if batch.obs.dim() == 3 else batch.obs.long().numpy()
            a = batch.actions.long().numpy()
            valid = batch.mask.numpy()
            n, H = valid.shape
            lengths = valid.sum(1)
            final = batch.final_obs.reshape(n, -1)[:, 0].long().numpy()
            if self.sink:
                final = np.where(batch.terminated.numpy(), self.S, final)
            s = st
            s2 = np.empty_like(st)
            s2[:, :-1] = st[:, 1:]
            s2[np.arange(n), np.maximum(lengths - 1, 0)] = final
            lo, hi = self.reward_range
            r01 = (np.clip(batch.rewards.numpy(), lo, hi) - lo) / (hi - lo)
            returns = batch.returns.numpy()
        t = np.broadcast_to(np.arange(H), (n, H))
        user = np.broadcast_to(np.arange(offset, offset + n)[:, None], (n, H))
        rows = self.index.row_of[np.clip(s, 0, self.S - 1), np.clip(a, 0, self.A - 1)]
        entry = np.where(rows >= 0, rows * self.index.cols + s2, -1)
        v = valid
        return user[v], t[v], entry[v], r01[v], returns, int(v.sum())

    def train_round(self, round_idx: int) -> dict:
        size = self.sizes[round_idx]
        users = self.sampler.take(size) if self.sampler is not None else list(range(self.episodes_done,
                                                                                    self.episodes_done + size))
        eps = self.explore_rate(round_idx)
        self._set_behaviour(None if self.releases == 0 else eps)
        E = self.index.entries
        counts, rewards, returns, steps = np.zeros(E), np.zeros(self.release.reward_entries), [], 0
        per_column = self.release.reward_model == "next_state"
        public = self.release.reward_model == "public"
        with torch.no_grad():
            for lo in range(0, size, self.chunk):
                part = users[lo:lo + self.chunk]
                u, t, e, r, ret, k = self._steps(round_idx, part, lo)
                c, y, col, _ = capped_contributions(u - lo, t, e, r, self.release.cap, E, self.index.cols)
                counts += c
                if not public:
                    rewards += col if per_column else y
                returns.append(ret)
                steps += k
        m, y, info = self.release.release(round_idx, users, counts, rewards)
        w = 1.0 if not self.private or self.weighting == "equal" else size / max(self.sizes)
        self.sum_m += w * m
        if y is not None and y.size:
            self.sum_y += w * y
        self.weight_sq += w * w
        self.releases += 1
        self.episodes_done += size
        self._replan()
        returns = np.concatenate(returns)
        metrics = {"rollout/users": float(size), "rollout/episodes": float(size), "diag/return": float(returns.mean()),
                   "diag/env_steps": float(steps), "model/explore": eps, "model/known_fraction": self.known_fraction}
        if self.private:
            metrics["privacy/noise_multiplier"] = self.release.sigma / self.release.sensitivity
            metrics["privacy/count_sigma"] = self.release.sigma
        return metrics

    def _replan(self) -> None:
        scale = math.sqrt(self.weight_sq)
        p = plan(self.index, self.sum_m, self.sum_y if self.public_rewards is None else self.public_rewards,
                 horizon=self.H, reward_range=self.reward_range,
                 threshold=self.threshold, gate=self.gate, min_visits=self.min_visits, reward_prior=self.reward_prior,
                 sigma_counts=self.release.sigma * scale, sigma_rewards=self.release.reward_sigma * scale)
        self.greedy.actions.copy_(torch.from_numpy(p.policy))
        self.known_fraction = float(p.known.mean())

    # ---- evaluation, summary, state ------------------------------------------------------------------------
    def exact_return(self) -> float | None:
        """The released policy's exact expected return on the env's own public model, where one is known
        (a tabular MDP; ICU-Sepsis's tables at horizon 500: survival); None otherwise."""
        pi = self.greedy.actions.clone()
        if self.mdp is not None:
            return float(self.mdp.to_native_return(torch.tensor(self.mdp.policy_value(pi))))
        if ICU.fullmatch(str(getattr(self.env, "id", ""))):
            from dppo.envs.icu_sepsis_exact import survival

            return survival(pi.numpy())
        return None

    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        """Mean native return of the released greedy policy over ``episodes`` held-out episodes (public seeds and
        streams, the same at every call)."""
        if self.mdp is not None:
            gen = torch.Generator()
            gen.set_state(self.eval_gen.get_state())
            _, _, r = self.mdp.sample_episodes(self.greedy.actions.clone(), int(episodes), gen)
            return float(self.mdp.to_native_return(r.sum(1)).mean())
        pol = TablePolicy(self.S, self.A)
        probs = np.zeros((self.S, self.A))
        probs[np.arange(self.S), self.greedy.actions.numpy()] = 1.0
        pol.probs = torch.from_numpy(probs)
        return self.collector.evaluate(pol, int(episodes), True)

    def summary(self) -> dict:
        return {"episodes": self.episodes_done, "releases": self.releases, "round_sizes": self.sizes,
                "transition_cap": self.release.cap, "count_sigma": self.release.sigma,
                "index_entries": self.index.entries, "known_fraction": self.known_fraction,
                "exact_return": self.exact_return()}

    @property
    def public_env_steps(self) -> int | None:
        return None if self.collector is None else self.collector.public_env_steps

    @public_env_steps.setter
    def public_env_steps(self, value: int) -> None:
        if self.collector is not None:
            self.collector.public_env_steps = int(value)

    def state_dict(self) -> dict:
        return {"sum_m": torch.from_numpy(self.sum_m.copy()), "sum_y": torch.from_numpy(self.sum_y.copy()),
                "weight_sq": self.weight_sq, "episodes_done": self.episodes_done, "releases": self.releases,
                "actions": self.greedy.actions.clone(), "known_fraction": self.known_fraction,
                "sim_gen": self.sim_gen.get_state(), "eval_gen": self.eval_gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.sum_m, self.sum_y = state["sum_m"].numpy().copy(), state["sum_y"].numpy().copy()
        self.weight_sq = float(state["weight_sq"])
        self.episodes_done, self.releases = int(state["episodes_done"]), int(state["releases"])
        self.greedy.actions.copy_(state["actions"])
        self.known_fraction = float(state["known_fraction"])
        self.sim_gen.set_state(state["sim_gen"])
        self.eval_gen.set_state(state["eval_gen"])
