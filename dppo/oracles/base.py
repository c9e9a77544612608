"""Private least-squares oracles: the interface, bound enforcement, and the exact (non-private) solver.

Every oracle solves the per-user ridge least squares of [PO] Sec. 4 (DP-NPG, DP-REBEL):

    F(w) = sum_i L_i(w) + ridge * ||w||^2,   L_i(w) = (1 / n_i) sum_t (x_it . w - y_it)^2,

in *normalized units*: features are clipped to ``||x|| <= x_bound`` and targets to
``|y| <= y_bound`` (bounds enforced by clipping, never assumed) and divided by their bounds, so
``||x'|| <= 1``, ``|y'| <= 1``; the solution is mapped back by ``w = w' * y_bound / x_bound``.
``n_i = max(rows_i, rows_bound)`` when ``rows_bound`` is given (each row then weighs the same, as in
a pooled regression, and a user's weight is still at most 1) and ``n_i = rows_i`` otherwise.

With a non-private context (``eps=None``) every oracle returns the exact minimizer of F (direct
solve, or conjugate gradients with ``cg_iters`` for large dimension): the private oracles are
then plain least squares, which is what the tests compare them against.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dppo.errors import ConfigError, DataError


@dataclass
class UserRegression:
    """One round's regression data, clipped and normalized, one block of rows per user.

    Attributes:
        X: (rows, d) float64 features in normalized units (each row norm <= 1).
        y: (rows,) float64 targets in normalized units (|y| <= 1).
        weight: (rows,) float64 row weight 1 / n_i of the row's user.
        user: (rows,) int64 index of the row's user in 0..users-1.
        users: number of users (the m of the round).
    """

    X: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    user: torch.Tensor
    users: int

    @property
    def dim(self) -> int:
        return self.X.shape[1]

    def gram(self) -> torch.Tensor:
        """S = sum_i (1/n_i) X_i^T X_i (d x d)."""
        return (self.X * self.weight[:, None]).T @ self.X

    def moment(self) -> torch.Tensor:
        """b = sum_i (1/n_i) X_i^T y_i (d,)."""
        return self.X.T @ (self.weight * self.y)

    def gram_matvec(self, v: torch.Tensor) -> torch.Tensor:
        """S v without forming S (for large d)."""
        return self.X.T @ (self.weight * (self.X @ v))

    def per_user_moments(self) -> torch.Tensor:
        """(users, d) rows b_i = (1/n_i) X_i^T y_i."""
        out = torch.zeros(self.users, self.dim, dtype=self.X.dtype)
        out.index_add_(0, self.user, (self.weight * self.y)[:, None] * self.X)
        return out

    def per_user_grads(self, w: torch.Tensor) -> torch.Tensor:
        """(users, d) gradients grad L_i(w) = (2/n_i) X_i^T (X_i w - y_i)."""
        resid = self.weight * (self.X @ w - self.y)
        out = torch.zeros(self.users, self.dim, dtype=self.X.dtype)
        out.index_add_(0, self.user, 2.0 * resid[:, None] * self.X)
        return out

    def loss(self, w: torch.Tensor) -> torch.Tensor:
        """sum_i L_i(w) for one w (d,) or many (K, d) candidates at once."""
        if w.dim() == 1:
            return (self.weight * (self.X @ w - self.y) ** 2).sum()
        # sum_i L_i(w) = w^T S w - 2 b^T w + sum_i (1/n_i) ||y_i||^2 (cheap for many candidates)
        quad = ((w @ self.gram()) * w).sum(1)
        return quad - 2.0 * (w @ self.moment()) + (self.weight * self.y ** 2).sum()


class LeastSquaresOracle:
    """Base class: validates and clips per-user data, then ``_solve_private`` or the exact solve.

    Each oracle declares its own defaults of ``x_bound``, ``y_bound`` and ``ridge`` (the settings its family of
    learners runs with: ssp and exp_mech DP-NPG's, dp_gd DP-REBEL's, exact the twins').

    Args:
        x_bound: declared bound on each feature row's l2 norm (rows are clipped to it); None (exact
            oracle only): no clipping.
        y_bound: declared bound on each target's absolute value (targets are clipped to it); None
            (exact oracle only): no clipping.
        ridge: ridge coefficient (normalized units) of F(w).
        rows_bound: rows per user at which a user reaches full weight (None: each user weight 1).
        cg_iters: conjugate-gradient iterations of the exact solver when d > 1024 (or always if set).
        seed: seed of the oracle's own public randomness (e.g. the exp_mech candidate cover).
    """

    name = "base"
    private_capable = True
    # what a learner asks of its oracle, declared here with the defaults and overridden where an oracle differs
    pure_dp = False             # every release is pure eps-DP (delta = 0): exp_mech's
    gaussian_sums = False       # releases through the one release of clipped Gaussian sums (correlated noise): dp_gd's
    uses_public_gram = False    # a learner's public Gram matrix (its Fisher) replaces a released one: ssp's
    PUBLIC_GRAM_IGNORES: tuple = ()   # its keys that do nothing when it takes that public Gram matrix
    max_dim: int | None = None  # the largest dimension it works in (d x d statistics, a cover of R^d); None: any
    sharded = False             # solved on rank 0 of a multi-process run (``dppo.training.distributed``'s wrapper)

    def __init__(self, *, x_bound: float | None, y_bound: float | None, ridge: float,
                 rows_bound: int | None = None, cg_iters: int | None = None, seed: int = 0):
        for key, val in (("x_bound", x_bound), ("y_bound", y_bound)):
            if val is None and self.private_capable:
                raise ConfigError(f"oracle {self.name}: {key} must be set (the sensitivity depends on it)")
            if val is not None and not (val > 0 and math.isfinite(val)):
                raise ConfigError(f"oracle {self.name}: {key} must be a positive finite number, got {val}")
        if ridge < 0:
            raise ConfigError(f"oracle {self.name}: ridge must be >= 0, got {ridge}")
        # None (exact oracle only): no clipping, unit scale
        self.x_bound = 1.0 if x_bound is None else float(x_bound)
        self.y_bound = 1.0 if y_bound is None else float(y_bound)
        self.clip_rows = x_bound is not None, y_bound is not None
        self.ridge = float(ridge)
        self.rows_bound = None if rows_bound is None else int(rows_bound)
        self.cg_iters = None if cg_iters is None else int(cg_iters)
        self.seed = int(seed)
        self.last_release: dict | None = None

    def state_dict(self) -> dict:
        """Oracle state carried across rounds (none by default; ssp's averaged Gram matrix)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None

    # ---- data --------------------------------------------------------------------------------
    def prepare(self, users) -> UserRegression:
        """Validate per-user (features, targets), clip rows to the bounds, normalize.

        Raises:
            DataError: on non-finite values or mismatched shapes.
        """
        users = list(users)
        if not users:
            raise DataError(f"oracle {self.name}: no users in this round")
        Xs, ys, ws, us = [], [], [], []
        dim = None
        for i, (X, y) in enumerate(users):
            X = torch.as_tensor(X, dtype=torch.float64)
            y = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
            if X.dim() == 1:
                X = X[None, :]
            if X.shape[0] != y.shape[0] or X.shape[0] == 0:
                raise DataError(f"oracle {self.name}: user {i} has {X.shape[0]} feature rows and {y.shape[0]} targets")
            dim = X.shape[1] if dim is None else dim
            if X.shape[1] != dim:
                raise DataError(f"oracle {self.name}: user {i} has feature dimension {X.shape[1]}, expected {dim}")
            if not (torch.isfinite(X).all() and torch.isfinite(y).all()):
                raise DataError(f"oracle {self.name}: user {i} has non-finite features or targets")
            if self.clip_rows[0]:
                norms = X.norm(dim=1, keepdim=True)
                X = X * torch.clamp(self.x_bound / norms.clamp_min(1e-300), max=1.0) / self.x_bound
            if self.clip_rows[1]:
                y = y.clamp(-self.y_bound, self.y_bound) / self.y_bound
            n = X.shape[0] if self.rows_bound is None else max(X.shape[0], self.rows_bound)
            Xs.append(X), ys.append(y)
            ws.append(torch.full((X.shape[0],), 1.0 / n, dtype=torch.float64))
            us.append(torch.full((X.shape[0],), i, dtype=torch.int64))
        return UserRegression(torch.cat(Xs), torch.cat(ys), torch.cat(ws), torch.cat(us), len(users))

    def to_original(self, w_normalized: torch.Tensor) -> torch.Tensor:
        """w = w' * y_bound / x_bound (so that x . w = y_bound * x' . w')."""
        return w_normalized * (self.y_bound / self.x_bound)

    # ---- solve -------------------------------------------------------------------------------
    def solve(self, users, *, privacy=None, round: int = 0, eps: float | None = None,
              delta: float | None = None, public_gram: torch.Tensor | None = None, ids=None) -> torch.Tensor:
        """Minimize F(w) over one round's users; private iff ``privacy.private``.

        Args:
            users: iterable of per-user ``(features (n_i, d), targets (n_i,))``.
            privacy: the PrivacyContext (None or non-private: exact least squares, nothing released).
            round: round index recorded in the ledger.
            eps, delta: this release's budget (default: the context's per-round eps, delta).
            public_gram: optional data-independent estimate of E[x x^T] (d x d, original units), e.g.
                a Fisher matrix at public reference states; oracles that can use it (ssp) then
                spend no budget on X^T X. Ignored without privacy (the exact Gram is used).
            ids: the users' ids, in ``users``' order (the release of clipped sums checks them against the round's
                and the run's users: ``dppo.privacy.users``); None: their positions 0..m-1.

        Returns:
            w (d,) float64 in the original units of the features and targets.
        """
        data = self.prepare(users)
        if privacy is None or not privacy.private:
            return self.to_original(exact_ridge(data, self.ridge, self.cg_iters))
        eps = privacy.eps if eps is None else float(eps)
        delta = privacy.delta if delta is None else float(delta)
        self.public_gram = None
        if public_gram is not None:  # in normalized units, summed over users: m E[x' x'^T]
            self.public_gram = public_gram.to(torch.float64) * data.users / self.x_bound ** 2
        if ids is not None and len(ids) != data.users:
            raise DataError(f"oracle {self.name}: {len(ids)} user ids for {data.users} users")
        return self.to_original(self._solve_private(data, privacy, round, eps, delta, ids))

    def exact(self, users) -> torch.Tensor:
        """The non-private minimizer of F on the same clipped data (the reference solution)."""
        return self.to_original(exact_ridge(self.prepare(users), self.ridge, self.cg_iters))

    def _solve_private(self, data: UserRegression, privacy, round: int, eps: float, delta: float,
                       ids=None) -> torch.Tensor:
        raise NotImplementedError


class ExactOracle(LeastSquaresOracle):
    """Non-private least squares (NPG / REBEL without privacy: the twins' oracle); refuses a private context.

    Args:
        x_bound, y_bound: null (the default): the rows are not clipped.
        ridge: ridge coefficient of F(w).
        (others: see LeastSquaresOracle)
    """

    name = "exact"
    private_capable = False

    def __init__(self, *, x_bound: float | None = None, y_bound: float | None = None, ridge: float = 0.01, **kwargs):
        super().__init__(x_bound=x_bound, y_bound=y_bound, ridge=ridge, **kwargs)

    def _solve_private(self, data, privacy, round, eps, delta, ids=None):
        raise ConfigError("oracle 'exact' is not private; with eps set choose oracle=ssp, dp_gd or exp_mech")


def exact_ridge(data: UserRegression, ridge: float, cg_iters: int | None = None) -> torch.Tensor:
    """argmin_w sum_i L_i(w) + ridge ||w||^2 = (S + ridge I)^+ b (normal equations).

    Direct (pseudo-inverse) solve for d <= 1024, else conjugate gradients with S v products.
    """
    d = data.dim
    if cg_iters is None and d <= 1024:
        A = data.gram() + ridge * torch.eye(d, dtype=torch.float64)
        return torch.linalg.lstsq(A, data.moment()[:, None], driver="gelsd").solution[:, 0]
    return conjugate_gradient(lambda v: data.gram_matvec(v) + ridge * v, data.moment(), cg_iters or 50)


def conjugate_gradient(matvec, b: torch.Tensor, iters: int, tol: float = 1e-10) -> torch.Tensor:
    """Solve A x = b for symmetric PSD A given by ``matvec`` (Hestenes-Stiefel CG from x = 0)."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = r @ r
    for _ in range(iters):
        if rr <= tol:
            break
        Ap = matvec(p)
        alpha = rr / (p @ Ap).clamp_min(1e-300)
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = r @ r
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def project_ball(w: torch.Tensor, radius: float | None) -> torch.Tensor:
    """Euclidean projection onto {||w|| <= radius} (identity if radius is None)."""
    if radius is None:
        return w
    n = w.norm()
    return w if n <= radius else w * (radius / n)
