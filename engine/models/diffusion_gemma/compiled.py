"""DiffusionGemma's compiled step (``load_model(..., compile=True)``): a step's canvases as compiled graphs.

Two kinds of forward run at nearly every step, each through one compiled graph per bucket of static
shapes: the decode part (every denoising row's canvas) and the store of the canvases that rows committed
at the last step (``canvas_length`` tokens each). Rows round up to a power of two (at most the cache's
slots) and a global layer's context columns to the next of ``WIDTH_BUCKETS`` (at most the cache's width).
A padding decode row reads slot 0 under a mask that shows it only its own canvas, and its hidden states
are dropped: the decode part writes no cache. A padding store row repeats the first row, so it writes
the same keys and values to the same columns. A padding column is masked for every row. A layer is a
nested compile region, traced once per kind (sliding, global) and stamped out for every layer of that
kind, so compile time does not grow with depth.

Each bucket's inputs live in buffers that every step refills in place, and the KV cache keeps its address,
so on CUDA each graph is a captured CUDA graph (``triton.cudagraphs``). A prompt's store, of any length
and filling the prefix cache's pages, runs eagerly: it comes once per request. The head, the seeded
sampler and the self-conditioning run beside the graphs, over chunks of rows
(``engine.runner.canvas_rows``), with the step's one host read at the end.

A bucket whose compilation fails runs eagerly from then on, with one warning naming the cause.
"""
from __future__ import annotations

import functools
import logging

import torch

from engine.models.compiled import COMPILE_ERRORS, configure_dynamo
from engine.models.compiled_shapes import WIDTH_BUCKETS, bucket
from engine.models.diffusion_gemma.attention import attention as layer_attention
from engine.models.diffusion_gemma.step import (
    CanvasStep,
    DecodePart,
    DecodePlan,
    StorePart,
    StorePlan,
    plan_decode,
    plan_store,
)
from engine.models.kv_cache import KVCache, PagePool

logger = logging.getLogger(__name__)


def _decode_layer(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_layer: torch.Tensor,
                  slots: torch.Tensor, global_mask: torch.Tensor, sliding_mask: torch.Tensor) -> torch.Tensor:
    """One layer over the decode part's canvases ``x [rows * canvas, hidden]``, as eager runs it."""
    rows = global_mask.shape[0]
    length = x.shape[0] // rows
    plan = DecodePlan(rows, length, slots, None, global_mask.shape[-1] - length, global_mask, sliding_mask)

    def attention(h: torch.Tensor) -> torch.Tensor:
        return layer_attention(layer, cache_layer, None, h, cos, sin, None, plan, 0)
    return layer(x, attention, 0)


def _store_layer(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_layer: torch.Tensor,
                 slots: torch.Tensor, token_slots: torch.Tensor, positions: torch.Tensor, global_mask: torch.Tensor,
                 sliding_mask: torch.Tensor, ring_tokens: torch.Tensor, ring_columns: torch.Tensor) -> torch.Tensor:
    """One layer over committed canvases ``x [rows * canvas, hidden]``, stored causally, as eager runs it."""
    rows = global_mask.shape[0]
    length = x.shape[0] // rows
    plan = StorePlan(rows, length, torch.arange(rows * length, device=x.device), slots, token_slots, positions,
                     global_mask.shape[-1], global_mask, sliding_mask, ring_tokens, ring_columns, None, None, None)

    def attention(h: torch.Tensor) -> torch.Tensor:
        return layer_attention(layer, cache_layer, None, h, cos, sin, plan, None, h.shape[0])
    return layer(x, attention, x.shape[0])


# each traced once per kind of layer (sliding, global) and stamped out for every layer of that kind
_decode_region = torch.compiler.nested_compile_region(_decode_layer)
_store_region = torch.compiler.nested_compile_region(_store_layer)


def _decode(model, cache_layers: tuple[torch.Tensor, ...], canvas: torch.Tensor, soft: torch.Tensor,
            slots: torch.Tensor, positions: torch.Tensor, global_mask: torch.Tensor, sliding_mask: torch.Tensor,
            regions: bool = True) -> torch.Tensor:
    """The decode part's final hidden states ``[rows, canvas, hidden]`` (``regions`` False: every layer
    inline, as the eager fallback runs)."""
    rows, length = canvas.shape
    embedded = model.embed(canvas)
    x = model.self_conditioning(embedded, soft).reshape(rows * length, -1)
    rotary = model.rotary_tables(positions)
    run = _decode_region if regions else _decode_layer
    for index, layer in enumerate(model.layers):
        x = run(layer, x, *rotary[layer.shape.kind], cache_layers[index], slots, global_mask, sliding_mask)
    return model.norm(x).view(rows, length, -1)


