"""The preallocated KV cache: every layer's keys and values for every slot.

The transformer reads and writes it; ``engine.runner.batch.PersistentBatch`` owns one and places rows in it.
"""
from __future__ import annotations

import torch

from engine.models.config import TransformerConfig


class KVCache:
    """Preallocated keys/values of every layer in one tensor, :attr:`data`
    ``[layers, slots, 2 (key, value), kv_heads, width + 1, head_dim]``, written in place.

    A request owns one slot while it runs; its row sits right-aligned in the slot (columns
    ``[width - row_width, width)``), so a bounding box of width ``w`` is the slice ``[width - w, width)``
    of every slot, whichever rows leave or join, and the boxes of consecutive slots are one view.
    Column ``width`` is scratch: never a real key, the target of a ragged window's missing entries.
    """

    def __init__(self, config: TransformerConfig, slots: int, width: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (config.num_layers, slots, 2, config.num_kv_heads, width + 1, config.head_dim)
        self.data = torch.zeros(shape, dtype=dtype, device=device)
        self.layers = self.data.unbind(0)  # per-layer views, made once
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
        return sum(t.numel() * t.element_size() for t in (self.data, self.key_mask))

    @staticmethod
    def bytes_per_slot_column(config: TransformerConfig, dtype: torch.dtype) -> int:
        """Keys + values of one column of one slot, over all layers, plus its key-mask flag."""
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element + 1
