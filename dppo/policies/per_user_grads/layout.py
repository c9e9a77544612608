"""The layout of one forward pass: every user's rows as consecutive slots, users in buckets of equal length.

A per-user sum (of row products, of rows) is then one batched operation per bucket whose every float
operation reads one user's rows only (``Groups``). ``flat_rows`` and ``user_groups`` turn the engine's two
input forms (rows padded per user, or flat rows with a user index) into that layout; ``pad_users`` is the
padded form of flat rows for the ``torch.func`` vmap over users.
"""
from __future__ import annotations

import numpy as np
import torch

from dppo.policies.base import MIN_ROWS

PAD_MULTIPLE = 1  # a user's rows are padded to a multiple of this (1: none; larger: fewer distinct lengths)
# above this many buckets (runs of consecutive users with equal row counts) the users are laid out by length
# class (``by_length_class``): one batched product per class instead of one per run
MANY_BUCKETS = 16


class Unsupported(Exception):
    """A module the hook path cannot handle (in-place edit of a captured tensor, non-tensor output...)."""


def flat_rows(inputs: tuple, weights, user_index, num_users: int | None):
    """The engine's inputs as flat rows: ``(inputs, weights, m, T)``.

    Padded per user (``user_index`` None): ``(m, T, ...)`` tensors become ``(m * T, ...)`` rows, ``T`` the
    rows per user. Flat rows: unchanged, ``T`` None, ``m = num_users`` (default: the largest user + 1).
    """
    if user_index is None:
        m, T = weights.shape[:2]
        return tuple(t.reshape(m * T, *t.shape[2:]) for t in inputs), weights.reshape(m * T), m, T
    m = int(num_users) if num_users is not None else int(user_index.max()) + 1 if len(user_index) else 0
    return inputs, weights, m, None


def user_groups(user_index, m: int, T: int | None, keep, pad_multiple: int, min_rows: int) -> "Groups":
    """The ``Groups`` of ``flat_rows``' rows (``T`` set: padded users, whose user index is implied)."""
    padded = T is not None
    if padded:
        user_index = None if pad_multiple == 1 else torch.arange(m).repeat_interleave(T)
    return Groups(user_index, m, pad_multiple, keep, sorted_users=padded, rows_per_user=T, min_rows=min_rows)


def length_class(counts: np.ndarray) -> np.ndarray:
    """Rows per user rounded up to the next of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ... (at most 1.5x the rows):
    a function of the user's own count only."""
    n = np.maximum(np.asarray(counts, dtype=np.int64), 1)
    p = 1 << (np.log2(n).astype(np.int64))
    p = np.where(p > n, p >> 1, p)   # float log2 rounding: p = 2^floor(log2 n) exactly
    mid = p + p // 2
    return np.where(n <= p, p, np.where(n <= mid, mid, 2 * p))


def by_length_class(user_index: torch.Tensor, keep: torch.Tensor, m: int):
    """``(user index relabelled, new_of_old)`` laying users out by length class (``length_class`` of their kept
    rows, then id) when their row counts in id order form more than ``MANY_BUCKETS`` runs, else None.

    Every user's rows are then padded to its class (zero-weight copies of its first row: ``Groups`` with
    ``length_classes``) and the users of a class form one bucket, so a round of users with scattered episode
    lengths costs a few batched products instead of one per run of equal lengths. The relabelling is a
    permutation of the users: user u's result is row ``new_of_old[u]`` of the relabelled computation, and every
    quantity of u still depends on u's rows only (its padded length is a function of its own count)."""
    ui = np.asarray(user_index, dtype=np.int64)
    kept = ui if keep is None else ui[np.asarray(keep)]
    counts = np.bincount(kept, minlength=m)[:m] if len(kept) else np.zeros(m, dtype=np.int64)
    live = counts[counts > 0]
    if len(live) < 2 or 1 + int(np.count_nonzero(np.diff(live))) <= MANY_BUCKETS:
        return None
    cls = np.where(counts > 0, length_class(counts), 0)
    order = np.lexsort((np.arange(m), cls))   # new id -> old id
    new_of_old = np.empty(m, dtype=np.int64)
    new_of_old[order] = np.arange(m)
    return torch.from_numpy(new_of_old[ui]), torch.from_numpy(new_of_old)


