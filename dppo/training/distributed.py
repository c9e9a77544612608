"""Multi-process training under ``torchrun``: ranks, user shards, and the collectives of one release.

``torchrun --nproc_per_node=N train.py ...`` starts N copies of the run. Backend (``from_env``): NCCL when
CUDA is available with a GPU per local rank (collective buffers then live on the rank's GPU), gloo
otherwise (CPU); the learners compute on the CPU either way. Each
round, rank 0's sampler draws the round's users (journalled there before anyone touches them) and
broadcasts the list; rank r takes the contiguous shard ``shard_bounds(m, N, r)`` of it, so each user's
whole group of rollouts is collected on one rank, from that user's own random streams (contract C4:
a user's data is the same on any rank). Each rank computes its users' contributions: PG / DP-PG and PPO /
DP-PPO clip their users' gradients and sum them (``ShardedSums``: rank 0 opens the round for every rank's users,
adds the ranks' sums in rank order, draws the noise once and records the release); NPG / REBEL and their DP twins
gather their users' regression rows to rank 0 in user order, whose oracle clips and combines them exactly as a
single process does (``ShardedOracle``). The released vector reaches every rank bit for bit, and every rank
applies it. So the release has exactly the single-process distribution, and with seeded noise
(``privacy.secure_rng=false``) an N-process run and a 1-process run with the same seed write the same ledger and
release the same vectors up to the order of the float64 sums of the clipped gradients (a sum per rank, then across
ranks), so their final parameters agree to float32 rounding.

Only rank 0 writes (checkpoints, logs, ledger, journal, summary); on resume rank 0 loads the
checkpoint and broadcasts the learner state. Every collective has a timeout (``DPPO_DIST_TIMEOUT_S``,
default 300 s): a rank that dies mid-round leaves the others blocked in the gather until it expires,
and the run ends there, before rank 0 can release anything of that round.

Cost: a clipped sum moves one parameter vector per rank to rank 0 (float64: a LoRA-adapted LM with 10^5 adapter
parameters, 0.8 MB per rank and sum), whatever the number of users; each rank may form its sum by the fused path
(``dppo.policies.per_user_grads.fused``), never holding its users' gradient rows. The oracle learners' rows are
gathered: rows x (dim + 1) float64 values per round.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch

import dppo.errors as errors

TIMEOUT_ENV = "DPPO_DIST_TIMEOUT_S"
BACKEND_ENV = "DPPO_DIST_BACKEND"


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the run: ``rank`` of ``world_size`` (1 = single process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """Where collective buffers live (NCCL needs the rank's GPU)."""
        if self.backend == "nccl":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")


SINGLE = DistInfo()


def from_env() -> DistInfo:
    """The ranks ``torchrun`` announces (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    backend = pick_backend(torch.cuda.is_available(), torch.cuda.device_count() if torch.cuda.is_available() else 0,
                           local_world, os.environ.get(BACKEND_ENV))
    return DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")), backend)


def pick_backend(cuda: bool, devices: int, local_world: int, requested: str | None = None) -> str:
    """NCCL when CUDA is available with at least one GPU per process of this node (and torch has NCCL),
    gloo otherwise; ``DPPO_DIST_BACKEND=gloo|nccl`` forces one (nccl without enough GPUs is refused)."""
    import torch.distributed as dist

    nccl_ok = cuda and devices >= local_world and dist.is_available() and dist.is_nccl_available()
    if requested:
        if requested not in ("gloo", "nccl"):
            raise errors.ConfigError(f"{BACKEND_ENV} must be gloo or nccl, got {requested!r}")
        if requested == "nccl" and not nccl_ok:
            raise errors.ConfigError(f"{BACKEND_ENV}=nccl needs CUDA, NCCL and one GPU per process "
                                     f"({devices} GPUs for {local_world} processes on this node)")
        return requested
    return "nccl" if nccl_ok else "gloo"


def init() -> DistInfo:
    """Join the process group of a ``torchrun`` launch (idempotent); returns ``SINGLE`` outside one."""
    info = from_env()
    if not info.enabled:
        return info
    import torch.distributed as dist

    if not dist.is_initialized():
        bind_group_defaults_early()
        timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "300")))
        if info.backend == "nccl":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(info.backend, timeout=timeout)
    return info


# torch modules whose functions take ``group=group.WORLD`` as a default argument, bound when the module is
# imported: imported after the group exists, they hold it for the life of the interpreter.
GROUP_DEFAULT_MODULES = ("torch.distributed.nn.functional",)


def bind_group_defaults_early() -> None:
    """Import the torch modules that bind the default process group at import time before the group exists.

    torch.distributed.nn.functional (10 collectives with ``group=group.WORLD`` defaults) is imported lazily by
    torch itself: building the first optimizer imports torch._dynamo, which imports FSDP and, through it, that
    module. After ``init_process_group`` those defaults are references to the group that
    ``destroy_process_group`` cannot clear, so the gloo group (and its worker threads) outlived ``shutdown``
    and was only torn down while the interpreter exited. A worker thread still dropping its last finished
    work (a gather whose byte tensors were made in Python) then needed the GIL of an interpreter that was
    finalising: the thread was unwound inside a noexcept destructor and the process aborted ("terminate called
    without an active exception", SIGABRT, after the run had written its summary). Imported before the group
    exists, the defaults are None and ``shutdown`` really destroys the group: its destructor waits for the
    worker threads with the GIL released, so they finish while Python is alive."""
    import importlib

    for name in GROUP_DEFAULT_MODULES:
        importlib.import_module(name)


def shutdown(info: DistInfo, clean: bool = False) -> None:
    """Leave the process group, on every rank, before the interpreter exits. ``clean``: every rank got here on
    the normal path, so they meet at a barrier first: no rank tears down its transport while a peer's last
    collective is still in flight. Then the group is destroyed (in a ``finally``, whatever the barrier did):
    with nothing else holding it (``bind_group_defaults_early``) its backend is freed here, and gloo's worker
    threads are joined while Python is alive, not left to the interpreter's exit."""
    import torch.distributed as dist

    if info.enabled and dist.is_initialized():
        try:
            if clean:
                try:
                    dist.barrier()
                except RuntimeError:  # a peer is gone: nothing left to wait for
                    pass
        finally:
            dist.destroy_process_group()


# ---- sharding ---------------------------------------------------------------------------------------
def shard_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """Contiguous, balanced split of ``n`` items: the first ``n % world`` ranks get one more."""
    base, extra = divmod(int(n), int(world))
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def shard(items: list, info: DistInfo) -> list:
    """This rank's contiguous share of a round's users (concatenated in rank order they are ``items``)."""
    lo, hi = shard_bounds(len(items), info.world_size, info.rank)
    return list(items[lo:hi])


# ---- collectives ------------------------------------------------------------------------------------
def broadcast_object(obj, info: DistInfo):
    """Rank 0's ``obj`` on every rank (pickled)."""
    if not info.enabled:
        return obj
    import torch.distributed as dist

    box = [obj if info.is_main else None]
    dist.broadcast_object_list(box, src=0, device=info.device if info.backend == "nccl" else None)
    return box[0]


def broadcast_tensor(t: torch.Tensor | None, shape, dtype, info: DistInfo) -> torch.Tensor:
    """Rank 0's tensor ``t`` (given ``shape``/``dtype``) on every rank, bit for bit."""
    if not info.enabled:
        return t
    import torch.distributed as dist

    buf = (t.to(info.device, dtype) if info.is_main else torch.empty(tuple(shape), dtype=dtype, device=info.device))
    dist.broadcast(buf.contiguous(), src=0)
    return buf.cpu()


def gather_rows(local: torch.Tensor, n_total: int, info: DistInfo) -> torch.Tensor | None:
    """Rows of every rank's shard, concatenated in rank order on rank 0 (``None`` elsewhere).

    ``local`` is this rank's ``(shard size, ...)`` block of an ``n_total``-row matrix split by
    ``shard_bounds``; shards are padded to the largest for the collective and trimmed on arrival.
    """
    if not info.enabled:
        return local
    import torch.distributed as dist

    sizes = [hi - lo for lo, hi in (shard_bounds(n_total, info.world_size, r) for r in range(info.world_size))]
    if local.shape[0] != sizes[info.rank]:
        raise errors.DPPOError(f"rank {info.rank} holds {local.shape[0]} rows, its shard has {sizes[info.rank]}")
    k = max(sizes)
    buf = torch.zeros((k,) + tuple(local.shape[1:]), dtype=local.dtype, device=info.device)
    buf[: local.shape[0]] = local.to(info.device)
    parts = [torch.empty_like(buf) for _ in range(info.world_size)] if info.is_main else None
    dist.gather(buf, parts, dst=0)
    if not info.is_main:
        return None
    return torch.cat([p[:s].cpu() for p, s in zip(parts, sizes)])


def on_main(fn, info: DistInfo):
    """Run ``fn()`` on rank 0 and hand its result to every rank; an error rank 0 raises (a spent budget,
    a refused release) is raised on every rank, so all ranks leave the round together."""
    if not info.enabled:
        return fn()
    outcome = None
    if info.is_main:
        try:
            outcome = ("ok", fn())
        except errors.DPPOError as err:
            outcome = ("error", type(err).__name__, str(err))
    outcome = broadcast_object(outcome, info)
    if outcome[0] == "error":
        cls = getattr(errors, outcome[1], errors.DPPOError)
        raise cls(outcome[2])
    return outcome[1]


def gather_objects(obj, info: DistInfo) -> list | None:
    """Every rank's ``obj`` in rank order on rank 0 (``None`` elsewhere); pickled, any sizes."""
    if not info.enabled:
        return [obj]
    import torch.distributed as dist

    parts = [None] * info.world_size if info.is_main else None
    dist.gather_object(obj, parts, dst=0)
    return parts


class ShardedOracle:
    """The least-squares oracle of NPG / REBEL (and their DP twins) under ``torchrun``.

    Each rank builds the regression rows (X_i, y_i) of its own users (their rollouts and features: the
    per-user work); ``solve`` gathers them to rank 0 in user order (rank 0's shard first: the round's
    user order), and rank 0's oracle solves exactly as one process does: it clips each user's block,
    sums the per-user statistics (SSP: X^T X and the clipped X^T y; dp_gd: the clipped per-user
    gradients of every step), draws the noise once and records the release. The solution w reaches
    every rank (pickled: bit for bit), so all ranks step identically. Errors rank 0 raises (a refused
    release) are raised on every rank. Cost: the round's rows, rows x (dim + 1) float64 values (CartPole,
    8 users x 8 rollouts x 200 steps x dim 8: 0.9 MB), gathered once per round.
    """

    sharded = True

    def __init__(self, oracle, info: DistInfo):
        self.inner, self.info = oracle, info

    def solve(self, users, *, ids=None, **kwargs):
        rows = [(torch.as_tensor(X).detach().cpu(), torch.as_tensor(y).detach().cpu()) for X, y in users]
        parts = gather_objects((rows, None if ids is None else [int(u) for u in ids]), self.info)
        def solve():   # on rank 0: every rank's rows and ids, in rank order
            everyone = None if any(i is None for _, i in parts) else [u for _, i in parts for u in i]
            return self.inner.solve([r for part, _ in parts for r in part], ids=everyone, **kwargs)

        return on_main(solve, self.info)

    def __getattr__(self, name):  # name, last_release, state_dict, ... are the wrapped oracle's
        if name == "inner":  # not set yet (copy / unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)


class ShardedSampler:
    """Wraps the run's sampler: rank 0 draws (and journals) the round's users, every rank receives the
    list and gets its contiguous shard; the learner sees only its shard (its whole per-user code is
    unchanged), ``round_users`` is the full list."""

    def __init__(self, sampler, info: DistInfo):
        self.inner, self.info = sampler, info
        self.round_users: list[int] = []

    def next_round(self) -> list[int]:
        users = on_main(lambda: [int(u) for u in self.inner.next_round()], self.info)
        self.round_users = users
        return shard(users, self.info)

    def take(self, m: int) -> list[int]:
        raise errors.ConfigError("multi-process training shards the users of a round; this learner draws users "
                                 "one by one (sampler.take) and runs in one process only")

    def __getattr__(self, name):  # state_dict, used, burn, journal, multi_pass, ... are the wrapped sampler's
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name in ("inner", "info", "round_users"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)


class ShardedSums:
    """A round's release of clipped sums (``dppo.privacy.composed``: DP-PG's one sum, DP-PPO's parts) under
    ``torchrun``.

    The round opens on rank 0 for every rank's users (one ledger entry, as in one process). For each sum, a rank
    clips its own users' rows and sums them (``release_sum``: ``clipped_total``; no rows: a zero vector) or hands
    a clipped sum it formed by the fused path (``release_clipped_sum``); the sums, norms and ids are gathered to
    rank 0 in rank order (the users' order: shards are contiguous), added there, and rank 0's release checks the
    users and draws the noise once (``release_clipped_sum``); the released vector reaches every rank bit for bit.
    Against one process only the order of the float64 sum of the clipped gradients differs. Both calls make the
    same collective, so ranks may take different paths for the same sum.
    """

    def __init__(self, release, sampler: "ShardedSampler", info: DistInfo):
        self.inner, self.sampler, self.info = release, sampler, info
        self._noise_std: dict = {}   # rank 0's noise std of each part's last sum (a correlated stream's: rank 0's)

    def round_users(self, users: list[int]) -> tuple[list[int], int]:
        everyone = list(self.sampler.round_users)
        return everyone, shard_bounds(len(everyone), self.info.world_size, self.info.rank)[0]

    def open_round(self, round_idx: int, users, clips, *, dim: int | None = None):
        return on_main(lambda: self.inner.open_round(round_idx, users, clips, dim=dim), self.info)

    def release_sum(self, per_user, users, clip: float, part=None):
        from dppo.privacy.release import clipped_total

        return self.release_clipped_sum(*clipped_total(per_user, clip), users, clip, part)

    def release_clipped_sum(self, total, norms, users, clip: float, part=None):
        parts = gather_objects((total.double(), norms.double(), [int(u) for u in users]), self.info)
        kept = {}

        def main():
            rows = [p for p in parts if p[2]] or parts[:1]
            total = rows[0][0].clone()
            for t, _, _ in rows[1:]:
                total += t
            vec, stats = self.inner.release_clipped_sum(total, torch.cat([n for _, n, _ in parts]),
                                                        [u for _, _, ids in parts for u in ids], clip, part)
            kept["vec"] = vec
            return tuple(vec.shape), vec.dtype, stats, self.inner.noise_std(clip, part)

        shape, dtype, stats, self._noise_std[part] = on_main(main, self.info)
        return broadcast_tensor(kept.get("vec"), shape, dtype, self.info), stats

    def noise_std(self, clip: float | None = None, part=None) -> float:
        """The public noise std of ``part``'s last sum, as rank 0's release drew it (the same on every rank)."""
        return self._noise_std[part] if part in self._noise_std else self.inner.noise_std(clip, part)

    def __getattr__(self, name):  # sigma, noise_multiplier, parts, mechanism, private, ... are the release's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class Shards:
    """The collective parts a learner wraps itself with (``Learner.distribute``): this rank's share of each
    round's users, and the release that combines every rank's contributions on rank 0."""

    def __init__(self, info: DistInfo):
        self.info = info

    def sampler(self, sampler) -> ShardedSampler:
        return ShardedSampler(sampler, self.info)

    def round_release(self, release, sampler: ShardedSampler) -> ShardedSums:
        """A round's release of clipped sums (``dppo.privacy.composed``) whose noise rank 0 draws once."""
        return ShardedSums(release, sampler, self.info)

    def oracle(self, oracle) -> ShardedOracle:
        return ShardedOracle(oracle, self.info)


def attach(learner, info: DistInfo) -> None:
    """Make a built learner multi-process through the interface it offers (``learner.distribute``); a
    learner that runs in one process only refuses with one line."""
    learner.distribute(Shards(info))


SUMMED = ("rollout/users", "rollout/episodes", "diag/env_steps")


def merge_metrics(metrics: dict, n_local: int, info: DistInfo) -> dict:
    """One round's metrics of every rank combined on rank 0: counts summed, other ``diag/*`` statistics
    averaged with weights = users per rank; released quantities (the same on every rank) from rank 0."""
    if not info.enabled:
        return metrics
    import torch.distributed as dist

    parts = [None] * info.world_size if info.is_main else None
    dist.gather_object((metrics, int(n_local)), parts, dst=0)
    if not info.is_main:
        return metrics
    total = sum(n for _, n in parts) or 1
    out = dict(metrics)
    for key, value in metrics.items():
        if not isinstance(value, (int, float)):
            continue
        values = [(m.get(key), n) for m, n in parts if n > 0 or key in SUMMED]
        if not values or any(v is None for v, _ in values):
            continue
        if key in SUMMED:
            out[key] = type(value)(sum(v for v, _ in values))
        elif key.startswith("diag/"):
            out[key] = float(sum(v * n for v, n in values) / total)
    return out
