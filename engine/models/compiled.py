"""A compiled step (``load_model(..., compile=True)``): each forward runs as one compiled graph.

Eager, a layer issues ~40 aten operations, each a dispatch (on a GPU a kernel launch). Compiled, a forward
(embedding, rotary tables, mask and every layer) is one call of generated code, with one set of guards per
call, its elementwise work fused. A layer is a nested compile region: traced once per kind of layer
(LLaDA2 has two, its dense first layer and its expert layers), its code stamped out for every layer of
that kind, so compile time does not grow with depth. The layer's sequence is the eager one
(:class:`Layer` ``.forward`` over a one-part plan). On CUDA each graph is a CUDA graph (``triton.cudagraphs``)
that writes the KV cache in place at a static address. Which shapes the graphs are compiled for, static
buckets on CUDA or exact, dynamic shapes on the CPU, is ``engine.models.compiled_shapes``'s rule.

A step with both parts runs them as two forwards (refresh first: it writes the cache the window does
not read). Tokens do not change with padding: a padded row or column only ever meets masked keys.

Each graph is one of dynamo's cache entries for ``_forward``; :func:`max_graphs` bounds their number,
and the thread that compiles raises dynamo's recompile limits to that count (the limits are per
thread: an engine loop thread starts at torch's default of 8). A compilation that fails anyway
runs that shape eagerly from then on, with one warning naming the cause, so the engine keeps stepping.
"""
from __future__ import annotations

import functools
import logging
import re
import threading

import torch

from engine.models.compiled_inputs import BucketInputs, StaticInputs, allocate, fill
from engine.models.compiled_shapes import CompiledShapes, max_graphs, row_cap
from engine.models.kv_cache import KVCache
from engine.models.layers import rotary_tables
from engine.models.moe import routing_blocks
from engine.models.packed_step import PartPlan, StepPlan, rotary_dtype
from engine.models.part_attention import PartAttention
from engine.models.step_inputs import RefreshPart, WindowPart

# what a failed compilation raises: dynamo's own errors (a recompile limit, an unsupported op) and the
# backend's (inductor wraps a C++ or Triton compiler error in BackendCompilerFailed)
COMPILE_ERRORS = (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)

logger = logging.getLogger(__name__)


_thread_config = threading.local()


def configure_dynamo(graphs: int) -> None:
    """Let dynamo keep ``graphs`` entries for ``_forward`` in the calling thread, and keep every layer
    region a region (dynamo's config values are per thread, so the engine loop's thread needs its own).

    Dynamo inlines a region called once, such as LLaDA2's one dense first layer. The regions after it
    then write a copy of the cache, and their keys and values are lost (torch 2.13)."""
    if getattr(_thread_config, "graphs", 0) >= graphs:
        return
    config = torch._dynamo.config
    config.inline_single_use_invoke_subgraph = False
    config.recompile_limit = max(config.recompile_limit, graphs)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * graphs)
    _thread_config.graphs = graphs


def _layer(layer, x, cos, signed_sin, mask, kv_layer, write_slots, write_columns, rows: int, length: int,
           context_rows: int, context_start: int, context_end: int, blocks: torch.Tensor | None) -> torch.Tensor:
    """One layer over one part (``rows`` x ``length`` tokens), as eager runs it: ``context_rows`` 0, the
    part attends to its own keys; else to cache slots ``[0, context_rows)``, ``[context_start, context_end)``."""
    write = (write_slots, slice(None), slice(None), write_columns) if kv_layer is not None else None
    context = (kv_layer[:context_rows, :, :, context_start:context_end],) if context_rows else None
    plan = StepPlan([PartPlan(rows, length, 0, mask, write, context)], cos, signed_sin, (kv_layer,), blocks)
    return layer(x, plan, 0)


_layer_region = torch.compiler.nested_compile_region(_layer)


def _forward(model, tokens, positions, key_mask, key_positions, kv, write_slots, write_columns, window: bool,
             attention: PartAttention) -> torch.Tensor:
    """Embedding, rotary tables, mask and every layer of one part, ``[rows * length, hidden]``.

    Every size comes from the inputs' shapes, so an exact-shape graph traces them as sizes: a
    ``window`` reads cache slots ``[0, rows)`` and as many columns as ``key_mask`` has, where the
    part's ``attention`` puts its context (``engine.models.part_attention``)."""
    rows, length = tokens.shape
    width = kv.shape[4] - 1 if kv is not None else 0
    context = (rows, *attention.context_columns(key_mask.shape[1], width)) if window else (0, 0, 0)
    context_rows, context_start, context_end = context
    cos, signed_sin = _tables(model, positions)
    mask = attention.mask(key_mask, positions, key_positions, model.dtype)
    block = model.config.routing_block
    blocks = routing_blocks(positions.reshape(-1), block) if block else None  # padding: blocks of their own
    x = model.embed(tokens.reshape(-1))
    for index, layer in enumerate(model.layers):
        x = _layer_region(layer, x, cos, signed_sin, mask, kv[index] if kv is not None else None,
                      write_slots, write_columns, rows, length, context_rows, context_start, context_end, blocks)
    return x


