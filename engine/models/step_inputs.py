"""What one packed forward is given besides the KV cache (``engine.models.kv_cache``): a step's two parts.

The transformer (``engine.models.transformer``) computes them; ``engine.runner.batch_inputs`` builds them.
A part's ``block_size`` names its attention: over blocks of that many positions (SDAR, LLaDA2), or with
None bidirectional. Its :attr:`~AttendedPart.attention` object (``engine.models.part_attention``) says
what that means for its rows, mask and cache reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.part_attention import PartAttention, part_attention

# A window's attention reads a multiple of this many keys. On this CPU, flash attention over 106 keys
# takes about 1.6x the time of 112 keys (head sizes 8, 64 and 128, float32 and bf16 alike).
KEY_ALIGNMENT = 16


def aligned_keys(keys: int, most: int) -> int:
    """``keys`` rounded up to a multiple of :data:`KEY_ALIGNMENT`, at most ``most``."""
    return min(-(-keys // KEY_ALIGNMENT) * KEY_ALIGNMENT, most)


class AttendedPart:
    """A part whose ``block_size`` names its attention."""

    block_size: int | None

    @property
    def attention(self) -> PartAttention:
        """How the part is attended: its rows' columns in the box, its mask, the cache columns it reads."""
        return part_attention(self.block_size)


@dataclass
class RefreshPart(AttendedPart):
    """Whole rows ``[rows, w]``: a block's first step, which also (re)builds the rows' cache.

    With ``slots`` set, each row's keys/values are written to cache columns
    ``[first_column, first_column + w)`` of its slot.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    key_mask: torch.Tensor  # [rows, w] True on real tokens
    read_columns: torch.Tensor  # [rows, n] columns whose hidden states are returned
    slots: torch.Tensor | None = None
    first_column: int = 0
    row_widths: tuple[int, ...] = ()  # host: each row's real tokens, where attention.first_column puts
    # them in the box (): all fill it
    block_size: int | None = None  # block-causal attention over blocks of this many positions

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]


@dataclass
class WindowPart(AttendedPart):
    """A window of columns per row ``[rows, n]`` against the rows' cached keys/values.

    Row i holds cache slot i: the window rows are packed into slots ``[0, rows)``, in order. Its own
    keys/values replace the cached ones at ``columns``. Attention reads cache columns from
    ``context_start`` on: the bounding box of these rows, widened to the left to a multiple of
    :data:`KEY_ALIGNMENT` columns, which are no row's keys. The hidden states of positions
    ``max(j - read_shift, 0)`` for ``j < num_read`` are returned: with a shifted family whose window
    starts at the block (``read_shift`` 1), block position j is predicted by window position j - 1.
    With ``read_columns`` set, row i returns the hidden states of its window positions
    ``read_columns[i]`` instead (a block-causal row whose window also rewrites its finished block).

    Block-causal windows (``block_size`` set) read the cache columns ``[context_start, context_end)``,
    up to the rows' furthest active block widened to the right to a multiple of :data:`KEY_ALIGNMENT`.
    They need each of those keys' positions (``key_positions``) to mask keys of later blocks.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    columns: torch.Tensor  # [rows, n] cache columns (the scratch column for a ragged window's tail)
    context_start: int
    num_read: int
    read_shift: int = 0
    row_widths: tuple[int, ...] = ()  # host: each row's keys, where attention.first_column puts them in
    # the context (): all of it
    row_tokens: tuple[int, ...] = ()  # host: each row's real window tokens, from the left (): all of them
    read_columns: torch.Tensor | None = None  # [rows, num_read] window positions to return
    block_size: int | None = None  # block-causal attention over blocks of this many positions
    context_end: int | None = None  # last cache column read, exclusive (None: the cache's width)
    key_positions: torch.Tensor | None = None  # [rows, context keys] positions of the context's columns

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    def context_keys(self, width: int) -> int:
        """How many cache columns the window reads, of a cache ``width`` columns wide."""
        return (self.context_end or width) - self.context_start
