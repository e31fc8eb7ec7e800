"""The shape each compiled forward runs at (``engine.models.compiled``): static buckets or exact shapes.

A compiled graph is specialised to the shapes it was traced with, unless a dimension is marked dynamic.
Two rules bound the graphs a run compiles:

* **Buckets** (static shapes; CUDA). Rows round up to a power of two (at most the cache's slots; without
  a cache, uncapped). A refresh part's width and a window's context round up to the next of a few
  widths. Each bucket is one graph of fixed shapes, which a captured CUDA graph replays. Padding rows
  compute on pad tokens, write to the cache's scratch column and are dropped. A full-attention family's
  rows are right-aligned (``engine.runner.batch``), so its box grows to the left, over columns that are
  padding for every row. A block-causal family's rows (SDAR, LLaDA2) are left-aligned, so its box grows
  to the right, over masked keys, or over columns that a refresh rewrites before any row reads them.
* **Exact** (dynamic shapes; the CPU). Each forward runs at its part's own rows and widths, marked dynamic,
  so one graph serves every size. Nothing is padded: on a CPU every padded token costs its full
  arithmetic, and buckets cost a fifth more tokens on the demo job. Dynamo still specialises a dimension
  of size 1, so a kind of forward compiles two graphs, one row and several rows, and its
  :meth:`CompiledShapes.graph` key names both.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from engine.models.kv_cache import KVCache
from engine.models.step_inputs import RefreshPart, WindowPart

WIDTH_BUCKETS = (32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
ANY = "n"  # a graph key's dimension that is dynamic: any size of 2 or more


def bucket(value: int, cap: int, buckets: tuple[int, ...] | None = None) -> int:
    """The smallest bucket >= value (powers of two when ``buckets`` is None), never above ``cap``."""
    if buckets is None:
        size = 1
        while size < value:
            size *= 2
        return min(size, cap)
    return min(next((b for b in buckets if b >= value), value), cap)


@functools.cache
def max_graphs(max_rows: int, width: int) -> int:
    """How many graphs a bucketed run can compile at most: row buckets x (refresh widths + window
    contexts x window lengths), for rows up to ``max_rows`` in a cache of ``width`` columns (cached:
    asked at every forward)."""
    rows = len({bucket(n, max_rows) for n in range(1, max_rows + 1)})
    widths = len({bucket(w, width, WIDTH_BUCKETS) for w in range(1, width + 1)}
                 | {bucket(w, 1 << 30, WIDTH_BUCKETS) for w in range(1, width + 1)})
    window_lengths = widths + 2  # one block (a dual window), two (block-causal) or a bucketed width
    return rows * (widths + widths * window_lengths)


def row_cap(part: RefreshPart | WindowPart, kv_cache: KVCache | None) -> int:
    """The most rows a part's forward may be padded to: the cache's slots (a part's rows are some of
    them), or without a cache the part's rows rounded up to a power of two."""
    rows = part.tokens.shape[0]
    return max(kv_cache.data.shape[1], rows) if kv_cache is not None else bucket(rows, 1 << 30)


@dataclass(frozen=True)
class CompiledShapes:
    """The shape rule of one compiled model: ``static`` buckets (CUDA graphs) or exact, dynamic shapes."""

    static: bool

    def refresh(self, part: RefreshPart, kv_cache: KVCache | None) -> tuple[int, int, int]:
        """Rows and width a refresh part runs at, and the columns its box grows by on the left."""
        rows, length = part.tokens.shape
        if not self.static:
            return rows, length, 0
        padded_rows = bucket(rows, row_cap(part, kv_cache))
        padded_length = bucket(length, kv_cache.width if part.slots is not None else 1 << 30, WIDTH_BUCKETS)
        grow = part.attention.first_column(length, padded_length)  # a right-aligned box grows on the left
        if part.slots is not None and part.first_column - grow < 0:
            grow = part.first_column
            padded_length = length + grow
        return padded_rows, padded_length, grow

    def window(self, part: WindowPart, kv_cache: KVCache) -> tuple[int, int, int]:
        """Rows, length and context (cache columns read) a window part runs at. Where the context sits in
        the cache is the part's attention's (``PartAttention.context_columns``)."""
        rows, length = part.tokens.shape
        context = part.context_keys(kv_cache.width)
        if not self.static:
            return rows, length, context
        padded_rows = bucket(rows, kv_cache.data.shape[1])
        steady = length <= part.attention.steady_window(part.num_read)
        padded_length = length if steady else bucket(length, 1 << 30, WIDTH_BUCKETS)
        return padded_rows, padded_length, bucket(context, kv_cache.width, WIDTH_BUCKETS)

    def graph(self, kind: str, rows: int, length: int, keys: int) -> tuple:
        """The graph that runs a forward of this kind and shape: the shape itself when static; when
        exact, each dimension of 2 or more is :data:`ANY` (dynamo specialises a dimension of 1)."""
        if self.static:
            return kind, rows, length, keys
        return (kind, *(size if size == 1 else ANY for size in (rows, length, keys)))

    def mark(self, tensors, dims: int = 2) -> None:
        """Mark the first ``dims`` dimensions of a forward's inputs, its rows and widths, dynamic (exact
        shapes only): dynamo then traces them as sizes, not constants, and the graph serves every size."""
        if self.static:
            return
        for tensor in tensors:
            for dim in range(min(tensor.dim(), dims)):
                if tensor.shape[dim] > 1:
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)
