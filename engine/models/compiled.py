"""A compiled step (``load_model(..., compile=True)``): each forward runs as one compiled graph.

Eager, a layer issues ~40 aten operations, each a dispatch (on a GPU a kernel launch). Compiled, a forward
(embedding, rotary tables, mask and every layer) is one call of generated code, with one set of guards per
call, its elementwise work fused. A dense model's layer (LLaDA, Dream, SDAR) is a nested compile region:
traced once, its code stamped out for every layer, so compile time does not grow with depth. A
mixture-of-experts model's layers (LLaDA2) are traced one after the other (in a nested region their cache
writes are lost, torch 2.13), each writing into the whole cache. The layer's sequence is the eager one
(:class:`Layer` ``.forward`` over a one-part plan). On CUDA each graph is a CUDA graph (``triton.cudagraphs``)
that writes the KV cache in place at a static address. Shapes are bucketed to bound the graphs compiled:

* rows round up to a power of two (at most the cache's slots; without a cache, uncapped); padding
  rows compute on pad tokens, write their keys/values to the cache's scratch column and are dropped;
* a refresh part's width and a window's context round up to the next of a few widths. A full-attention
  family's rows are right-aligned (``engine.runner.batch``), so a bucket extends the box to the left, over
  columns that are padding for every row of the box; a prefix window longer than one block rounds up too;
* a block-causal family's rows (SDAR, LLaDA2) are left-aligned, so a bucket extends the box to the right:
  a window's context ``[0, furthest active block's end)`` grows over masked keys (a window longer than two
  blocks, a cached prompt's rest, rounds up); a refresh part's extra columns write keys rewritten before use.

A step with both parts runs them as two forwards (refresh first: it writes the cache the window does
not read). Tokens do not change with padding: a padded row or column only ever meets masked keys.

Each bucket combination is one of dynamo's cache entries for ``_forward``; :func:`max_graphs` counts
them all, and the thread that compiles raises dynamo's recompile limits to that count (the limits are
per thread: an engine loop thread starts at torch's default of 8). A compilation that fails anyway
runs that shape eagerly from then on, with one warning naming the cause, so the engine keeps stepping.
"""
from __future__ import annotations

import functools
import logging
import re
import threading

import torch

from engine.models.compiled_inputs import BucketInputs, StaticInputs, fill
from engine.models.kv_cache import KVCache
from engine.models.layers import rotary_tables
from engine.models.packed_step import PartPlan, StepPlan, additive_mask, block_causal_mask, rotary_dtype
from engine.models.step_inputs import RefreshPart, WindowPart

WIDTH_BUCKETS = (32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
# what a failed compilation raises: dynamo's own errors (a recompile limit, an unsupported op) and the
# backend's (inductor wraps a C++ or Triton compiler error in BackendCompilerFailed)
COMPILE_ERRORS = (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)

logger = logging.getLogger(__name__)


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
    """How many graphs a run can compile at most: row buckets x (refresh widths + window contexts x window
    lengths), for rows up to ``max_rows`` in a cache of ``width`` columns (cached: asked at every forward)."""
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


_thread_limits = threading.local()


def raise_recompile_limits(graphs: int) -> None:
    """Let dynamo keep ``graphs`` entries for ``_forward`` in the calling thread (dynamo's config
    values are per thread, so the engine loop's thread needs its own)."""
    if getattr(_thread_limits, "graphs", 0) >= graphs:
        return
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, graphs)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * graphs)
    _thread_limits.graphs = graphs


def _layer(layer, x, cos, signed_sin, mask, kv_layer, write_slots, write_columns, rows: int, length: int,
           context_rows: int, context_start: int, context_end: int, whole_cache: tuple | None = None) -> torch.Tensor:
    """One layer over one part (``rows`` x ``length`` tokens), as eager runs it: ``context_rows`` 0, the
    part attends to its own keys; else to cache slots ``[0, context_rows)``, ``[context_start, context_end)``.
    Unrolled layers write through ``whole_cache`` (``StepPlan.whole_cache``)."""
    write = (write_slots, slice(None), slice(None), write_columns) if kv_layer is not None else None
    context = (kv_layer[:context_rows, :, :, context_start:context_end],) if context_rows else None
    plan = StepPlan([PartPlan(rows, length, 0, mask, write, context)], cos, signed_sin, (kv_layer,), whole_cache)
    return layer(x, plan, 0)


