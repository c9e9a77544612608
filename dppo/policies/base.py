"""The policy protocol shared by every neural learner (so any ``nn.Module`` can be trained).

A policy maps a batch of observations to a distribution over actions and provides
``sample(obs, greedy, generator) -> (actions, log_probs)`` and ``log_prob(obs, actions)`` (differentiable);
``forward(obs, actions)`` is ``log_prob`` so that per-user gradients work through ``torch.func``.
Continuous-action policies (``GaussianMLPPolicy``) also provide ``env_action(actions)``: the learner stores and
scores the distribution's sample, the environment receives ``env_action`` of it (squashed or clipped to the Box).
``predict`` is the everyday entry point (numpy in, numpy out, single or batched observations, as in SB3).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dppo.errors import DataError
# CPU matrix kernels round differently for very small batches (a GEMV path at 1 row, others below ~16
# rows): forward passes run on at least MIN_ROWS rows, so a row's result never depends on how many
# other rows share the batch (what keeps a user's data identical on any rank of a sharded run).
MIN_ROWS = 32


def pad_rows(x: torch.Tensor, rows: int = MIN_ROWS) -> torch.Tensor:
    """``x`` with copies of its first row appended up to ``rows`` rows (no-op when it has that many)."""
    if x.shape[0] >= rows or x.shape[0] == 0:
        return x
    return torch.cat([x, x[:1].expand(rows - x.shape[0], *x.shape[1:])])



def _leaf_shape(space) -> tuple:
    """The shape of one observation of a leaf space (a Discrete one: a scalar)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return ()
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(np.asarray(space.nvec).shape)
    return tuple(space.shape)


def _batch_size(space, obs) -> int | None:
    """None when ``obs`` is one observation of ``space``, N when it is a batch in gymnasium's batched layout (every
    leaf an array with a leading axis of N; a Tuple / Dict space: a tuple / dict of those); else a DataError."""
    import gymnasium as gym

    sizes = set()

    def walk(sp, x, where):
        if isinstance(sp, gym.spaces.Tuple):
            if not isinstance(x, (tuple, list)) or len(x) != len(sp.spaces):
                raise DataError(f"predict got {type(x).__name__} for the Tuple observation space{where}; expected a "
                                f"tuple of {len(sp.spaces)} parts")
            for i, (s, xi) in enumerate(zip(sp.spaces, x)):
                walk(s, xi, f"{where}[{i}]")
        elif isinstance(sp, gym.spaces.Dict):
            if not hasattr(x, "keys") or any(k not in x for k in sp.spaces):
                raise DataError(f"predict got {type(x).__name__} for the Dict observation space{where}; expected a "
                                f"dict with the keys {list(sp.spaces)}")
            for k, s in sp.spaces.items():
                walk(s, x[k], f"{where}[{k!r}]")
        else:
            shape, want = np.shape(x), _leaf_shape(sp)
            if shape == want:
                sizes.add(None)
            elif len(shape) == len(want) + 1 and shape[1:] == want:
                sizes.add(shape[0])
            else:
                one = "a scalar" if not want else f"shape {want}"
                raise DataError(f"predict got an observation of shape {shape} for the space {sp}{where}; expected "
                                f"{one} (one observation) or shape (N, {', '.join(map(str, want))}) (a batch)"
                                .replace(", )", ")"))

    walk(space, obs, "")
    if len(sizes) != 1:
        raise DataError("predict got a mix of single and batched parts, or batches of different sizes: "
                        f"{sorted(sizes, key=str)}")
    return sizes.pop()


def _check_indices(layout, rows: np.ndarray) -> None:
    """Refuse stored rows whose discrete parts are not indices of their space (a network would read nothing)."""
    lo = 0
    for part in layout.parts:
        seg = rows[:, lo:lo + part.raw]
        if part.kind in ("discrete", "multidiscrete"):
            ok = (seg == np.round(seg)) & (seg >= 0) & (seg < np.asarray(part.sizes, dtype=np.float32))
            if not ok.all():
                bad = rows[np.flatnonzero(~ok.all(1))[0], lo:lo + part.raw] + np.asarray(part.start or 0)
                shown = ", ".join(f"{v:g}" for v in bad.tolist())
                shown = f"[{shown}]" if part.kind == "multidiscrete" else shown
                raise DataError(f"predict got the observation {shown} for the space {part.space}: "
                                f"not one of its values")
        elif part.kind == "multibinary" and not np.isin(seg, (0.0, 1.0)).all():
            raise DataError(f"predict got a value other than 0 / 1 for the observation space {part.space}")
        lo += part.raw


