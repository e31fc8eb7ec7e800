"""The KV cache every row kind stores keys and values in, and the page pool its prefix cache keeps pages in.

A :class:`CacheSpec` says what each layer keeps per slot: its key/value heads, its head size, and whether
it keeps every position (column = position) or a sliding ring of the last ``window - 1`` positions
(column = position mod ring). The block rows' cache also keeps a key mask and a scratch column.

    full layer     columns 0 .. width-1 = positions, [scratch column]
    sliding layer  columns 0 .. ring-1, a position p at p mod ring, ring = min(window - 1, width)

Every layer's tensor is ``[slots, 2 (key, value), kv_heads, columns, head_dim]``. When every layer has the
same shape the layers are views of one tensor, :attr:`KVCache.data`, ``[layers, slots, 2, kv_heads, columns,
head_dim]``, so a copy between slots or into a pool is one indexing of every layer at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One layer's cached heads: ``kv_heads`` of ``head_dim``; ``window``: a sliding layer's (None: full)."""
    kv_heads: int
    head_dim: int
    window: int | None = None

    def ring(self, width: int) -> int:
        """Columns of a sliding layer's ring: what it can still see, never more than a row holds."""
        return max(min(self.window - 1, width), 1)


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """The layers a cache keeps for each slot of ``width`` positions; ``scratch_column``: full layers (and
    the key mask) hold one more column, which padding writes; ``key_mask``: a bool per slot and column."""
    layers: tuple[LayerSpec, ...]
    width: int
    scratch_column: bool = False
    key_mask: bool = False

    @staticmethod
    def uniform(num_layers: int, kv_heads: int, head_dim: int, width: int, *, scratch_column: bool = False,
                key_mask: bool = False) -> CacheSpec:
        """``num_layers`` full layers of one shape."""
        return CacheSpec((LayerSpec(kv_heads, head_dim),) * num_layers, width, scratch_column, key_mask)

    @property
    def full_columns(self) -> int:
        return self.width + self.scratch_column

    @property
    def ring(self) -> int | None:
        """Columns of the sliding layers' ring (one window for all of them); None without sliding layers."""
        rings = {layer.ring(self.width) for layer in self.layers if layer.window is not None}
        if len(rings) > 1:
            raise ValueError(f"sliding layers of one cache share one window, got rings {sorted(rings)}")
        return rings.pop() if rings else None

    def columns(self, layer: LayerSpec) -> int:
        return self.full_columns if layer.window is None else layer.ring(self.width)

    def layer_shape(self, layer: LayerSpec, slots: int) -> tuple[int, ...]:
        return (slots, 2, layer.kv_heads, self.columns(layer), layer.head_dim)

    def bytes_per_position(self, dtype: torch.dtype) -> int:
        """Keys and values of one position over every layer: what a pool page holds per position."""
        element = torch.empty((), dtype=dtype).element_size()
        return sum(2 * layer.kv_heads * layer.head_dim * element for layer in self.layers)

    def num_bytes(self, slots: int, dtype: torch.dtype) -> int:
        """What :class:`KVCache` allocates for ``slots`` slots: every layer's columns and the key mask."""
        element = torch.empty((), dtype=dtype).element_size()
        layers = sum(2 * layer.kv_heads * self.columns(layer) * layer.head_dim * element for layer in self.layers)
        return slots * (layers + (self.full_columns if self.key_mask else 0))


def allocate_layers(shapes: list[tuple[int, ...]], dtype: torch.dtype,
                    device: torch.device) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """Zeroed tensors of ``shapes``: one stacked tensor and its per-layer views where every shape is equal
    (None and one tensor per layer otherwise)."""
    if len(set(shapes)) == 1:
        data = torch.zeros((len(shapes), *shapes[0]), dtype=dtype, device=device)
        return data, data.unbind(0)
    return None, tuple(torch.zeros(shape, dtype=dtype, device=device) for shape in shapes)


class KVCache:
    """Preallocated keys and values of every layer for every slot, written in place (:attr:`layers`, per
    layer ``[slots, 2, kv_heads, columns, head_dim]``; :attr:`data` stacks them where they share a shape).

    A block row sits right-aligned in its slot (columns ``[width - row_width, width)``), so a bounding box
    of width ``w`` is the slice ``[width - w, width)`` of every slot and the boxes of consecutive slots are
    one view. The scratch column ``width`` is never a real key: a ragged window's missing entries go there.
    """

    def __init__(self, spec: CacheSpec, slots: int, dtype: torch.dtype, device: torch.device):
        self.spec, self.width, self.ring = spec, spec.width, spec.ring
        self.data, self.layers = allocate_layers([spec.layer_shape(layer, slots) for layer in spec.layers],
                                                 dtype, device)
        self.key_mask = (torch.zeros((slots, spec.full_columns), dtype=torch.bool, device=device)
                         if spec.key_mask else None)

    @property
    def scratch_column(self) -> int:
        if not self.spec.scratch_column:
            raise ValueError("this cache keeps no scratch column")
        return self.width

    @property
    def keys(self) -> list[torch.Tensor]:
        """Per layer ``[slots, kv_heads, columns, head_dim]`` (views)."""
        return [layer[:, 0] for layer in self.layers]

    @property
    def values(self) -> list[torch.Tensor]:
        return [layer[:, 1] for layer in self.layers]

    @property
    def num_bytes(self) -> int:
        tensors = list(self.layers) + ([self.key_mask] if self.key_mask is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


class PagePool:
    """``pages`` pages of ``page_length`` positions' keys and values of every layer of ``spec``, sliding ones
    included (per layer ``[pages, 2, kv_heads, page_length, head_dim]``; :attr:`data` stacks them where they
    share a shape). A prompt reusing a run of pages needs a sliding layer's last ring of positions, and the
    run may end at any page."""

    def __init__(self, spec: CacheSpec, pages: int, page_length: int, dtype: torch.dtype, device: torch.device):
        self.page_length = page_length
        shapes = [(pages, 2, layer.kv_heads, page_length, layer.head_dim) for layer in spec.layers]
        self.data, self.layers = allocate_layers(shapes, dtype, device)

    @staticmethod
    def num_bytes_for(spec: CacheSpec, pages: int, page_length: int, dtype: torch.dtype) -> int:
        return spec.bytes_per_position(dtype) * pages * page_length

    @property
    def num_bytes(self) -> int:
        return sum(layer.numel() * layer.element_size() for layer in self.layers)