def _tables(model, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables of a part's positions, computed once before the layers."""
    config = model.config
    return rotary_tables(positions.reshape(-1), config.rotary_dim, config.rope_theta,
                         rotary_dtype(model.dtype, config.rope_full_precision))


_LAYER = re.compile(r"\['layers'\]\._modules\['([0-9]+)'\]")


def guards_up_to_layer(last_guarded: int, guards) -> list[bool]:
    """Keep every guard but those on layers after ``last_guarded``, the first layer of the model's last
    kind. A model's layers are built from one config and loaded in one dtype, so the first layer of a
    kind stands for the rest of that kind (module types, parameter shapes, dtypes, devices), and the
    number of layers stays guarded. Guards are checked at every call, before the graph runs (a captured
    CUDA graph too): host time on every step, in proportion to the depth."""
    return [not (match := _LAYER.search(guard.name)) or int(match.group(1)) <= last_guarded for guard in guards]


@functools.cache
def compiled_forward(cuda_graphs: bool, last_guarded_layer: int = 0):
    """One compiled ``_forward`` per process and mode: every model and engine shares its graphs'
    cache (a new ``torch.compile`` wrapper would compile them all again). Layers after
    ``last_guarded_layer`` have no guards of their own (:func:`guards_up_to_layer`). Shapes are
    static but for the dimensions :meth:`CompiledShapes.mark` marks: nothing turns dynamic by itself
    (dynamo's automatic dynamic shapes would make a changed float, a norm's epsilon, a symbol too)."""
    options = {
        # a fused kernel rounds where eager rounds (a half-precision model's norm casts back before its
        # scale, as LLaDA's code does), so bf16 logits match eager's, not approximate them
        "emulate_precision_casts": True,
        # no size/stride asserts in the generated wrapper: ~15 Python calls a layer, every step; the
        # shapes are fixed by the bucket and checked by the guards already
        "size_asserts": False,
        "guard_filter_fn": functools.partial(guards_up_to_layer, last_guarded_layer),
    } | (
        {"triton.cudagraphs": True} if cuda_graphs else {})
    return torch.compile(_forward, dynamic=False, fullgraph=True, options=options)


class CompiledForward:
    """``forward_step`` of a :class:`BidirectionalTransformer` through compiled graphs: one per bucketed
    shape with ``static_shapes`` (the default on CUDA, whose graphs are captured), else one per kind of
    forward and row count of one or more (``engine.models.compiled_shapes``)."""

    def __init__(self, model, static_shapes: bool | None = None):
        self.model = model
        self.cuda_graphs = model.embed_tokens.weight.device.type == "cuda"
        self.shape_rule = CompiledShapes(self.cuda_graphs if static_shapes is None else static_shapes)
        moe = model.config.moe
        # the first expert layer stands for the later ones; a dense model's layer 0 for every layer
        self.forward = compiled_forward(self.cuda_graphs, 0 if moe is None else moe.first_k_dense_replace)
        self.static_caches: set[int] = set()
        self.shapes: set[tuple] = set()  # the graphs run so far, by CompiledShapes.graph key
        self.inputs = StaticInputs({})  # static shapes: each bucket's input buffers, refilled every step
        self.eager_shapes: dict[tuple, str] = {}  # graphs whose compilation failed -> the cause

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
        configure_dynamo(max_graphs(row_cap(part, kv_cache), width))
        key = self._shape_key(part, kv_cache)
        refresh, window = (part, None) if isinstance(part, RefreshPart) else (None, part)
        if key not in self.eager_shapes:
            try:
                return run(part, kv_cache)
            except COMPILE_ERRORS as error:
                cause = f"{type(error).__name__}: {next(iter(str(error).splitlines()), '')}"
                self.eager_shapes[key] = cause
                self.shapes.discard(key)
                logger.warning("compiling the %s step of %s rows x %s tokens failed (%s); this shape "
                               "runs eagerly from now on", key[0], key[1], key[2], cause)
        return self.model.forward_step_eager(refresh, window, kv_cache)

    @property
    def compile_failures(self) -> dict[str, str]:
        """Each shape that runs eagerly because its compilation failed, and why."""
        return {f"{kind} {rows}x{length}": cause for (kind, rows, length, _), cause in self.eager_shapes.items()}

    def _shape_key(self, part: RefreshPart | WindowPart, kv_cache: KVCache | None) -> tuple:
        """``(kind, rows, length, keys)`` of the graph that runs ``part`` (:meth:`CompiledShapes.graph`)."""
        if isinstance(part, RefreshPart):
            rows, length, _ = self.shape_rule.refresh(part, kv_cache)
            return self.shape_rule.graph("refresh", rows, length, length)
        return self.shape_rule.graph("window", *self.shape_rule.window(part, kv_cache))

    def _inputs(self, key: tuple, device: torch.device) -> BucketInputs:
        return self.inputs.get(key, device) if self.shape_rule.static else allocate(key, device)

    def _refresh(self, part: RefreshPart, kv_cache: KVCache | None) -> torch.Tensor:
        rows, length = part.tokens.shape
        padded_rows, padded_length, grow = self.shape_rule.refresh(part, kv_cache)
        writes, attention = part.slots is not None, part.attention
        inputs = self._inputs(("refresh", padded_rows, padded_length, padded_length, writes,
                               attention.mask_reads_positions), part.tokens.device)
        fill(inputs.tokens, part.tokens, 0, grow)
        fill(inputs.positions, part.positions, 0, grow)
        fill(inputs.key_mask, part.key_mask, False, grow)[rows:, -1] = True  # padding rows: one key, dropped
        if writes:  # columns past a left-aligned box are canvas its rows rewrite before reading
            fill(inputs.write_slots, part.slots[:, None], 0)
            first = part.first_column - grow
            inputs.write_columns[:rows] = torch.arange(first, first + padded_length, device=part.tokens.device)
            inputs.write_columns[rows:] = kv_cache.width  # padding rows write the scratch column only
        x = self._layers(inputs, inputs.positions, kv_cache if writes else None, False, attention, "refresh")
        hidden = x.view(padded_rows, padded_length, -1)[:rows, grow:grow + length]
        return self._read(part, hidden)

    def _window(self, part: WindowPart, kv_cache: KVCache) -> torch.Tensor:
        rows, length = part.tokens.shape
        padded_rows, padded_length, context = self.shape_rule.window(part, kv_cache)
        attention = part.attention
        start, end = attention.context_columns(context, kv_cache.width)
        inputs = self._inputs(("window", padded_rows, padded_length, context, True, attention.mask_reads_positions),
                              part.tokens.device)
        fill(inputs.tokens, part.tokens, 0)
        fill(inputs.positions, part.positions, 0)
        fill(inputs.write_columns, part.columns, kv_cache.width)  # padding: the scratch column
        key_mask = inputs.key_mask
        key_mask.copy_(kv_cache.key_mask[:padded_rows, start:end])
        attention.hide_added_keys(key_mask, part.context_keys(kv_cache.width))
        if inputs.key_positions is not None:
            fill(inputs.key_positions, part.key_positions, 0)
        key_mask[rows:] = False
        key_mask[rows:, attention.first_column(1, context)] = True  # padding rows see one key, are dropped
        x = self._layers(inputs, inputs.key_positions, kv_cache, True, attention, "window")
        return self._read(part, x.view(padded_rows, padded_length, -1)[:rows])

    def _layers(self, inputs: BucketInputs, key_positions: torch.Tensor | None, kv_cache: KVCache | None,
                window: bool, attention: PartAttention, kind: str) -> torch.Tensor:
        rows, length = inputs.tokens.shape
        self.shapes.add(self.shape_rule.graph(kind, rows, length, inputs.key_mask.shape[1]))
        kv = kv_cache.data if kv_cache is not None else None
        if self.cuda_graphs:
            if kv is not None and id(kv) not in self.static_caches:
                torch._dynamo.mark_static_address(kv)  # captured graphs write the cache in place
                self.static_caches.add(id(kv))
            torch.compiler.cudagraph_mark_step_begin()  # earlier outputs were copied out (see _read)
        self.shape_rule.mark(inputs.tensors())
        return self.forward(self.model, inputs.tokens, inputs.positions, inputs.key_mask, key_positions, kv,
                            inputs.write_slots, inputs.write_columns, window, attention)

    def _read(self, part: RefreshPart | WindowPart, hidden: torch.Tensor) -> torch.Tensor:
        """The part's hidden states, as a tensor of its own (a captured graph's output is overwritten
        by its next replay)."""
        read = self.model._read(part, hidden)
        return read.clone() if self.cuda_graphs else read

    @property
    def num_graphs(self) -> int:
        return len(self.shapes)

