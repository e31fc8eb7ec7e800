"""What one packed forward is given: the preallocated KV arena and the two parts of a step.

Data only; the transformer (``engine.models.transformer``) computes, ``engine.batch`` builds them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.models.transformer import TransformerConfig


class KVArena:
    """Preallocated keys/values of every layer in one tensor
    ``[layers, slots, 2 (key, value), kv_heads, width + 1, head_dim]``, written in place.

    A request owns one slot while it runs; its row sits right-aligned in the slot (columns
    ``[width - row_width, width)``), so a bounding box of width ``w`` is the slice ``[width - w, width)``
    of every slot, whichever rows leave or join, and the boxes of consecutive slots are one view.
    Column ``width`` is scratch: never a real key, the target of a ragged window's missing entries.
    """

    def __init__(self, config: TransformerConfig, slots: int, width: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (config.num_layers, slots, 2, config.num_kv_heads, width + 1, config.head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.layers = self.kv.unbind(0)  # per-layer views, made once
        self.key_mask = torch.zeros((slots, width + 1), dtype=torch.bool, device=device)

    @property
    def width(self) -> int:
        return self.key_mask.shape[1] - 1

    @property
    def scratch_column(self) -> int:
        return self.width

    @property
    def keys(self) -> list[torch.Tensor]:
        """Per layer ``[slots, kv_heads, width + 1, head_dim]`` (views)."""
        return [layer[:, 0] for layer in self.layers]

    @property
    def values(self) -> list[torch.Tensor]:
        return [layer[:, 1] for layer in self.layers]

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.key_mask))

    @staticmethod
    def bytes_per_slot_column(config: TransformerConfig, dtype: torch.dtype) -> int:
        """Keys + values of one column of one slot, over all layers, plus its key-mask flag."""
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element + 1


@dataclass
class RefreshPart:
    """Whole rows ``[rows, w]``: a block's first step, which also (re)builds the rows' cache.

    With ``slots`` set, each row's keys/values are written to arena columns
    ``[first_column, first_column + w)`` of its slot.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    key_mask: torch.Tensor  # [rows, w] True on real tokens
    read_columns: torch.Tensor  # [rows, n] columns whose hidden states are returned
    slots: torch.Tensor | None = None
    first_column: int = 0

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]


@dataclass
class WindowPart:
    """A window of columns per row ``[rows, n]`` against the rows' cached keys/values.

    Its own keys/values replace the cached ones at ``columns``; attention reads arena columns from
    ``context_start`` on (the bounding box of these rows). The hidden states of positions
    ``max(j - read_shift, 0)`` for ``j < num_read`` are returned: with a shifted family whose window
    starts at the block (``read_shift`` 1), block position j is predicted by window position j - 1.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    columns: torch.Tensor  # [rows, n] arena columns (the scratch column for a ragged window's tail)
    slots: torch.Tensor  # [rows]
    context_start: int
    num_read: int
    slot_range: tuple[int, int] | None = None  # (first slot, count): consecutive slots holding every
    # row, in slot order; attention reads them as one view of the arena. None: gather the rows' cache
    read_shift: int = 0

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]