def _store(model, cache_layers: tuple[torch.Tensor, ...], tokens: torch.Tensor, positions: torch.Tensor,
           slots: torch.Tensor, token_slots: torch.Tensor, global_mask: torch.Tensor, sliding_mask: torch.Tensor,
           ring_tokens: torch.Tensor, ring_columns: torch.Tensor, regions: bool = True) -> torch.Tensor:
    """Store committed canvases ``tokens [rows * canvas]`` in the cache; returns the last layer's output."""
    x = model.embed(tokens)
    rotary = model.rotary_tables(positions)
    run = _store_region if regions else _store_layer
    for index, layer in enumerate(model.layers):
        x = run(layer, x, *rotary[layer.shape.kind], cache_layers[index], slots, token_slots, positions,
                global_mask, sliding_mask, ring_tokens, ring_columns)
    return x


FORWARDS = {"decode": _decode, "store": _store}


@functools.cache
def max_buckets(slots: int, width: int) -> int:
    """The buckets one kind of forward can meet in a cache of ``slots`` rows and ``width`` columns: dynamo
    keeps that many graphs of it (32 slots of 4,096 columns: 84)."""
    rows = {bucket(n, slots) for n in range(1, slots + 1)}
    widths = {bucket(w, width, WIDTH_BUCKETS) for w in range(1, width + 1)}
    return len(rows) * len(widths)


@functools.cache
def compiled_forward(kind: str, cuda_graphs: bool):
    """One compiled forward of each kind per process and mode, so every model and engine shares its graphs.
    Inductor rounds to the model's dtype wherever eager does (``emulate_precision_casts``): bf16 tokens
    stay eager's."""
    options = {"emulate_precision_casts": True} | ({"triton.cudagraphs": True} if cuda_graphs else {})
    return torch.compile(FORWARDS[kind], dynamic=False, fullgraph=True, options=options)


Bucket = tuple[str, int, int]  # (forward kind, rows, global layers' context columns)


