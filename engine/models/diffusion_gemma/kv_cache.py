"""DiffusionGemma's KV cache: every slot's context keys and values, sized by what each layer can still see.

A global layer keeps every context position (column = position). A sliding layer keeps only the last
``sliding_window - 1`` positions, in a ring (column = position mod ring size): an encoder query sees
itself and the ``sliding_window - 1`` positions before it, and the canvas sees the context's last
``sliding_window - 1`` positions, as transformers' sliding cache keeps them.

The prefix cache's :class:`PagePool` keeps whole pages of prompt positions for every layer, sliding ones
included: a prompt that reuses a run of pages needs its sliding layers' last ring of positions, and the
run may end at any page.
"""
from __future__ import annotations

import torch

from engine.models.diffusion_gemma.config import GemmaTextConfig


class CanvasKVCache:
    def __init__(self, config: GemmaTextConfig, slots: int, width: int, dtype: torch.dtype,
                 device: torch.device):
        self.ring = ring_size(config, width)
        self.width = width
        self.layers = [torch.zeros(self.layer_shape(config, index, slots, width), dtype=dtype, device=device)
                       for index in range(config.num_layers)]

    def layer_shape(self, config: GemmaTextConfig, index: int, slots: int, width: int) -> tuple[int, ...]:
        shape = config.layers[index]
        columns = width if shape.kind == "global" else self.ring
        return (slots, 2, shape.num_kv_heads, columns, shape.head_dim)

    @property
    def num_bytes(self) -> int:
        return sum(layer.numel() * layer.element_size() for layer in self.layers)

    @staticmethod
    def bytes_per_slot(config: GemmaTextConfig, width: int, dtype: torch.dtype) -> int:
        """Keys and values of one slot of ``width`` columns over all layers (sliding layers: their ring)."""
        element = torch.empty((), dtype=dtype).element_size()
        ring = ring_size(config, width)
        return sum(2 * shape.num_kv_heads * shape.head_dim * element * (width if shape.kind == "global" else ring)
                   for shape in config.layers)


def ring_size(config: GemmaTextConfig, width: int) -> int:
    """Columns of a sliding layer's ring: what it can still see, never more than a row holds."""
    return max(min(config.sliding_window - 1, width), 1)


class PagePool:
    """``pages`` pages of ``page_length`` positions' keys and values, every layer's (entry = page)."""

    def __init__(self, config: GemmaTextConfig, pages: int, page_length: int, dtype: torch.dtype,
                 device: torch.device):
        self.page_length = page_length
        self.layers = [torch.zeros((pages, 2, shape.num_kv_heads, page_length, shape.head_dim), dtype=dtype,
                                   device=device) for shape in config.layers]

    @property
    def num_bytes(self) -> int:
        return sum(layer.numel() * layer.element_size() for layer in self.layers)

    @staticmethod
    def bytes_per_token(config: GemmaTextConfig, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return sum(2 * shape.num_kv_heads * shape.head_dim * element for shape in config.layers)
