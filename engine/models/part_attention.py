"""How a step part is attended, and where its rows sit in its box: one object per kind of attention.

A part (``engine.models.step_inputs``) names its attention by its ``block_size``, and :func:`part_attention`
turns that into one of two objects. The packed step, the compiled path and the transformer ask that object
instead of testing the kind, so each kind's rules for a part live here (a row's place in its slot is
``engine.models.layout``'s).

* :data:`BIDIRECTIONAL` (LLaDA, Dream): a query sees every real key of its row. Rows sit right-aligned, so
  a box grows on the left, over columns that are never a row's keys.
* :class:`BlockCausal` (SDAR, LLaDA2): a query at position p sees the real keys at positions
  ``< (p // block_size + 1) * block_size``, its own block and every block before it. Rows sit left-aligned
  (column = position), so a box grows on the right, over later positions that the mask hides.

::

    a row of 5 keys in a box of 8 columns       first_column(5, 8)
    right-aligned:  . . . k k k k k             3
    left-aligned:   k k k k k . . .             0
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool -> 0 where True, -inf where False, in ``dtype`` (one pass: a third of ``to`` then ``log_``)."""
    mask = torch.where(allowed, 0.0, float("-inf"))
    return mask if mask.dtype == dtype else mask.to(dtype)


class PartAttention:
    """What a step part's attention decides: its rows' columns in the box, its mask, its cache reads."""

    mask_reads_positions: bool = False  # the mask needs the keys' positions, not only the key mask

    def first_column(self, count: int, length: int) -> int:
        """The first box column of a row's ``count`` keys (or queries) in a box of ``length`` columns."""
        raise NotImplementedError

    def own_columns(self, count: int, length: int) -> slice:
        """The box columns of a row's ``count`` keys (or queries) in a box of ``length`` columns."""
        raise NotImplementedError

    def context_columns(self, keys: int, width: int) -> tuple[int, int]:
        """``(start, end)``: the columns of a cache ``width`` wide that a window context of ``keys`` reads."""
        raise NotImplementedError

    def mask(self, key_mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor | None,
             dtype: torch.dtype, blind_queries: bool = True) -> torch.Tensor:
        """The additive mask of a part ``[rows, 1, 1 or queries, keys]``: 0 on keys a query may see, else -inf.

        With ``blind_queries``, a query that sees no key (a pad query, a padded row) gets its row's real
        keys instead, so its softmax stays finite; its output is never read.
        """
        raise NotImplementedError

    def hide_added_keys(self, key_mask: torch.Tensor, keys: int) -> None:
        """Mask, in place, the columns a bucket adds to a window context of ``keys`` columns."""
        raise NotImplementedError

    def row_queries(self, counts: tuple[int, ...]) -> tuple[int, ...]:
        """Each row's queries that attend when rows attend one by one, given its real queries from the
        left (``counts``); (): every query of the box."""
        raise NotImplementedError

    def steady_window(self, num_read: int) -> int:
        """The longest window a static-shape graph runs at its own length, unbucketed."""
        raise NotImplementedError

    def mask_entries_per_query(self, keys: int) -> int:
        """Mask entries a query adds to a step of ``keys`` keys (0: the mask is one row per row)."""
        raise NotImplementedError


class Bidirectional(PartAttention):
    """Every real key of the row; rows right-aligned in the box, and window contexts end at the cache's end."""

    def first_column(self, count: int, length: int) -> int:
        return length - count

    def own_columns(self, count: int, length: int) -> slice:
        return slice(length - count, None)

    def context_columns(self, keys: int, width: int) -> tuple[int, int]:
        return width - keys, width

    def mask(self, key_mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor | None,
             dtype: torch.dtype, blind_queries: bool = True) -> torch.Tensor:
        return additive(key_mask, dtype)[:, None, None, :]

    def hide_added_keys(self, key_mask: torch.Tensor, keys: int) -> None:
        """Nothing to hide: the columns left of a row are never its keys (``PersistentBatch.place``)."""

    def row_queries(self, counts: tuple[int, ...]) -> tuple[int, ...]:
        return ()

    def steady_window(self, num_read: int) -> int:
        """One block, with one column of lookback (a shifted family)."""
        return num_read + 1

    def mask_entries_per_query(self, keys: int) -> int:
        return 0


@dataclass(frozen=True)
class BlockCausal(PartAttention):
    """A query's own block and the blocks before it; rows left-aligned, window contexts start at column 0."""

    block_size: int
    mask_reads_positions = True

    def first_column(self, count: int, length: int) -> int:
        return 0

    def own_columns(self, count: int, length: int) -> slice:
        return slice(0, count)

    def context_columns(self, keys: int, width: int) -> tuple[int, int]:
        return 0, keys

    def mask(self, key_mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor | None,
             dtype: torch.dtype, blind_queries: bool = True) -> torch.Tensor:
        query_blocks = torch.div(query_positions, self.block_size, rounding_mode="floor")[:, :, None]
        key_blocks = torch.div(key_positions, self.block_size, rounding_mode="floor")[:, None, :]
        allowed = key_mask[:, None, :] & (key_blocks <= query_blocks)
        if blind_queries:
            allowed |= ~allowed.any(-1, keepdim=True) & key_mask[:, None, :]
        return additive(allowed, dtype)[:, None]

    def hide_added_keys(self, key_mask: torch.Tensor, keys: int) -> None:
        """Columns past the rows' active blocks hold later positions: never keys."""
        key_mask[:, keys:] = False

    def row_queries(self, counts: tuple[int, ...]) -> tuple[int, ...]:
        return counts

    def steady_window(self, num_read: int) -> int:
        """A finished block, stored, and the active block."""
        return 2 * self.block_size

    def mask_entries_per_query(self, keys: int) -> int:
        return keys


BIDIRECTIONAL = Bidirectional()


@functools.cache
def part_attention(block_size: int | None) -> PartAttention:
    """The attention of a part with this ``block_size``: over blocks of that many positions, or (None)
    bidirectional. One object per size, so a compiled graph sees the same object at every step."""
    return BIDIRECTIONAL if block_size is None else BlockCausal(block_size)