class CompiledCanvas:
    def __init__(self, model):
        self.model = model
        self.graphs: set[Bucket] = set()  # buckets run through a compiled graph
        self.failures: dict[Bucket, str] = {}  # bucket -> why it runs eagerly
        self.buffers: dict[Bucket, tuple[torch.Tensor, ...]] = {}
        self.static_caches: set[int] = set()

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    @property
    def shapes(self) -> set[Bucket]:
        return self.graphs

    @property
    def compile_failures(self) -> dict[str, str]:
        return {f"canvas {kind} rows={rows} keys={keys}": cause for (kind, rows, keys), cause in self.failures.items()}

    def decode_hidden(self, step: CanvasStep, cache: KVCache, pool: PagePool | None) -> torch.Tensor | None:
        """What the eager ``decode_hidden`` returns: prompts stored eagerly, committed canvases and the
        decode part through their buckets' graphs."""
        if step.store is not None:
            canvases, prompts = split_store(step.store, self.model.config.canvas_length)
            if prompts is not None:
                self.model.eager_hidden(CanvasStep(prompts, None), cache, pool)
            if canvases is not None:
                key = ("store", bucket(canvases.num_rows, cache.layers[0].shape[0]),
                       bucket(max(s + c for s, c in zip(canvases.starts, canvases.counts)), cache.width,
                              WIDTH_BUCKETS))
                self._run(key, self._store_inputs(key, canvases, cache), cache)
        if step.decode is None:
            return None
        key = ("decode", bucket(step.decode.num_rows, cache.layers[0].shape[0]),
               bucket(max(step.decode.contexts), cache.width, WIDTH_BUCKETS))
        hidden = self._run(key, self._decode_inputs(key, step.decode, cache), cache)
        return hidden[:step.decode.num_rows].clone()  # a captured graph's output is rewritten at its next replay

    def _run(self, key: Bucket, inputs: tuple[torch.Tensor, ...], cache: KVCache) -> torch.Tensor:
        """``key``'s forward over ``inputs``: its compiled graph, compiled at first use, else eagerly."""
        model, kind = self.model, key[0]
        if key in self.failures:
            return FORWARDS[kind](model, cache.layers, *inputs, regions=False)
        cuda_graphs = cache.layers[0].is_cuda
        configure_dynamo(max_buckets(cache.layers[0].shape[0], cache.width))
        if not self.graphs:  # the rotary frequencies exist before a trace reads them
            model.rotary_tables(cache.layers[0].new_zeros(1, dtype=torch.long))
        if cuda_graphs:
            for layer in cache.layers:
                if id(layer) not in self.static_caches:
                    torch._dynamo.mark_static_address(layer)  # captured graphs write the cache in place
                    self.static_caches.add(id(layer))
            torch.compiler.cudagraph_mark_step_begin()
        try:
            output = compiled_forward(kind, cuda_graphs)(model, cache.layers, *inputs)
        except COMPILE_ERRORS as error:
            cause = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            logger.warning("DiffusionGemma's canvas %s bucket rows=%d keys=%d runs eagerly: its compilation "
                           "failed (%s)", *key, cause)
            self.failures[key] = cause
            return FORWARDS[kind](model, cache.layers, *inputs, regions=False)
        self.graphs.add(key)
        return output

    def _decode_inputs(self, key: Bucket, part: DecodePart, cache: KVCache) -> tuple[torch.Tensor, ...]:
        """The decode bucket's inputs, in its buffers: ``part``'s rows, then padding rows on slot 0."""
        _, rows, keys = key
        pad = rows - part.num_rows
        tokens, soft = part.tokens, part.soft_embeddings
        if soft is None:
            soft = torch.zeros((*tokens.shape, self.model.config.hidden_size), dtype=self.model.dtype,
                               device=tokens.device)
        if pad:
            tokens = torch.cat([tokens, tokens.new_zeros(pad, tokens.shape[1])])
            soft = torch.cat([soft, soft.new_zeros(pad, *soft.shape[1:])])
        padded = DecodePart(tokens, part.slots + (0,) * pad, part.contexts + (0,) * pad)
        plan = plan_decode(padded, cache.ring, self.model.dtype, global_keys=keys)
        return self._refill(key, (tokens, soft, plan.slots, plan.positions, plan.global_mask, plan.sliding_mask))

    def _store_inputs(self, key: Bucket, part: StorePart, cache: KVCache) -> tuple[torch.Tensor, ...]:
        """The store bucket's inputs, in its buffers: ``part``'s rows, then copies of its first row."""
        _, rows, keys = key
        pad = rows - part.num_rows
        length = part.counts[0]
        padded = StorePart(torch.cat([part.tokens, part.tokens[:length].repeat(pad)]),
                           part.slots + part.slots[:1] * pad, part.starts + part.starts[:1] * pad,
                           part.counts + part.counts[:1] * pad)
        plan = plan_store(padded, cache.ring, self.model.config.sliding_window, self.model.dtype, global_keys=keys)
        return self._refill(key, (padded.tokens, plan.positions, plan.slots, plan.token_slots, plan.global_mask,
                                  plan.sliding_mask, plan.ring_tokens, plan.ring_columns))

    def _refill(self, key: Bucket, values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        buffers = self.buffers.get(key)
        if buffers is None:
            buffers = self.buffers[key] = tuple(torch.empty_like(value) for value in values)
            for buffer in buffers:
                torch._dynamo.mark_static_address(buffer)
        for buffer, value in zip(buffers, values):
            buffer.copy_(value)
        return buffers


def split_store(part: StorePart, canvas_length: int) -> tuple[StorePart | None, StorePart | None]:
    """``part`` as its committed canvases (rows of ``canvas_length`` new tokens that fill no page), and the
    rest (prompts); None where a side has no row."""
    offsets = [0]
    for count in part.counts:
        offsets.append(offsets[-1] + count)
    canvases, prompts = [], []
    for index in range(part.num_rows):
        row = part.row(index, part.tokens[offsets[index]:offsets[index + 1]])
        fills_pages = any(entry >= 0 for entry in (part.pages[index] if part.pages else ()))
        (canvases if row.counts[0] == canvas_length and not fills_pages else prompts).append(row)
    return join(canvases), join(prompts)


def join(rows: list[StorePart]) -> StorePart | None:
    """One part of single-row parts (None for none)."""
    if not rows:
        return None
    if len(rows) == 1:
        return rows[0]
    pages = tuple(row.pages[0] if row.pages else () for row in rows)
    return StorePart(torch.cat([row.tokens for row in rows]), sum((row.slots for row in rows), ()),
                     sum((row.starts for row in rows), ()), sum((row.counts for row in rows), ()),
                     pages if any(pages) else ())