_layer_region = torch.compiler.nested_compile_region(_layer)


def _forward(model, tokens, positions, key_mask, key_positions, kv, write_slots, write_columns,
             rows: int, length: int, context_rows: int, context_start: int, context_end: int,
             block_size: int | None, nested_layers: bool, tables: tuple | None = None) -> torch.Tensor:
    """Embedding, rotary tables, mask and every layer of one bucketed part: ``[rows * length, hidden]``
    (block-causal masks from the queries' and keys' positions when ``block_size`` is set); the layers
    one nested compile region when ``nested_layers``, else unrolled, with the rotary ``tables`` given."""
    cos, signed_sin = tables if tables is not None else _tables(model, positions)
    mask = (additive_mask(key_mask, model.dtype) if block_size is None else
            block_causal_mask(key_mask, positions, key_positions, block_size, model.dtype))
    x = model.embed(tokens.reshape(-1))
    for index, layer in enumerate(model.layers):
        unrolled = functools.partial(_layer, whole_cache=None if kv is None else (kv, index))
        run_layer = _layer_region if nested_layers else unrolled
        x = run_layer(layer, x, cos, signed_sin, mask, kv[index] if kv is not None else None,
                      write_slots, write_columns, rows, length, context_rows, context_start, context_end)
    return x


def _tables(model, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables of a part's positions. Unrolled layers get them computed before the graph:
    inside it, inductor would fuse their sines and cosines into every layer's kernels, once a layer."""
    config = model.config
    return rotary_tables(positions.reshape(-1), config.rotary_dim, config.rope_theta,
                         rotary_dtype(model.dtype, config.rope_full_precision))


_LATER_LAYER = re.compile(r"\['layers'\]\._modules\['[1-9][0-9]*'\]")


def guards_but_later_layers(guards) -> list[bool]:
    """Keep every guard but those on layers 1 and up: a model's layers are built from one config and
    loaded in one dtype, so layer 0's guards (module types, parameter shapes, dtypes, devices) stand for
    all of them, and the number of layers stays guarded. Guards are checked at every call, before the
    graph runs (a captured CUDA graph too): host time on every step, in proportion to the depth."""
    return [not _LATER_LAYER.search(guard.name) for guard in guards]


@functools.cache
def compiled_forward(cuda_graphs: bool, uniform_layers: bool = True):
    """One compiled ``_forward`` per process and mode: every model and engine shares its graphs'
    cache (a new ``torch.compile`` wrapper would compile them all again). Layers 1 and up keep their
    guards when the layers differ (a dense first layer before mixture-of-experts ones)."""
    options = {
        # a fused kernel rounds where eager rounds (a half-precision model's norm casts back before its
        # scale, as LLaDA's code does), so bf16 logits match eager's, not approximate them
        "emulate_precision_casts": True,
        # no size/stride asserts in the generated wrapper: ~15 Python calls a layer, every step; the
        # shapes are fixed by the bucket and checked by the guards already
        "size_asserts": False,
    } | ({"guard_filter_fn": guards_but_later_layers} if uniform_layers else {}) | (
        {"triton.cudagraphs": True} if cuda_graphs else {})
    return torch.compile(_forward, dynamic=False, fullgraph=True, options=options)


class CompiledForward:
    """``forward_step`` of a :class:`BidirectionalTransformer` through compiled, shape-bucketed layers."""

    def __init__(self, model):
        self.model = model
        self.cuda_graphs = model.embed_tokens.weight.device.type == "cuda"
        moe = model.config.moe
        self.forward = compiled_forward(self.cuda_graphs, moe is None or moe.first_k_dense_replace == 0)
        self.nested_layers = moe is None  # see the module docstring
        self.static_caches: set[int] = set()
        self.shapes: set[tuple] = set()  # the bucketed shapes compiled so far: one graph each
        self.inputs = StaticInputs({})  # each shape's input buffers, refilled at every step
        self.eager_shapes: dict[tuple, str] = {}  # shapes whose compilation failed -> the cause

    def forward_step(self, refresh: RefreshPart | None, window: WindowPart | None,
                     kv_cache: KVCache | None) -> torch.Tensor:
        hidden = []
        if refresh is not None:
            hidden.append(self._part(self._refresh, refresh, kv_cache))
        if window is not None:
            hidden.append(self._part(self._window, window, kv_cache))
        return torch.cat(hidden) if len(hidden) > 1 else hidden[0]

    def _part(self, run, part: RefreshPart | WindowPart, kv_cache: KVCache | None) -> torch.Tensor:
        """One part through its compiled graph, or eagerly if that graph failed to compile."""
        width = kv_cache.width if kv_cache is not None else part.tokens.shape[1]
        raise_recompile_limits(max_graphs(row_cap(part, kv_cache), width))
        key = self._shape_key(part, kv_cache)
        if key not in self.eager_shapes:
            try:
                return run(part, kv_cache)
            except COMPILE_ERRORS as error:
                cause = f"{type(error).__name__}: {next(iter(str(error).splitlines()), '')}"
                self.eager_shapes[key] = cause
                self.shapes.discard(key)
                logger.warning("compiling the %s step of %d rows x %d tokens failed (%s); this shape "
                               "runs eagerly from now on", key[0], key[1], key[2], cause)
        refresh, window = (part, None) if isinstance(part, RefreshPart) else (None, part)
        return self.model.forward_step_eager(refresh, window, kv_cache)

    @property
    def compile_failures(self) -> dict[str, str]:
        """Each shape that runs eagerly because its compilation failed, and why."""
        return {f"{kind} {rows}x{length}": cause for (kind, rows, length, _), cause in self.eager_shapes.items()}

    def _shape_key(self, part: RefreshPart | WindowPart, kv_cache: KVCache | None) -> tuple:
        """``(kind, rows, length, keys)`` of the bucketed forward that runs ``part``: its graph."""
        if isinstance(part, RefreshPart):
            rows, length, grow = self._refresh_shape(part, kv_cache)
            return "refresh", rows, length, length
        rows, length, context = self._window_shape(part, kv_cache)
        return "window", rows, length, context

    def _refresh_shape(self, part: RefreshPart, kv_cache: KVCache | None) -> tuple[int, int, int]:
        rows, length = part.tokens.shape  # bucketed rows and width, and the columns added on the left
        padded_rows = bucket(rows, row_cap(part, kv_cache))
        padded_length = bucket(length, kv_cache.width if part.slots is not None else 1 << 30, WIDTH_BUCKETS)
        if part.block_causal:  # left-aligned rows: the box grows on the right
            return padded_rows, padded_length, 0
        grow = padded_length - length
        if part.slots is not None and part.first_column - grow < 0:
            grow = part.first_column
            padded_length = length + grow
        return padded_rows, padded_length, grow

    def _window_shape(self, part: WindowPart, kv_cache: KVCache) -> tuple[int, int, int]:
        """Bucketed rows, length and context of a window part: a window of one block keeps its length."""
        rows, length = part.tokens.shape
        padded_rows = bucket(rows, kv_cache.data.shape[1])
        if part.block_causal:
            padded_length = length if length <= 2 * part.block_size else bucket(length, 1 << 30, WIDTH_BUCKETS)
            return padded_rows, padded_length, bucket(part.context_end, kv_cache.width, WIDTH_BUCKETS)
        padded_length = length if length <= part.num_read + 1 else bucket(length, 1 << 30, WIDTH_BUCKETS)
        context = bucket(kv_cache.width - part.context_start, kv_cache.width, WIDTH_BUCKETS)
        return padded_rows, padded_length, context

    def _refresh(self, part: RefreshPart, kv_cache: KVCache | None) -> torch.Tensor:
        rows, length = part.tokens.shape
        padded_rows, padded_length, grow = self._refresh_shape(part, kv_cache)
        writes = part.slots is not None
        inputs = self.inputs.get(("refresh", padded_rows, padded_length, padded_length, writes, part.block_causal),
                                 part.tokens.device)
        fill(inputs.tokens, part.tokens, 0, grow)
        fill(inputs.positions, part.positions, 0, grow)
        fill(inputs.key_mask, part.key_mask, False, grow)[rows:, -1] = True  # padding rows: one key, dropped
        if writes:  # columns past a left-aligned box are canvas its rows rewrite before reading
            fill(inputs.write_slots, part.slots[:, None], 0)
            first = part.first_column - grow
            inputs.write_columns[:rows] = torch.arange(first, first + padded_length, device=part.tokens.device)
            inputs.write_columns[rows:] = kv_cache.width  # padding rows write the scratch column only
        x = self._layers(inputs, inputs.positions, kv_cache if writes else None, padded_rows, padded_length,
                         (0, 0, 0), part.block_size, "refresh")
        hidden = x.view(padded_rows, padded_length, -1)[:rows, grow:grow + length]
        return self._read(part, hidden)

    def _window(self, part: WindowPart, kv_cache: KVCache) -> torch.Tensor:
        rows, length = part.tokens.shape
        padded_rows, padded_length, context = self._window_shape(part, kv_cache)
        start, end = (0, context) if part.block_causal else (kv_cache.width - context, kv_cache.width)
        inputs = self.inputs.get(("window", padded_rows, padded_length, context, True, part.block_causal),
                                 part.tokens.device)
        fill(inputs.tokens, part.tokens, 0)
        fill(inputs.positions, part.positions, 0)
        fill(inputs.write_columns, part.columns, kv_cache.width)  # padding: the scratch column
        key_mask = inputs.key_mask
        key_mask.copy_(kv_cache.key_mask[:padded_rows, start:end])
        if part.block_causal:  # columns past the rows' active blocks are never keys
            key_mask[:, part.context_end:] = False
            fill(inputs.key_positions, part.key_positions, 0)
        key_mask[rows:] = False
        key_mask[rows:, 0 if part.block_causal else -1] = True  # padding rows see one key, are dropped
        x = self._layers(inputs, inputs.key_positions, kv_cache, padded_rows, padded_length,
                         (padded_rows, start, end), part.block_size, "window")
        return self._read(part, x.view(padded_rows, padded_length, -1)[:rows])

    def _layers(self, inputs: BucketInputs, key_positions: torch.Tensor | None, kv_cache: KVCache | None,
                rows: int, length: int, context: tuple[int, int, int], block_size: int | None, kind) -> torch.Tensor:
        """``context``: (rows, first column, end column) of the cache a window reads; (0, 0, 0): none."""
        self.shapes.add((kind, rows, length, inputs.key_mask.shape[1]))
        kv = kv_cache.data if kv_cache is not None else None
        if self.cuda_graphs:
            if kv is not None and id(kv) not in self.static_caches:
                torch._dynamo.mark_static_address(kv)  # captured graphs write the cache in place
                self.static_caches.add(id(kv))
            torch.compiler.cudagraph_mark_step_begin()  # earlier outputs were copied out (see _read)
        return self.forward(self.model, inputs.tokens, inputs.positions, inputs.key_mask, key_positions, kv,
                            inputs.write_slots, inputs.write_columns, rows, length, *context, block_size,
                            self.nested_layers, None if self.nested_layers else _tables(self.model, inputs.positions))

    def _read(self, part: RefreshPart | WindowPart, hidden: torch.Tensor) -> torch.Tensor:
        """The part's hidden states, as a tensor of its own (a captured graph's output is overwritten
        by its next replay)."""
        read = self.model._read(part, hidden)
        return read.clone() if self.cuda_graphs else read

    @property
    def num_graphs(self) -> int:
        return len(self.shapes)

