"""What every layer of one packed forward needs, built once per step: the parts' token ranges, their
additive key masks, where their keys/values are written and read, and the rotary tables.

Built here, once, so that a layer issues only its own arithmetic: no mask conversion, no index
arithmetic and no Python loop over rows or slot runs per layer.

A window part reads the arena as one view: the slots ``[first, first + count)`` that hold its rows,
columns ``[context_start, width)``. When other slots lie between its rows (a row starting its block in
the refresh part, a free slot), their query rows are zeros and their outputs are dropped: one
attention call whatever the slot layout, and never a copy of the cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.kv_arena import KVArena
from engine.models.layers import HALF_DTYPES, rotary_tables
from engine.models.step_inputs import RefreshPart, WindowPart


@dataclass
class PartPlan:
    rows: int
    length: int
    offset: int  # first packed token of this part
    mask: torch.Tensor  # [attention rows, 1, 1, keys] additive: 0 on real keys, -inf elsewhere
    write_index: tuple | None  # index of the arena layer its keys/values go to (None: not cached)
    context: tuple[torch.Tensor, ...] | None  # window: per layer, the arena view it reads
    # ([count, 2, kv_heads, keys, head_dim]); None: the part attends to its own keys/values
    scatter_rows: torch.Tensor | None  # window: row i sits at place scatter_rows[i] of the context
    # (None: the context holds exactly these rows, in order)
    row_keys: tuple[int, ...] = ()  # host: row i's keys are the last row_keys[i] (batch-invariant mode)
    context_rows: tuple[int, ...] = ()  # host: row i's place in the context (window) or the part (refresh)
    token_spans: tuple[tuple[int, int], ...] = ()  # host: (first packed token, count) of each row's real tokens

    @property
    def num_tokens(self) -> int:
        return self.rows * self.length


@dataclass
class StepPlan:
    parts: list[PartPlan]
    cos: torch.Tensor  # [tokens, 1, head_dim]
    signed_sin: torch.Tensor
    layers: tuple[torch.Tensor, ...] | None  # the arena's per-layer tensors

    @property
    def num_tokens(self) -> int:
        return sum(part.num_tokens for part in self.parts)

    @property
    def token_spans(self) -> tuple[tuple[int, int], ...]:
        return tuple(span for part in self.parts for span in part.token_spans)


def additive_mask(key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool ``[rows, keys]`` -> ``[rows, 1, 1, keys]`` of 0 (log 1) and -inf (log 0), in ``dtype``."""
    return key_mask.to(dtype).log_()[:, None, None, :]


def plan_step(refresh: RefreshPart | None, window: WindowPart | None, arena: KVArena | None,
              rotary_dtype: torch.dtype, dtype: torch.dtype, head_dim: int, theta: float) -> StepPlan:
    parts, positions = [], []
    if refresh is not None:
        parts.append(_refresh_plan(refresh, arena, dtype))
        positions.append(refresh.positions)
    if window is not None:
        parts.append(_window_plan(window, arena, dtype, offset=parts[0].num_tokens if parts else 0))
        positions.append(window.positions)
    flat = torch.cat([p.reshape(-1) for p in positions]) if len(positions) > 1 else positions[0].reshape(-1)
    cos, signed_sin = rotary_tables(flat, head_dim, theta, rotary_dtype)
    return StepPlan(parts, cos, signed_sin, arena.layers if arena is not None else None)


def _refresh_plan(part: RefreshPart, arena: KVArena | None, dtype: torch.dtype) -> PartPlan:
    rows, length = part.tokens.shape
    write_index = None
    if part.slots is not None:
        columns = torch.arange(part.first_column, part.first_column + length, device=part.tokens.device)
        write_index = (part.slots[:, None], slice(None), slice(None), columns[None])
    row_keys = part.row_widths or (length,) * rows
    spans = tuple((row * length + length - keys, keys) for row, keys in enumerate(row_keys))
    return PartPlan(rows, length, 0, additive_mask(part.key_mask, dtype), write_index, None, None,
                    row_keys, tuple(range(rows)), spans)


def _window_plan(part: WindowPart, arena: KVArena, dtype: torch.dtype, offset: int) -> PartPlan:
    rows, length = part.tokens.shape
    start, end = part.context_start, arena.width
    scatter_rows = None
    if part.slot_range is None:  # no host-side layout known: gather the rows' cache (copies it)
        context = tuple(layer[part.slots, :, :, start:end] for layer in arena.layers)
        key_mask = arena.key_mask[part.slots, start:end]
    else:
        first, count = part.slot_range
        context = arena.kv[:, first:first + count, :, :, start:end].unbind(0)
        key_mask = arena.key_mask[first:first + count, start:end]
        if count != rows:
            scatter_rows = part.slots - first
    write_index = (part.slots[:, None], slice(None), slice(None), part.columns)
    row_keys = part.row_widths or (end - start,) * rows
    context_rows = tuple(range(rows)) if scatter_rows is None else ()  # () unknown: per-row attention refuses
    if part.slot_range is not None and part.row_slots:
        context_rows = tuple(slot - part.slot_range[0] for slot in part.row_slots)
    spans = tuple((offset + row * length, tokens) for row, tokens in enumerate(part.row_tokens or (length,) * rows))
    return PartPlan(rows, length, offset, additive_mask(key_mask, dtype), write_index, context, scatter_rows,
                    row_keys, context_rows, spans)


def rotary_dtype(dtype: torch.dtype, full_precision: bool) -> torch.dtype:
    """The dtype q and k are rotated in: float32 for a half-precision model that asks for it (LLaDA)."""
    return torch.float32 if full_precision and dtype in HALF_DTYPES else dtype
