"""NPG and DP-NPG ([PO] Alg. 1 with the least-squares PrivUpdate of Sec. 4).

One round: m fresh users each run one episode (seeded reset); the compatible least squares

    w_t = argmin_w sum_i (1/n_i) sum_t (w . phi(s_it, a_it) - A_it)^2 + ridge ||w||^2,
    phi(s, a) = grad_theta log pi_theta(a|s)   (restricted to a subspace, see below)

is solved by the injected oracle (``exact`` when non-private; ``ssp`` / ``dp_gd`` / ``exp_mech``
make it (eps, delta)- or eps-DP in the round's users), and theta <- theta + eta_t w_t.

Privacy: the advantages A_it use only user i's own episode (``baseline``/``normalize`` in
{none, user_mean, user}); the features are a function of the released policy and user i's own
states and actions; so each user's regression rows depend on that user alone, the oracle's
guarantee is the round's guarantee, and one-pass parallel composition gives the run's.
Everything after the oracle (the step size, the update) is post-processing, so the step size
normalization uses only released quantities: ``step=norm|fixed`` the released w, and
``step=kl`` (eta = sqrt(2 max_kl / w^T F w)) the round's Fisher matrix without privacy, or the
Fisher estimate the ``ssp`` oracle released (its noisy Gram matrix averaged over rounds) with it.

Subspaces (``subspace``): ``full`` = all parameters (per-sample gradients by torch.func);
``head`` = the last linear layer, with action 0's row as the reference (softmax is invariant to a
shift common to all rows), phi = (1[a=k] - pi_k(s)) [h(s), 1] for k = 1..K-1; ``head_dim=k``
further restricts the head update to a fixed random k-dim subspace P (orthonormal columns, seeded,
data-independent): w lives in R^k and the head moves by P w. ``full`` works with any policy,
``head`` needs ``policy.body`` and ``policy.head`` (an ``nn.Linear``), as ``MLPPolicy`` has.
"""
from __future__ import annotations

import math

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from dppo.algos.base import Learner
from dppo.algos.pg import EVAL_USER_OFFSET, advantages, per_user_gradients
from dppo.algos.rollout import collect_episodes, returns_to_go
from dppo.envs.gym_env import user_seed
from dppo.errors import ConfigError, DataError

SUBSPACES = ("full", "head")
STEPS = ("kl", "norm", "fixed")


def reset_seeds(env, run_seed: int, users) -> list[int]:
    """Reset seed of each user: the env's own mapping if it has one (bandit: user u = context u),
    else the gym convention ``user_seed``."""
    if hasattr(env, "reset_seeds"):
        return env.reset_seeds(run_seed, users)
    return [user_seed(run_seed, u) for u in users]


def evaluate_policy(policy, env, run_seed: int, episodes: int, greedy: bool = False) -> float:
    """Mean return over ``episodes`` held-out users (seeds no training user has)."""
    if hasattr(env, "eval_seeds"):
        seeds = env.eval_seeds(run_seed, episodes)
    else:
        seeds = [user_seed(run_seed, EVAL_USER_OFFSET + i) for i in range(episodes)]
    gen = torch.Generator().manual_seed(run_seed + 99991)
    return float(collect_episodes(policy, env, seeds, reward_bound=None, generator=gen, greedy=greedy).returns.mean())


def public_states(spec: dict) -> torch.Tensor:
    """Reference states for a data-independent Fisher: ``n`` points uniform in the box [low, high],
    seeded (public knowledge about the state space, never user data)."""
    try:
        low, high = torch.tensor(spec["low"], dtype=torch.float32), torch.tensor(spec["high"], dtype=torch.float32)
    except (KeyError, TypeError):
        raise ConfigError("algo.fisher_states needs {low: [...], high: [...], n: N}") from None
    if low.shape != high.shape or not bool((high >= low).all()):
        raise ConfigError("algo.fisher_states: low and high must have the same shape with high >= low")
    gen = torch.Generator().manual_seed(int(spec.get("seed", 0)) + 2718)
    n = int(spec.get("n", 1000))
    return low + (high - low) * torch.rand(n, *low.shape, generator=gen)


