"""DiffusionGemma's compiled step (``load_model(..., compile=True)``): every step's canvases as one graph.

The decode part, every denoising row's canvas, runs at each step: it goes through one compiled graph per
bucket of static shapes. Rows round up to a power of two (at most the cache's slots) and a global layer's
context columns to the next of ``WIDTH_BUCKETS`` (at most the cache's width). A padding row reads slot 0
under a mask that lets it see only its own canvas, and its hidden states are dropped; a padding column is
masked for every row. The decode part writes no cache, so padding changes no row's keys and values.
A layer is a nested compile region, traced once per kind (sliding, global) and stamped out for every
layer of that kind, so compile time does not grow with depth.

Each bucket's inputs live in buffers that every step refills in place, and the KV cache keeps its address,
so on CUDA each graph is a captured CUDA graph (``triton.cudagraphs``). The store part, a row's prompt or
committed canvas, runs eagerly as its own forward before the graph: it comes once per canvas, not once
per step. The head, the seeded sampler and the self-conditioning run beside the graph, over chunks of rows
(``engine.runner.canvas_runner``), with the step's one host read at the end.

A bucket whose compilation fails runs eagerly from then on, with one warning naming the cause.
"""
from __future__ import annotations

import functools
import logging

import torch

from engine.models.compiled import COMPILE_ERRORS, configure_dynamo
from engine.models.compiled_shapes import WIDTH_BUCKETS, bucket
from engine.models.diffusion_gemma.kv_cache import CanvasKVCache, PagePool
from engine.models.diffusion_gemma.model import DiffusionGemmaTransformer
from engine.models.diffusion_gemma.step import CanvasStep, DecodePart, DecodePlan, plan_decode

logger = logging.getLogger(__name__)


def _decode_layer(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_layer: torch.Tensor,
                  slots: torch.Tensor, global_mask: torch.Tensor, sliding_mask: torch.Tensor) -> torch.Tensor:
    """One layer over the decode part's canvases ``x [rows * canvas, hidden]``, as eager runs it."""
    rows = global_mask.shape[0]
    length = x.shape[0] // rows
    plan = DecodePlan(rows, length, slots, None, global_mask.shape[-1] - length, global_mask, sliding_mask)

    def attention(h: torch.Tensor) -> torch.Tensor:
        return DiffusionGemmaTransformer.attention(layer, cache_layer, None, h, cos, sin, None, plan, 0)
    return layer(x, attention, 0)


# traced once per kind of layer (sliding, global) and stamped out for every layer of that kind, so compile
# time does not grow with depth
_layer_region = torch.compiler.nested_compile_region(_decode_layer)


def _decode(model, canvas: torch.Tensor, soft: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
            global_mask: torch.Tensor, sliding_mask: torch.Tensor, cache_layers: list[torch.Tensor],
            regions: bool = True) -> torch.Tensor:
    """The decode part's final hidden states ``[rows, canvas, hidden]``: the eager layers over one plan
    (``regions`` False: every layer inline, as the eager fallback runs)."""
    rows, length = canvas.shape
    embedded = model.embed(canvas)
    x = model.self_conditioning(embedded, soft).reshape(rows * length, -1)
    rotary = {shape.kind: model.rotary(positions, shape) for shape in model.config.layers}
    run = _layer_region if regions else _decode_layer
    for index, layer in enumerate(model.layers):
        x = run(layer, x, *rotary[layer.shape.kind], cache_layers[index], slots, global_mask, sliding_mask)
    return model.norm(x).view(rows, length, -1)


@functools.cache
def compiled_decode(cuda_graphs: bool):
    """One compiled ``_decode`` per process and mode, so every model and engine shares its graphs. Inductor
    rounds to the model's dtype wherever eager does (``emulate_precision_casts``): bf16 tokens stay eager's."""
    options = {"emulate_precision_casts": True} | ({"triton.cudagraphs": True} if cuda_graphs else {})
    return torch.compile(_decode, dynamic=False, fullgraph=True, options=options)


