"""What every layer of one packed forward needs, built once per step: the parts' token ranges, their
additive key masks, where their keys/values are written and read, and the rotary tables.

Built here, once, so that a layer issues only its own arithmetic: no mask conversion, no index
arithmetic and no Python loop over rows or slot runs per layer.

A window part reads the cache as one view: the slots ``[0, rows)`` that hold its rows, columns
``[context_start, width)``. One attention call serves every window row, and the cache is never copied.

Only a row's real tokens go through the linear layers: a part whose rows do not all fill its box
(ragged prompts, a window that also rewrites a finished block) is *packed*, its real tokens row after
row. Attention alone sees the box: it scatters the packed queries, keys and values into it (pad
entries zero, never read and masked as keys) and gathers the real outputs back.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from engine.models.kv_cache import KVCache
from engine.models.layers import HALF_DTYPES, rotary_tables
from engine.models.moe import routing_blocks
from engine.models.part_attention import PartAttention
from engine.models.step_inputs import RefreshPart, WindowPart


@dataclass
class PartPlan:
    rows: int
    length: int
    offset: int  # first packed token of this part
    mask: torch.Tensor  # [attention rows, 1, 1 or queries, keys] additive: 0 on keys a query may see,
    # -inf elsewhere (one row of the key mask for every query, or one per query when block-causal)
    write_index: tuple | None  # index of the cache layer its keys/values go to (None: not cached)
    context: tuple[torch.Tensor, ...] | None  # window: per layer, the cache view it reads
    # ([rows, 2, kv_heads, keys, head_dim]); None: the part attends to its own keys/values
    row_keys: tuple[int, ...] = ()  # host: row i's keys are the last row_keys[i] (batch-invariant mode)
    context_rows: tuple[int, ...] = ()  # host: row i's place in the context (window) or the part (refresh)
    token_spans: tuple[tuple[int, int], ...] = ()  # host: (first packed token, count) of each row's real tokens
    attention: PartAttention | None = None  # where rows' keys and queries sit in the box (None: a compiled
    # layer's plan, which never attends row by row)
    row_queries: tuple[int, ...] = ()  # host: row i's first queries that attend (attention.row_queries); (): all
    packed_index: torch.Tensor | None = None  # [tokens] box position (row * length + column) of each packed
    # token, row after row; None: the part's tokens are its whole box

    @property
    def num_tokens(self) -> int:
        """Tokens of this part in the packed forward: its real tokens, or its whole box."""
        return self.rows * self.length if self.packed_index is None else self.packed_index.shape[0]

    def to_box(self, packed: torch.Tensor) -> torch.Tensor:
        """``[num_tokens, ...]`` -> ``[rows * length, ...]``, zeros where the box has no real token."""
        if self.packed_index is None:
            return packed
        box = packed.new_zeros(self.rows * self.length, *packed.shape[1:])
        return box.index_copy_(0, self.packed_index, packed)

    def from_box(self, box: torch.Tensor) -> torch.Tensor:
        """``[rows * length, ...]`` -> the packed tokens' rows."""
        return box if self.packed_index is None else box.index_select(0, self.packed_index)


@dataclass
class StepPlan:
    parts: list[PartPlan]
    cos: torch.Tensor  # [tokens, 1, head_dim]
    signed_sin: torch.Tensor
    layers: tuple[torch.Tensor, ...] | None  # the cache's per-layer tensors
    routing_blocks: torch.Tensor | None = None  # [tokens] each token's routing block (block-routed MoE only)

    @property
    def num_tokens(self) -> int:
        return sum(part.num_tokens for part in self.parts)

    @property
    def token_spans(self) -> tuple[tuple[int, int], ...]:
        return tuple(span for part in self.parts for span in part.token_spans)