class PolicySubspace:
    """Compatible features phi(s, a) in a parameter subspace, and the matching parameter update."""

    def __init__(self, policy, subspace: str = "full", head_dim: int | None = None, seed: int = 0,
                 basis_obs: torch.Tensor | None = None):
        if subspace not in SUBSPACES:
            raise ConfigError(f"algo.subspace must be one of {SUBSPACES}, got '{subspace}'")
        self.policy, self.kind = policy, subspace
        self.projection = None
        if subspace == "head":
            head = getattr(policy, "head", None)
            if not isinstance(head, torch.nn.Linear) or not hasattr(policy, "body"):
                raise ConfigError("algo.subspace=head needs a policy with .body and a linear .head (MLPPolicy); "
                                  "use algo.subspace=full")
            self.n_actions, self.width = head.out_features, head.in_features + 1
            full = (self.n_actions - 1) * self.width
            if head_dim is not None:
                if not 1 <= head_dim <= full:
                    raise ConfigError(f"algo.head_dim must lie in 1..{full}, got {head_dim}")
                if basis_obs is not None:
                    self.projection = self.public_basis(basis_obs, int(head_dim))
                else:
                    gen = torch.Generator().manual_seed(int(seed) + 31337)
                    q, _ = torch.linalg.qr(torch.randn(full, int(head_dim), generator=gen, dtype=torch.float64))
                    self.projection = q  # orthonormal columns: ||P^T v|| <= ||v||
            self.dim = full if head_dim is None else int(head_dim)
        else:
            self.dim = sum(p.numel() for p in policy.parameters())

    def public_basis(self, obs: torch.Tensor, k: int) -> torch.Tensor:
        """Top-k principal directions of the head's inputs [h(s), 1] at public states (orthonormal columns).

        Blocks of rows k = 1..K-1 share the basis, so the head dimension must be a multiple of K-1.
        Data-independent: the initial body and public states only.
        """
        blocks = self.n_actions - 1
        if k % blocks:
            raise ConfigError(f"algo.head_dim must be a multiple of {blocks} (actions - 1) with head_basis=public")
        with torch.no_grad():
            h = self.policy.body(obs).double()
        h1 = torch.cat([h, torch.ones(h.shape[0], 1, dtype=torch.float64)], dim=1)
        _, evecs = torch.linalg.eigh(h1.T @ h1 / h1.shape[0])
        top = evecs[:, -(k // blocks):]
        return torch.block_diag(*([top] * blocks))

    def features(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """phi(s, a) for N rows (N, dim), float64."""
        if self.kind == "full":
            ones = torch.ones(obs.shape[0], 1)
            return per_user_gradients(self.policy, obs[:, None], actions[:, None], ones).double()
        with torch.no_grad():
            h = self.policy.body(obs).double()
            probs = torch.softmax(self.policy.head(h.float()).double(), dim=-1)
            h1 = torch.cat([h, torch.ones(h.shape[0], 1, dtype=torch.float64)], dim=1)
            onehot = torch.nn.functional.one_hot(actions.long(), self.n_actions).double()
            coef = (onehot - probs)[:, 1:]  # rows k = 1..K-1
            phi = (coef[:, :, None] * h1[:, None, :]).reshape(obs.shape[0], -1)
        return phi if self.projection is None else phi @ self.projection

    def fisher(self, obs: torch.Tensor) -> torch.Tensor:
        """F = mean_s sum_a pi(a|s) phi(s, a) phi(s, a)^T at the given states (dim x dim)."""
        with torch.no_grad():
            probs = torch.softmax(self.policy.logits(obs), -1).double()
        F = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        for a in range(probs.shape[1]):
            phi = self.features(obs, torch.full((obs.shape[0],), a, dtype=torch.long))
            F += (phi * probs[:, a:a + 1]).T @ phi
        return F / obs.shape[0]

    def fisher_quadratic(self, obs: torch.Tensor, w: torch.Tensor) -> float:
        """w^T F w at the given states without forming F (for the full parameter space)."""
        with torch.no_grad():
            probs = torch.softmax(self.policy.logits(obs), -1).double()
        total = 0.0
        for a in range(probs.shape[1]):
            phi = self.features(obs, torch.full((obs.shape[0],), a, dtype=torch.long))
            total += float((probs[:, a] * (phi @ w) ** 2).sum())
        return total / obs.shape[0]

    def step(self, w: torch.Tensor) -> None:
        """theta <- theta + w (w in subspace coordinates)."""
        with torch.no_grad():
            if self.kind == "full":
                params = list(self.policy.parameters())
                vector_to_parameters(parameters_to_vector(params) + w.to(params[0].dtype), params)
                return
            delta = w if self.projection is None else self.projection @ w
            delta = delta.reshape(self.n_actions - 1, self.width).to(self.policy.head.weight.dtype)
            self.policy.head.weight[1:] += delta[:, :-1]
            self.policy.head.bias[1:] += delta[:, -1]


class NaturalPolicyGradient(Learner):
    """NPG / DP-NPG: compatible least squares through a (private) least-squares oracle.

    Args:
        policy, env, privacy, sampler, oracle: injected by the builder (oracle: ``make_oracle``).
        seed, rounds, reward_bound: injected top-level keys (rewards clipped to +-reward_bound).
        gamma: discount of the returns-to-go.
        baseline, normalize: advantage shaping (see ``pg.advantages``; ``batch`` only non-private).
        subspace, head_dim: parameter subspace of the update (module docstring).
        step: ``kl`` (eta = sqrt(2 max_kl / w^T F w); private only with oracle=ssp, using its released
            Fisher estimate), ``norm`` (eta = lr / ||w||)
            or ``fixed`` (eta = lr).
        lr, max_kl: step-size constants.
        max_step_norm: cap on ||eta w|| (None: no cap).
        momentum: beta of the step direction d_t = beta d_{t-1} + w_t (a running sum of released w's).
        step_decay: the step (and its cap) is divided by 1 + step_decay * round.
        advantage: ``returns`` (returns-to-go of one episode per user, shaped by baseline/normalize) or
            ``paired`` ([PO]'s A = r(x, y) - r(x, y'): two episodes per user from the same reset, the
            relative return difference as the target of every step of each).
        head_basis: ``random`` (seeded random subspace of the head) or ``public`` (top principal
            directions of the head's inputs at the public ``fisher_states``, at initialization).
        fisher_states: ``{low, high, n, seed}``: a public box of reference states; the policy's Fisher
            matrix there (data-independent) is handed to the oracle as ``public_gram`` (ssp then
            spends the whole budget on X^T y) and normalizes ``step=kl`` in private runs.
    """

    name = "npg"

    def __init__(self, policy, env, privacy, sampler, oracle, *, seed: int = 0, rounds: int = 100,
                 reward_bound: float | None = 1.0, gamma: float = 0.99, baseline: str = "batch",
                 normalize: str = "batch", subspace: str = "full", head_dim: int | None = None, step: str = "kl",
                 lr: float = 0.05, max_kl: float = 0.01, max_step_norm: float | None = None, momentum: float = 0.0,
                 fisher_states: dict | None = None, step_decay: float = 0.0, head_basis: str = "random",
                 advantage: str = "returns"):
        if step not in STEPS:
            raise ConfigError(f"algo.step must be one of {STEPS}, got '{step}'")
        if privacy.private:
            if "batch" in (baseline, normalize):
                raise ConfigError("a batch baseline/normalization mixes users inside a private round; use "
                                  "algo.baseline=user_mean|none and algo.normalize=user|none for private runs")
            if step == "kl" and not fisher_states and not hasattr(oracle, "fisher_quadratic"):
                raise ConfigError(f"algo.step=kl needs a released Fisher matrix, which oracle '{oracle.name}' does "
                                  f"not release; use oracle=ssp or algo.step=norm|fixed for private runs")
            if privacy.multi_pass:
                raise ConfigError("NPG/REBEL support one-pass training only (privacy.multi_pass=false)")
            if not oracle.private_capable:
                raise ConfigError(f"oracle '{oracle.name}' is not private; with eps set choose oracle=ssp|dp_gd|exp_mech")
        self.policy, self.env, self.privacy, self.sampler, self.oracle = policy, env, privacy, sampler, oracle
        self.seed, self.num_rounds, self.reward_bound = int(seed), int(rounds), reward_bound
        self.gamma, self.baseline, self.normalize = float(gamma), baseline, normalize
        if advantage not in ("returns", "paired"):
            raise ConfigError(f"algo.advantage must be 'returns' or 'paired', got '{advantage}'")
        self.advantage = advantage
        if head_basis not in ("random", "public"):
            raise ConfigError(f"algo.head_basis must be 'random' or 'public', got '{head_basis}'")
        if head_basis == "public" and not fisher_states:
            raise ConfigError("algo.head_basis=public needs algo.fisher_states (the public states it is computed at)")
        basis_obs = public_states(fisher_states) if head_basis == "public" else None
        self.space = PolicySubspace(policy, subspace, head_dim, seed, basis_obs=basis_obs)
        self.step_rule, self.lr, self.max_kl, self.max_step_norm = step, float(lr), float(max_kl), max_step_norm
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"algo.momentum must lie in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        if step_decay < 0:
            raise ConfigError(f"algo.step_decay must be >= 0, got {step_decay}")
        self.step_decay = float(step_decay)
        self.reference_obs = public_states(fisher_states) if fisher_states else None
        obs_shape = tuple(getattr(getattr(env, "observation_space", None), "shape", ()) or ())
        if self.reference_obs is not None and obs_shape and tuple(self.reference_obs.shape[1:]) != obs_shape:
            raise ConfigError(f"algo.fisher_states has shape {tuple(self.reference_obs.shape[1:])} but the env's "
                              f"observations have shape {obs_shape}; give a box of that shape or set it to null")
        self.public_fisher = None
        self.direction = torch.zeros(self.space.dim, dtype=torch.float64)
        self.generator = torch.Generator().manual_seed(self.seed)

    # ---- one round -----------------------------------------------------------------------
    def train_round(self, round_idx: int) -> dict:
        users = self.sampler.next_round()
        seeds = reset_seeds(self.env, self.seed, users)
        batch = collect_episodes(self.policy, self.env, seeds, reward_bound=self.reward_bound, generator=self.generator)
        if self.advantage == "paired":
            second = collect_episodes(self.policy, self.env, seeds, reward_bound=self.reward_bound,
                                      generator=self.generator)
            phi, rows = self.paired_rows(batch, second)
            returns = torch.cat([batch.returns, second.returns])
            lengths = torch.cat([batch.lengths, second.lengths])
        else:
            A = advantages(returns_to_go(batch.rewards, batch.mask, self.gamma), batch.mask, self.baseline,
                           self.normalize)
            phi = self.space.features(batch.obs[batch.mask], batch.actions[batch.mask])
            rows = self.user_rows(phi, A[batch.mask].double(), batch.lengths)
            returns, lengths = batch.returns, batch.lengths
        self.public_fisher = None
        if self.reference_obs is not None and self.space.dim <= 1024:
            self.public_fisher = self.space.fisher(self.reference_obs)
        w = self.oracle.solve(rows, privacy=self.privacy, round=round_idx, public_gram=self.public_fisher)
        if not torch.isfinite(w).all():
            raise DataError("the least-squares oracle returned a non-finite w; aborting before the update")
        self.direction = self.momentum * self.direction + w  # released w's only: post-processing
        d = self.direction if self.momentum > 0 else w
        update = self.step_size(d, phi) * d / (1.0 + self.step_decay * round_idx)
        cap = None if self.max_step_norm is None else self.max_step_norm / (1.0 + self.step_decay * round_idx)
        if cap is not None and update.norm() > cap:
            update = update * (cap / update.norm())
        self.space.step(update)
        return {"diag/return": float(returns.mean()),
                "diag/episode_length": float(lengths.double().mean()),
                "rollout/users": len(users), "diag/reward_clip_fraction": batch.reward_clip_fraction,
                "losses/w_norm": float(w.norm()), "losses/step_norm": float(update.norm())}

    def paired_rows(self, first, second) -> tuple[torch.Tensor, list]:
        """[PO]'s two-response advantage: user i's rows are both of its episodes (same reset), every step
        of episode 1 with target A_i = (R_i - R'_i) / max(|R_i|, |R'_i|, 1) and every step of episode 2
        with -A_i. Uses user i's two episodes only."""
        R1, R2 = first.returns.double(), second.returns.double()
        A = (R1 - R2) / torch.maximum(torch.maximum(R1.abs(), R2.abs()), torch.ones_like(R1))
        phi1 = self.space.features(first.obs[first.mask], first.actions[first.mask])
        phi2 = self.space.features(second.obs[second.mask], second.actions[second.mask])
        n1, n2 = [int(n) for n in first.lengths], [int(n) for n in second.lengths]
        rows = [(torch.cat([p1, p2]), torch.cat([torch.full((len(p1),), float(a)), torch.full((len(p2),), -float(a))]))
                for p1, p2, a in zip(phi1.split(n1), phi2.split(n2), A)]
        return torch.cat([phi1, phi2]), rows

    @staticmethod
    def user_rows(phi: torch.Tensor, A: torch.Tensor, lengths: torch.Tensor) -> list:
        """Split pooled rows (users in order, as ``batch.mask`` flattens them) into per-user blocks."""
        sizes = [int(n) for n in lengths]
        return list(zip(phi.split(sizes), A.split(sizes)))

    def step_size(self, w: torch.Tensor, phi: torch.Tensor) -> float:
        """eta_t: KL-normalized (non-private), lr / ||w||, or lr."""
        if self.step_rule == "kl":
            if self.privacy.private and self.public_fisher is not None:  # public states: data-independent
                wFw = float(w @ self.public_fisher @ w)
            elif self.privacy.private and self.reference_obs is not None:  # large dim: matrix-free
                wFw = self.space.fisher_quadratic(self.reference_obs, w)
            elif self.privacy.private:  # the oracle's released (noisy, averaged) Fisher: post-processing
                wFw = self.oracle.fisher_quadratic(w) or 0.0
            else:
                wFw = float(((phi @ w) ** 2).mean())
            return math.sqrt(2 * self.max_kl / max(wFw, 1e-12))
        if self.step_rule == "norm":
            return self.lr / max(float(w.norm()), 1e-12)
        return self.lr

    # ---- evaluation and state ---------------------------------------------------------------
    def evaluate(self, episodes: int, greedy: bool = False) -> float:
        return evaluate_policy(self.policy, self.env, self.seed, episodes, greedy)

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "generator": self.generator.get_state(),
                "direction": self.direction.clone(), "oracle": self.oracle.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.generator.set_state(state["generator"])
        self.direction = state["direction"].clone()
        self.oracle.load_state_dict(state["oracle"])
