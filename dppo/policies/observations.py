"""Observation spaces as Stable-Baselines3 handles them: what a rollout stores and what a network sees.

An observation is stored compactly as a float32 vector (``ObservationLayout.encode``), and the policy's first
module (``ObservationEncoder``) turns it into the network's input:

* ``Box``: flattened (stored and seen as is);
* ``Discrete(n)``: stored as its index (1 float), seen one-hot (n);
* ``MultiDiscrete(nvec)``: stored as its k indices, seen as k one-hots (sum of nvec);
* ``MultiBinary(n)``: stored and seen as its n bits;
* ``Tuple`` / ``Dict`` of these: the parts concatenated (a Dict in its keys' order).

Storing the index instead of the one-hot keeps a round's buffers at (steps x k) floats, whatever n is
(ICU-Sepsis: 716 states, 1 float per step). Other spaces (Text, Graph, Sequence) are refused in one line
naming a wrapper.
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dppo.errors import ConfigError


@dataclass(frozen=True)
class Part:
    """One leaf of the space: ``kind`` box | discrete | multidiscrete | multibinary; ``raw`` stored floats;
    ``sizes`` one-hot widths (discrete kinds); ``start`` offsets subtracted when stored; ``space`` the leaf."""

    kind: str
    raw: int
    sizes: tuple = ()
    start: tuple = ()
    space: gym.Space | None = None

    @property
    def features(self) -> int:
        return int(sum(self.sizes)) if self.kind in ("discrete", "multidiscrete") else self.raw


def _parts(space: gym.Space, where: str) -> list[Part]:
    S = gym.spaces
    if isinstance(space, S.Box):
        return [Part("box", int(np.prod(space.shape)) if space.shape else 1, space=space)]
    if isinstance(space, S.Discrete):
        return [Part("discrete", 1, (int(space.n),), (int(space.start),), space)]
    if isinstance(space, S.MultiDiscrete):
        nvec, start = np.asarray(space.nvec).reshape(-1), np.asarray(space.start).reshape(-1)
        return [Part("multidiscrete", len(nvec), tuple(int(v) for v in nvec), tuple(int(v) for v in start), space)]
    if isinstance(space, S.MultiBinary):
        return [Part("multibinary", int(np.prod(space.shape)), space=space)]
    if isinstance(space, S.Tuple):
        return [p for i, s in enumerate(space.spaces) for p in _parts(s, f"{where}[{i}]")]
    if isinstance(space, S.Dict):
        return [p for k, s in space.spaces.items() for p in _parts(s, f"{where}[{k!r}]")]
    raise ConfigError(f"the observation space{where if where else ''} is {type(space).__name__}, which the neural "
                      f"policies cannot read (they take Box, Discrete, MultiDiscrete, MultiBinary and Tuple/Dict of "
                      f"these); map it to a Box with a wrapper: env.wrappers=[my_pkg.MyObservationWrapper]")


class ObservationLayout:
    """The compact storage of one observation space (module docstring)."""

    def __init__(self, space: gym.Space):
        self.space = space
        self.parts = _parts(space, "")
        self.is_box = isinstance(space, gym.spaces.Box)
        self.raw_dim = sum(p.raw for p in self.parts)
        self.feature_dim = sum(p.features for p in self.parts)

    def _leaves(self, obs) -> list:
        out = []

        def walk(space, x):
            if isinstance(space, gym.spaces.Tuple):
                for s, xi in zip(space.spaces, x):
                    walk(s, xi)
            elif isinstance(space, gym.spaces.Dict):
                for k, s in space.spaces.items():
                    walk(s, x[k])
            else:
                out.append(x)

        walk(self.space, obs)
        return out

    def encode(self, obs) -> np.ndarray:
        """One observation -> (raw_dim,) float32 (indices minus the space's start for the discrete kinds)."""
        if self.is_box:
            return np.asarray(obs, dtype=np.float32).reshape(-1)
        vals = []
        for part, x in zip(self.parts, self._leaves(obs)):
            v = np.asarray(x, dtype=np.float64).reshape(-1)
            if part.start:
                v = v - np.asarray(part.start, dtype=np.float64)
            vals.append(v)
        return np.concatenate(vals).astype(np.float32)

    def encode_batch(self, obs, n: int) -> np.ndarray:
        """A vector env's batched observation (gymnasium's ``batch_space`` layout: an array with a leading axis of
        ``n``, a tuple / dict of those for Tuple / Dict spaces) -> (n, raw_dim) float32, in one call per leaf."""
        if self.is_box:
            return np.asarray(obs, dtype=np.float32).reshape(n, -1)
        cols = [np.asarray(x).reshape(n, -1) for x in self._leaves(obs)]   # batched leaves nest as one's do
        out = np.empty((n, self.raw_dim), dtype=np.float32)
        lo = 0
        for part, v in zip(self.parts, cols):
            out[:, lo:lo + part.raw] = v - np.asarray(part.start, dtype=np.int64) if part.start else v
            lo += part.raw
        return out

    def contains(self, obs) -> bool:
        """Whether ``obs`` is one observation of the space (else a batch)."""
        try:
            return bool(self.space.contains(obs))
        except Exception:  # noqa: BLE001 - a batch of observations is not an element
            return False


class BoundsScaling(nn.Module):
    """s -> (2 s - (high + low)) / (high - low) on the coordinates with finite bounds (fixed buffers, no parameters)."""

    def __init__(self, observation_space: gym.spaces.Box):
        super().__init__()
        low = torch.as_tensor(observation_space.low, dtype=torch.float32).reshape(-1)
        high = torch.as_tensor(observation_space.high, dtype=torch.float32).reshape(-1)
        bounded = torch.isfinite(low) & torch.isfinite(high) & (high > low)
        width = torch.where(bounded, high - low, torch.full_like(low, 2.0))
        centre = torch.where(bounded, (high + low) / 2, torch.zeros_like(low))
        self.register_buffer("centre", centre)
        self.register_buffer("half_width", width / 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.centre) / self.half_width


class ObservationEncoder(nn.Module):
    """(N, raw_dim) stored observations -> (N, feature_dim) network inputs: one-hots for the discrete parts,
    Box and MultiBinary parts as they are (Box parts bounds-scaled onto [-1, 1] with ``normalize``). No
    parameters; the one-hot is a comparison with fixed buffers, so per-user gradients pass through it.

    ``indices``: a layout of discrete parts only, followed by an ``IndexLinear``: the stored indices pass through
    as they are (the next layer reads its columns by index instead of multiplying a one-hot row)."""

    def __init__(self, layout: ObservationLayout, normalize: bool = False, indices: bool = False):
        super().__init__()
        self.layout, self.indices = layout, bool(indices)
        self.slices = []
        offset = 0
        for i, part in enumerate(layout.parts):
            self.slices.append((part.kind, offset, part.raw, part.sizes))
            if part.kind == "box" and normalize:
                self.add_module(f"scale{i}", BoundsScaling(part.space))
            offset += part.raw
        for i, (_, _, _, sizes) in enumerate(self.slices):
            for j, n in enumerate(sizes):
                self.register_buffer(f"levels{i}_{j}", torch.arange(n, dtype=torch.float32), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.flatten(start_dim=1) if obs.dim() > 2 else obs
        if self.indices:
            return x
        out = []
        for i, (kind, lo, raw, sizes) in enumerate(self.slices):
            seg = x[:, lo:lo + raw]
            if kind in ("discrete", "multidiscrete"):
                for j in range(len(sizes)):
                    levels = getattr(self, f"levels{i}_{j}")
                    out.append((seg[:, j:j + 1] == levels).to(x.dtype))
            else:
                scale = getattr(self, f"scale{i}", None)
                out.append(seg if scale is None else scale(seg))
        return torch.cat(out, dim=1)


class IndexLinear(nn.Linear):
    """The first ``nn.Linear`` of a network over discrete observations (Discrete, MultiDiscrete, Tuple / Dict of
    these), fed the stored indices instead of their one-hot rows: y = b + sum_j W[:, offset_j + i_j], which is
    the Linear layer of the one-hot input (the same ``weight`` (out, sum of sizes) and ``bias``, the same state
    dict), at the cost of k column reads instead of a (sum of sizes)-wide product. An index outside its part's
    range reads nothing, as its one-hot row (all zeros) would. Its per-user gradients are sparse: user u's
    weight gradient is nonzero only in the columns u's rows visited (``dppo.policies.per_user_grads``: its norm
    from the rows' index matches, the clipped sum by an index add, never the (out, in) matrix per user)."""

    indexed_input = True   # what dppo.policies.per_user_grads reads: the input is column indices

    def __init__(self, layout: ObservationLayout, out_features: int):
        sizes = [n for part in layout.parts for n in part.sizes]
        super().__init__(int(sum(sizes)), out_features)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.register_buffer("offsets", torch.as_tensor(offsets), persistent=False)
        self.register_buffer("sizes", torch.as_tensor(sizes, dtype=torch.int64), persistent=False)

    def columns(self, x: torch.Tensor) -> torch.Tensor:
        """(N, k) stored indices -> (N, k) weight columns; ``in_features`` (one past the last) where invalid."""
        idx = x.long()
        ok = (x == idx.to(x.dtype)) & (idx >= 0) & (idx < self.sizes)
        return torch.where(ok, idx + self.offsets, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = self.columns(x)
        table = torch.cat([self.weight.t(), self.weight.new_zeros(1, self.out_features)])   # the last: nothing
        out = table.index_select(0, cols.reshape(-1)).view(*cols.shape, self.out_features).sum(-2)
        return out + self.bias if self.bias is not None else out


def indexed(layout: ObservationLayout) -> bool:
    """Whether every part of the layout is discrete (the first layer then reads columns by index)."""
    return all(part.kind in ("discrete", "multidiscrete") for part in layout.parts)


def input_layers(observation_space: gym.Space, normalize_obs: bool,
                 indices: bool = False) -> tuple[list[nn.Module], int, ObservationLayout]:
    """The modules before a network's first linear layer and its input width: a Box space as before (flattened,
    bounds-scaled with ``normalize_obs``), any other supported space through an ``ObservationEncoder``
    (``indices``: passing a discrete layout's indices through, for an ``IndexLinear``)."""
    layout = ObservationLayout(observation_space)
    if layout.is_box:
        return ([BoundsScaling(observation_space)] if normalize_obs else []), layout.raw_dim, layout
    return [ObservationEncoder(layout, normalize_obs, indices=indices)], layout.feature_dim, layout


ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp_body(observation_space: gym.Space, hidden_sizes, activation: str, normalize_obs: bool,
             key: str = "policy.activation") -> tuple[nn.Sequential, int, ObservationLayout]:
    """The trunk every network here shares: ``input_layers``, then ``Linear + activation`` per hidden size.
    Returns the trunk, its output width and the observation layout; ``key`` names the activation's config key."""
    if activation not in ACTIVATIONS:
        raise ConfigError(f"{key} must be one of {sorted(ACTIVATIONS)}, got '{activation}'")
    layout = ObservationLayout(observation_space)
    by_index = bool(hidden_sizes) and not layout.is_box and indexed(layout)   # discrete inputs: IndexLinear
    layers, width, layout = input_layers(observation_space, normalize_obs, indices=by_index)
    sizes = [width] + [int(h) for h in hidden_sizes]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [IndexLinear(layout, b) if by_index and i == 0 else nn.Linear(a, b), ACTIVATIONS[activation]()]
    return nn.Sequential(*layers), sizes[-1], layout