def plan_step(refresh: RefreshPart | None, window: WindowPart | None, kv_cache: KVCache | None,
              rotary_dtype: torch.dtype, dtype: torch.dtype, head_dim: int, theta: float,
              routing_block: int | None = None) -> StepPlan:
    """The step's plan; with ``routing_block`` (a block-routed MoE) also each packed token's routing block."""
    parts, positions = [], []
    if refresh is not None:
        parts.append(_refresh_plan(refresh, dtype))
        positions.append(refresh.positions)
    if window is not None:
        parts.append(_window_plan(window, kv_cache, dtype, offset=parts[0].num_tokens if parts else 0))
        positions.append(window.positions)
    flat = packed_tokens(parts, positions)
    cos, signed_sin = rotary_tables(flat, head_dim, theta, rotary_dtype)
    blocks = routing_blocks(flat, routing_block) if routing_block else None
    return StepPlan(parts, cos, signed_sin, kv_cache.layers if kv_cache is not None else None, blocks)


def packed_tokens(parts: list[PartPlan], boxes: list[torch.Tensor]) -> torch.Tensor:
    """The packed forward's tokens of per-part boxes ``[rows, length]`` (token ids or positions)."""
    flat = [part.from_box(box.reshape(-1)) for part, box in zip(parts, boxes)]
    return torch.cat(flat) if len(flat) > 1 else flat[0]


def _pack(spans: list[tuple[int, int]], rows: int, length: int, offset: int,
          device: torch.device) -> tuple[torch.Tensor | None, tuple[tuple[int, int], ...]]:
    """The packed index of a part's real tokens (``spans``: each row's first box position and count)
    and each row's span among the packed tokens; no index when the rows fill the box."""
    if sum(count for _, count in spans) == rows * length:
        return None, tuple((offset + start, count) for start, count in spans)
    index = torch.tensor([position for start, count in spans for position in range(start, start + count)],
                         pin_memory=device.type == "cuda")  # pinned: the copy below does not block the host
    firsts = [0, *itertools.accumulate(count for _, count in spans)][:-1]
    return index.to(device, non_blocking=True), tuple((offset + first, count)
                                                      for first, (_, count) in zip(firsts, spans))


def _refresh_plan(part: RefreshPart, dtype: torch.dtype) -> PartPlan:
    rows, length = part.tokens.shape
    write_index = None
    if part.slots is not None:
        columns = torch.arange(part.first_column, part.first_column + length, device=part.tokens.device)
        write_index = (part.slots[:, None], slice(None), slice(None), columns[None])
    row_keys = part.row_widths or (length,) * rows
    attention = part.attention
    spans = [(row * length + attention.first_column(keys, length), keys) for row, keys in enumerate(row_keys)]
    mask = attention.mask(part.key_mask, part.positions, part.positions, dtype)
    packed_index, token_spans = _pack(spans, rows, length, 0, part.tokens.device)
    return PartPlan(rows, length, 0, mask, write_index, None, row_keys, tuple(range(rows)), token_spans,
                    attention=attention, row_queries=attention.row_queries(row_keys), packed_index=packed_index)


def _window_plan(part: WindowPart, kv_cache: KVCache, dtype: torch.dtype, offset: int) -> PartPlan:
    rows, length = part.tokens.shape
    start, end = part.context_start, part.context_end or kv_cache.width
    context = kv_cache.data[:, :rows, :, :, start:end].unbind(0)
    key_mask = kv_cache.key_mask[:rows, start:end]
    # Every window query sees its row's first key: column 0 holds a prompt token at position 0, in block 0.
    attention = part.attention
    mask = attention.mask(key_mask, part.positions, part.key_positions, dtype, blind_queries=False)
    slots = torch.arange(rows, device=part.tokens.device)
    write_index = (slots[:, None], slice(None), slice(None), part.columns)
    row_keys = part.row_widths or (end - start,) * rows
    spans = [(row * length, tokens) for row, tokens in enumerate(part.row_tokens or (length,) * rows)]
    packed_index, token_spans = _pack(spans, rows, length, offset, part.tokens.device)
    return PartPlan(rows, length, offset, mask, write_index, context, row_keys, tuple(range(rows)), token_spans,
                    attention=attention, row_queries=attention.row_queries(part.row_tokens),
                    packed_index=packed_index)


def rotary_dtype(dtype: torch.dtype, full_precision: bool) -> torch.dtype:
    """The dtype q and k are rotated in: float32 for a half-precision model that asks for it (LLaDA)."""
    return torch.float32 if full_precision and dtype in HALF_DTYPES else dtype