def observation_rows(obs, layout=None, observation_shape: tuple | None = None) -> tuple[torch.Tensor, bool]:
    """(rows, single): ``obs`` as the rollout stores it, ``(N, raw_dim)`` float32 (``ObservationLayout.encode``:
    a Discrete observation is its index, the network one-hots it), and whether it was one observation.

    ``layout`` (a policy's ``obs_layout``) reads every space the policies take: a Discrete observation is an int
    (a batch: an array of ints), a MultiDiscrete / MultiBinary / Box one an array of the space's shape (a batch:
    ``(N, *shape)``), a Tuple / Dict one a tuple / dict of its parts (a batch: a list of such observations, or
    gymnasium's batched layout, a tuple / dict of arrays with a leading axis of N). Without a layout (a user's
    own policy), ``observation_shape`` (else: 1-d is one observation) tells one observation from a batch.
    """
    if layout is not None and not layout.is_box:
        import gymnasium as gym

        composite = isinstance(layout.space, (gym.spaces.Tuple, gym.spaces.Dict))
        if composite and isinstance(obs, list) and obs and all(_is_one(layout.space, o) for o in obs):
            rows = np.stack([layout.encode(o) for o in obs])        # a list of single observations
            single = False
        else:
            n = _batch_size(layout.space, obs)
            single = n is None
            rows = layout.encode(obs)[None] if single else layout.encode_batch(obs, n)
        _check_indices(layout, rows)
        return torch.as_tensor(rows, dtype=torch.float32), single
    x = torch.as_tensor(np.asarray(obs, dtype=np.float32))
    shape = tuple(observation_shape) if observation_shape is not None else None
    if shape is None:
        single = x.dim() <= 1
    elif tuple(x.shape) == shape:
        single = True
    elif tuple(x.shape[1:]) == shape:
        single = False
    else:
        raise DataError(f"predict got an observation of shape {tuple(x.shape)}; expected {shape} or (N, *{shape})")
    batch = x[None] if single else x
    if layout is not None or batch.dim() == 1:      # a Box space: stored flattened, as the rollout stores it
        batch = batch.reshape(batch.shape[0], -1)
    return batch, single


def _is_one(space, obs) -> bool:
    try:
        return _batch_size(space, obs) is None
    except DataError:
        return False


class PredictMixin:
    """``predict(obs, deterministic=False)`` for any policy implementing ``sample`` (and ``env_action``)."""

    observation_shape: tuple | None = None  # set by the constructor; tells a single observation from a batch

    def observation_rows(self, obs) -> tuple[torch.Tensor, bool]:
        """``obs`` (one observation or a batch, in the env's own form) as stored rows, and whether it was one
        (``observation_rows``; the policy's ``obs_layout`` if it has one)."""
        return observation_rows(obs, getattr(self, "obs_layout", None), self.observation_shape)

    @torch.no_grad()
    def predict(self, obs, deterministic: bool = False, generator: torch.Generator | None = None) -> np.ndarray:
        """Actions for one observation or a batch of them, in the env's own form: a Box observation is an array of
        ``observation_shape`` (a batch: ``(N, *observation_shape)``), a Discrete one an int (a batch: an array of
        N ints; the network sees it one-hot, as in the rollout), MultiDiscrete / MultiBinary / Tuple / Dict ones
        as ``observation_rows`` reads them.

        Returns numpy actions as the environment takes them: an integer (array of N integers) for Discrete
        spaces, a float vector (matrix) inside the Box for continuous ones, an index vector (matrix) for
        MultiDiscrete ones. ``deterministic=True`` takes the mode (argmax / the Gaussian mean); otherwise
        actions are sampled (from ``generator`` if given). Unlike SB3 there is no recurrent state, so the return
        value is the actions only (``SavedRun.predict`` returns SB3's ``(actions, None)``).
        """
        batch, single = self.observation_rows(obs)
        actions, _ = self.sample(batch, greedy=deterministic, generator=generator)
        env_actions = self.env_action(actions) if hasattr(self, "env_action") else actions
        out = env_actions.detach().cpu().numpy()
        return out[0] if single else out


class Policy(PredictMixin, nn.Module):
    """A stochastic policy over discrete actions.

    Subclasses implement ``logits(obs)``; ``sample`` and ``log_prob`` follow. A user's own module
    only has to provide ``logits`` (or override ``sample``/``log_prob``) to be trainable by PG/NPG.
    """

    continuous = False

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.logits(obs))

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, greedy: bool = False, generator: torch.Generator | None = None):
        """Actions and their log-probabilities for a batch of observations."""
        logits = self.logits(pad_rows(obs))[: obs.shape[0]]
        logp_all = torch.log_softmax(logits, dim=-1)
        if greedy:
            actions = logits.argmax(-1)
        else:
            u = torch.rand(logits.shape[0], 1, generator=generator, dtype=logp_all.dtype)
            cdf = logp_all.exp().cumsum(-1)
            actions = (cdf < u).sum(-1).clamp_max(logits.shape[-1] - 1)  # inverse-CDF sampling
        return actions, logp_all.gather(-1, actions[:, None]).squeeze(-1)

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(actions | obs), differentiable in the parameters."""
        return torch.log_softmax(self.logits(obs), dim=-1).gather(-1, actions.long()[..., None]).squeeze(-1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``forward`` is ``log_prob`` so that ``torch.func.functional_call`` can differentiate it per user."""
        return self.log_prob(obs, actions)
