"""A finite value class: |F| candidate Q-functions, each a table of values over a finite domain.

The domain is a finite set of state-action pairs with flat ids ``0 .. num_sa-1`` (the env defines
the indexing; states at different steps are different ids, so ``f = (f_1, ..., f_H)`` is one row).
A class answers one question, batched over all its members: the values at some pairs.
"""
from __future__ import annotations

import torch

from dppo.errors import ConfigError


class FiniteClass:
    """Interface of a finite class F.

    Attributes:
        size: |F|.
        num_sa: size of the state-action domain.
        value_max: every value lies in [0, value_max] (enforced by clipping; the sensitivity of the
            GFA scores is derived from it).
    """

    size: int
    num_sa: int
    value_max: float

    def values(self, sa: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """Values ``f(sa)`` for every member (or the given member ids).

        Args:
            sa: LongTensor of state-action ids, any shape ``[*]``.
            members: optional LongTensor ``[m]`` of member ids (default: all |F|).

        Returns:
            float32 tensor ``[m, *]`` with entries in ``[0, value_max]``.
        """
        raise NotImplementedError

    def member_table(self, i: int) -> torch.Tensor:
        """All values of member ``i`` over the domain, ``[num_sa]``."""
        return self.values(torch.arange(self.num_sa), torch.tensor([int(i)]))[0]


class TensorClass(FiniteClass):
    """A finite class given explicitly as a tensor of values ``[|F|, num_sa]``, clipped to [0, value_max].

    Args:
        table: the values, one row per member.
        value_max: the declared upper end of the value range (values are clipped into [0, value_max]).
    """

    def __init__(self, table: torch.Tensor, value_max: float):
        table = torch.as_tensor(table, dtype=torch.float32)
        if table.dim() != 2 or table.shape[0] < 1:
            raise ConfigError(f"a finite class needs a [|F|, num_sa] table, got shape {tuple(table.shape)}")
        if not value_max > 0:
            raise ConfigError(f"value_max must be positive, got {value_max}")
        self.value_max = float(value_max)
        self.table = table.clamp(0.0, self.value_max)
        self.size, self.num_sa = int(table.shape[0]), int(table.shape[1])

    def values(self, sa, members=None):
        rows = self.table if members is None else self.table[members]
        return rows[:, sa.reshape(-1)].reshape(rows.shape[0], *sa.shape)

    def member_table(self, i):
        return self.table[int(i)]