class Groups:
    """The layout of one forward pass, chosen so that a user's result depends on that user alone.

    Each user's rows, in their order, are padded with zero-weight copies of the user's first row to a
    multiple ``L_u`` of ``pad_multiple``; users follow in id order, and runs of consecutive users with
    equal ``L_u`` form buckets. A per-user sum of row products is one batched matmul per bucket with
    inner length ``L_u``, a per-user sum a reduction over the bucket's (L_u, ...) blocks: every float
    operation a user's result sees depends only on that user's own rows, never on which other users
    share the batch or how much data they have (so a user's gradient is bit-identical whichever process
    or batch computes it; CPU kernels are invariant to the batch count at fixed shapes, checked in
    tests/policies/test_per_user_grads.py). A phantom user ``num_users`` (never summed) pads tiny batches
    to ``min_rows`` rows (default ``MIN_ROWS``).
    """

    def __init__(self, user: torch.Tensor, num_users: int, pad_multiple: int = PAD_MULTIPLE,
                 keep: torch.Tensor | None = None, sorted_users: bool = False, rows_per_user: int | None = None,
                 min_rows: int = MIN_ROWS, length_classes: bool = False):
        m, B = int(num_users), int(pad_multiple)
        self.num_users, self.min_rows = m, int(min_rows)
        self._slot_user = None
        self.stride = None  # set by _init_strided: user u's slots start at slot u * stride (else consecutive)
        if B == 1 and not length_classes and self._init_sorted(user, m, keep, sorted_users, rows_per_user):
            return
        user = np.asarray(user, dtype=np.int64)  # index book-keeping in numpy: cheaper on small arrays
        n_all = len(user)
        rows = np.arange(n_all) if keep is None else np.flatnonzero(np.asarray(keep))  # rows that take part
        user = user[rows]
        N = len(user)
        counts = np.bincount(user, minlength=m)[:m] if N else np.zeros(m, dtype=np.int64)
        lens = np.where(counts > 0, length_class(counts), 0) if length_classes else (counts + B - 1) // B * B
        phantom = max(0, -(-(self.min_rows - int(lens.sum())) // B) * B)
        counts, lens = np.append(counts, 0), np.append(lens, phantom)
        ends = np.cumsum(lens)  # users laid out in id order (the phantom last)
        start = ends - lens
        self.num_slots = int(ends[-1])
        is_sorted = N < 2 or bool(np.all(user[1:] >= user[:-1]))
        rorder = np.arange(N) if is_sorted else np.argsort(user, kind="stable")
        cstart = np.cumsum(counts) - counts
        pos = np.empty_like(user)
        pos[rorder] = np.arange(N) - cstart[user[rorder]]
        slot_of_row = start[user] + pos
        slot_user = np.searchsorted(ends, np.arange(self.num_slots), side="right")
        # rows already in slot order (sorted by user, nothing padded or left out): no gather needed
        self.identity = is_sorted and self.num_slots == n_all == N
        first_row = np.zeros(m + 1, dtype=np.int64)
        has = counts > 0
        first_row[has] = rorder[cstart[has]]
        src = first_row[slot_user]  # padding slots repeat their user's first row ...
        src[slot_of_row] = np.arange(N)
        weight_src = np.full(self.num_slots, n_all, dtype=np.int64)  # ... with weight 0
        weight_src[slot_of_row] = rows
        src = rows[src] if N else np.zeros(self.num_slots, dtype=np.int64)
        self._slot_user, self.src, self.weight_src = (torch.from_numpy(a) for a in (slot_user, src, weight_src))
        self._set_buckets(lens[:m].tolist(), start.tolist())

    def _init_sorted(self, user, m: int, keep, known_sorted: bool, rows_per_user: int | None = None) -> bool:
        """The common layout without padding (``pad_multiple=1``), users' rows already in id order: slots
        are the kept rows themselves (plus phantom rows up to ``min_rows``), built with a few tensor ops.
        Returns False (nothing set) when the rows are not sorted by user."""
        n_all = m * rows_per_user if rows_per_user is not None else len(user)
        counts = None
        if rows_per_user is not None and keep is not None:  # padded users (m, T): rows u*T .. (u+1)*T-1
            kv = keep.view(m, rows_per_user)
            counts = kv.sum(1)
            lens = counts.tolist()
            if min(lens, default=rows_per_user) == rows_per_user:
                keep = None  # every row kept
            elif n_all >= self.min_rows and self._init_strided(keep, kv, counts, lens):
                return True
        elif keep is not None and bool(keep.all()):
            keep = None
        rows = None if keep is None else keep.nonzero().squeeze(1)
        if rows_per_user is not None:
            if keep is None:
                counts = torch.full((m,), rows_per_user, dtype=torch.long)
            N = n_all if rows is None else rows.shape[0]
        else:
            user = torch.as_tensor(user)
            kept_user = user if rows is None else user[rows]
            N = kept_user.shape[0]
            if not known_sorted and N > 1 and not bool((kept_user[1:] >= kept_user[:-1]).all()):
                return False
            counts = torch.bincount(kept_user, minlength=m)[:m] if N else torch.zeros(m, dtype=torch.long)
        phantom = max(0, self.min_rows - N)
        self.num_slots = N + phantom
        self.identity = rows is None and phantom == 0
        if not self.identity:
            base = torch.arange(n_all) if rows is None else rows
            first = base[:1] if N else torch.zeros(1, dtype=torch.long)
            self.src = torch.cat([base, first.expand(phantom)]) if phantom else base
            self.weight_src = torch.cat([base, torch.full((phantom,), n_all, dtype=torch.long)]) if phantom else base
        self._counts, self._phantom = counts, phantom
        lens = counts.tolist()
        start, acc = [], 0
        for n in lens:
            start.append(acc)
            acc += n
        self._set_buckets(lens, start)
        return True

    def _init_strided(self, keep, kv, counts, lens: list) -> bool:
        """Padded users (m, T) whose kept rows are a prefix of each user's T rows (the learners' padded
        episodes; ``kv`` = keep as (m, T), ``counts`` its row sums, ``lens`` as a list): the slots are the
        padded rows themselves, nothing is gathered, and a bucket's block is the strided view of its
        users' first L rows (user u's rows start at slot u * T). Returns False (nothing set) when some
        user's kept rows are not a prefix."""
        m, T = kv.shape
        if not torch.equal(kv, torch.arange(T) < counts[:, None]):
            return False
        self.num_slots, self.identity, self.stride, self._keep = m * T, True, T, keep
        self._counts, self._phantom = counts, 0
        self._set_buckets(lens, list(range(0, m * T, T)))
        return True

    def block(self, t: torch.Tensor, s0: int, n: int, L: int) -> torch.Tensor:
        """The (n, L, ...) block of a bucket's n users, their L slots each, starting at slot s0."""
        if self.stride is None:
            return t.narrow(0, s0, n * L).reshape(n, L, *t.shape[1:])
        T = self.stride
        return t.narrow(0, s0, n * T).reshape(n, T, *t.shape[1:])[:, :L]

    def user_start(self, s0: int, i: int, L: int) -> int:
        """The first slot of the i-th user of the bucket that starts at slot s0 (L slots a user)."""
        return s0 + i * (self.stride or L)

    def rows_view(self, t: torch.Tensor, s0: int, n: int, L: int, transpose: bool = False) -> torch.Tensor:
        """``block`` of a contiguous (slots, *inner, d) tensor with the inner positions merged into rows,
        as one strided view: (n, L * inner, d), or (n, d, L * inner) with ``transpose``."""
        d = t.shape[-1]
        q = t.stride(0) if t.dim() > 1 else 1  # elements per slot
        rows = L * q // d
        user_stride = (self.stride or L) * q
        off = t.storage_offset() + s0 * q
        if transpose:
            return t.as_strided((n, d, rows), (user_stride, 1, d), off)
        return t.as_strided((n, rows, d), (user_stride, d, 1), off)

    def _set_buckets(self, lens: list, start: list) -> None:
        """Runs of consecutive users (skipping users without rows) with equal padded length, as
        ``(first slot, range of user ids, length)``: every bucket is a range of consecutive users."""
        self.buckets = []
        u0 = None
        for u, L in enumerate(lens):
            if u0 is not None and L != lens[u0]:
                self.buckets.append((start[u0], range(u0, u), lens[u0]))
                u0 = None
            if u0 is None and L:
                u0 = u
        if u0 is not None:
            self.buckets.append((start[u0], range(u0, len(lens)), lens[u0]))
        self.covers_all = sum(len(users) for _, users, _ in self.buckets) == self.num_users  # all have rows

    @property
    def slot_user(self) -> torch.Tensor:
        """User of each slot (``num_users`` on the phantom user's slots)."""
        if self._slot_user is None and self.stride is not None:  # padding slots: the phantom user
            m, T = self.num_users, self.stride
            self._slot_user = torch.arange(m).repeat_interleave(T).masked_fill_(~self._keep, m)
        if self._slot_user is None:
            m = self.num_users
            self._slot_user = torch.repeat_interleave(torch.arange(m + 1),
                                                      torch.cat([self._counts, torch.tensor([self._phantom])]))
        return self._slot_user

    def layout(self, t: torch.Tensor) -> torch.Tensor:
        """Rows (N, ...) in slot layout (slots, ...)."""
        return t if self.identity else t.index_select(0, self.src)

    def layout_weights(self, w: torch.Tensor) -> torch.Tensor:
        """Row weights in slot layout, 0 on padding slots (and for rows left out)."""
        return w if self.identity else torch.cat([w, w.new_zeros(1)])[self.weight_src]

    def per_user(self, fn, *tensors) -> torch.Tensor:
        """(users, ...) from ``fn(*bucket views)``, each view (users of the bucket, L * ..., ...)."""
        out = None
        for s0, users, L in self.buckets:
            n = len(users)
            r = fn(*[self.block(t, s0, n, L) for t in tensors])
            if n == self.num_users:  # one bucket holds every user, in order
                return r
            if out is None:
                out = r.new_zeros((self.num_users,) + tuple(r.shape[1:]))
            out[users.start:users.stop] = r
        return out

    def block_matmul(self, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per user: sum over its slots and inner positions of g^T x, for g (slots, *inner, out), x (slots, *inner, in)."""
        def mm(gb, xb):
            n = gb.shape[0]
            gb, xb = gb.reshape(n, -1, gb.shape[-1]), xb.reshape(n, -1, xb.shape[-1])
            if xb.shape[-1] < gb.shape[-1]:  # the faster orientation: the wider factor last
                return torch.bmm(xb.transpose(1, 2), gb).transpose(1, 2)
            return torch.bmm(gb.transpose(1, 2), xb)
        return self.per_user(mm, g, x)

    def linear(self, g: torch.Tensor, x: torch.Tensor | None) -> tuple:
        """Per user: (sum of g^T x, sum of g) over its slots and inner positions, in one pass over the
        buckets (``x=None``: the bias part only). g (slots, *inner, out), x (slots, *inner, in)."""
        d_out = g.shape[-1]
        d_in = None if x is None else x.shape[-1]
        wide_last = d_in is not None and d_in < d_out  # the faster orientation: the wider factor last
        ws, bs = [], []
        for s0, users, L in self.buckets:
            n = len(users)
            gb = self.block(g, s0, n, L).reshape(n, -1, d_out)
            if d_in is not None:
                xb = self.block(x, s0, n, L).reshape(n, -1, d_in)
                ws.append(torch.bmm(xb.transpose(1, 2), gb).transpose(1, 2) if wide_last
                          else torch.bmm(gb.transpose(1, 2), xb))
            bs.append(gb.sum(1))
        return (None if d_in is None else self.parts(ws)), self.parts(bs)

    def linear_into(self, g: torch.Tensor, x: torch.Tensor | None, w_out: torch.Tensor | None,
                    b_out: torch.Tensor | None) -> None:
        """``linear`` written straight into the output columns: w_out (users, out * in), b_out (users, out)
        (either may be None). Every bucket is a range of consecutive users (``_set_buckets``)."""
        d_out = g.shape[-1]
        d_in = x.shape[-1] if w_out is not None else None
        wide_last = d_in is not None and d_in < d_out  # the faster orientation: the wider factor last
        for s0, users, L in self.buckets:
            u0, u1 = users.start, users.stop
            n = u1 - u0
            gb = self.block(g, s0, n, L).reshape(n, -1, d_out)
            if w_out is not None:
                xb = self.block(x, s0, n, L).reshape(n, -1, d_in)
                dst = w_out[u0:u1].view(n, d_out, d_in)
                if wide_last:
                    torch.bmm(xb.transpose(1, 2), gb, out=dst.transpose(1, 2))
                else:
                    torch.bmm(gb.transpose(1, 2), xb, out=dst)
            if b_out is not None:
                torch.sum(gb, 1, out=b_out[u0:u1])

    def parts(self, parts: list):
        """The buckets' results as (users, ...) when one bucket holds every user, else as ``BucketParts``
        (added into the output where they belong, without materializing a zero-padded copy)."""
        if len(parts) == 1 and parts[0].shape[0] == self.num_users:
            return parts[0]
        return BucketParts(parts)

    def add_into(self, out: torch.Tensor, v) -> None:
        """out (users, k) += v, a (users, ...) tensor or ``BucketParts``."""
        if not isinstance(v, BucketParts):
            out += v.reshape(out.shape)
            return
        for (_, users, _), r in zip(self.buckets, v.parts):
            out[users.start:users.stop] += r.reshape(len(users), -1)

    def sum(self, t: torch.Tensor, inner: int = 1) -> torch.Tensor:
        """Per-user sum over slots (and ``inner`` dims after the first) of (slots, *inner, ...) -> (users, ...)."""
        return self.per_user(lambda tb: tb.reshape(tb.shape[0], -1, *tb.shape[1 + inner:]).sum(1), t)


class BucketParts:
    """Per-bucket results of a rule (rows = the bucket's users), in ``Groups.buckets`` order."""

    __slots__ = ("parts",)

    def __init__(self, parts: list):
        self.parts = parts

    def full(self, groups: "Groups") -> torch.Tensor:
        out = self.parts[0].new_zeros((groups.num_users,) + tuple(self.parts[0].shape[1:]))
        groups.add_into(out.view(groups.num_users, -1), self)
        return out

    def __add__(self, other):
        raise TypeError("BucketParts are added into an output with Groups.add_into")


def pad_users(t: torch.Tensor, user: torch.Tensor, num_users: int) -> torch.Tensor:
    """Flat rows (N, ...) -> (users, max rows, ...), zero-padded (the layout of the vmap over users)."""
    user = user.long()
    counts = torch.bincount(user, minlength=num_users) if len(user) else torch.zeros(num_users, dtype=torch.long)
    L = max(1, int(counts.max())) if num_users else 1
    order = torch.sort(user, stable=True).indices
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.empty_like(user)
    pos[order] = torch.arange(len(user)) - starts[user[order]]
    out = t.new_zeros((num_users * L,) + tuple(t.shape[1:]))
    out[user * L + pos] = t
    return out.reshape(num_users, L, *t.shape[1:])