class CompiledCanvas:
    def __init__(self, model):
        self.model = model
        self.graphs: set[tuple[int, int]] = set()  # (rows, global keys) buckets run through a graph
        self.failures: dict[tuple[int, int], str] = {}  # bucket -> why it runs eagerly
        self.buffers: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        self.static_caches: set[int] = set()

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    @property
    def shapes(self) -> set[tuple[int, int]]:
        return self.graphs

    @property
    def compile_failures(self) -> dict[str, str]:
        return {f"canvas rows={rows} keys={keys}": cause for (rows, keys), cause in self.failures.items()}

    def decode_hidden(self, step: CanvasStep, cache: CanvasKVCache, pool: PagePool | None) -> torch.Tensor | None:
        """What the eager ``decode_hidden`` returns: the store eagerly, then the decode part's bucket."""
        model = self.model
        if step.store is not None:
            model.eager_hidden(CanvasStep(step.store, None), cache, pool)
        if step.decode is None:
            return None
        key = self._bucket(step.decode, cache)
        inputs = self._fill(key, step.decode, cache)
        if key in self.failures:
            return _decode(model, *inputs, cache.layers, regions=False)[:step.decode.num_rows]
        cuda_graphs = cache.layers[0].is_cuda
        configure_dynamo(64)
        if not self.graphs:  # the rotary frequencies exist before a trace reads them
            for shape in model.config.layers:
                model.rotary(inputs[3][:1], shape)
        if cuda_graphs:
            for layer in cache.layers:
                if id(layer) not in self.static_caches:
                    torch._dynamo.mark_static_address(layer)
                    self.static_caches.add(id(layer))
            torch.compiler.cudagraph_mark_step_begin()
        try:
            hidden = compiled_decode(cuda_graphs)(model, *inputs, cache.layers)
        except COMPILE_ERRORS as error:
            cause = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            logger.warning("DiffusionGemma's canvas bucket rows=%d keys=%d runs eagerly: its compilation failed "
                           "(%s)", *key, cause)
            self.failures[key] = cause
            return _decode(model, *inputs, cache.layers, regions=False)[:step.decode.num_rows]
        self.graphs.add(key)
        return hidden[:step.decode.num_rows].clone()  # a captured graph's output is rewritten at its next replay

    @staticmethod
    def _bucket(part: DecodePart, cache: CanvasKVCache) -> tuple[int, int]:
        slots = cache.layers[0].shape[0]
        return bucket(part.num_rows, slots), bucket(max(part.contexts), cache.width, WIDTH_BUCKETS)

    def _fill(self, key: tuple[int, int], part: DecodePart, cache: CanvasKVCache) -> tuple[torch.Tensor, ...]:
        """The bucket's inputs, written into its buffers: ``part``'s rows, then padding rows."""
        rows, keys = key
        pad = rows - part.num_rows
        tokens = part.tokens
        soft = part.soft_embeddings
        if pad:
            tokens = torch.cat([tokens, tokens.new_zeros(pad, tokens.shape[1])])
            soft = None if soft is None else torch.cat([soft, soft.new_zeros(pad, *soft.shape[1:])])
        padded = DecodePart(tokens, part.slots + (0,) * pad, part.contexts + (0,) * pad)
        plan = plan_decode(padded, cache.ring, self.model.dtype, global_keys=keys)
        if soft is None:
            soft = torch.zeros((*tokens.shape, self.model.config.hidden_size), dtype=self.model.dtype,
                               device=tokens.device)
        values = (tokens, soft, plan.slots, plan.positions, plan.global_mask, plan.sliding_mask)
        buffers = self.buffers.get(key)
        if buffers is None:
            buffers = self.buffers[key] = tuple(torch.empty_like(value) for value in values)
            for buffer in buffers:
                torch._dynamo.mark_static_address(buffer)
        for buffer, value in zip(buffers, values):
            buffer.copy_(value)
        return buffers
