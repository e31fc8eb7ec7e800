"""The tensors of one step, built from the persistent batch without changing it.

:func:`prepare_inputs` runs after ``PersistentBatch.pack_window_rows``, so the window rows hold slots
``[0, n)`` in slot order. Refresh rows come first in every per-row tensor, then window rows.

A block-causal family's step has the same two parts with other contents. Its refresh rows are the
admitted ones: they prefill their prompt and run their first block's first step, columns
``[0, end of block)``. Its window rows run their active block over their cached keys/values. A row
that has just finished a block also rewrites that block's keys/values from its final tokens, in the
same window (the block before the active one), so each finished block is written once.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.batch import PersistentBatch, to_device
from engine.logit_processors import RowBias, TokenFilters, dense_bias
from engine.models.step_inputs import RefreshPart, WindowPart
from engine.request import Request
from engine.trace import ForwardRecord


@dataclass
class StepBatch:
    """What one step runs, row by row (refresh rows first, then window rows)."""

    request_ids: list[str]
    refresh: RefreshPart | None
    window: WindowPart | None
    slots: torch.Tensor  # [rows]
    block_columns: torch.Tensor  # [rows, block_length] batch columns of each row's active block
    step_in_block: torch.Tensor  # [rows] denoising step within the row's current block
    sampled_rows: torch.Tensor | None  # [k] rows with temperature > 0 (None: every row is greedy)
    noise_keys: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # seeds, global steps, canvas
    # positions of the sampled rows (see decoding.gumbel_noise)
    temperatures: torch.Tensor | None  # [len(sampled_rows)]
    filters: TokenFilters | None  # top-k / top-p of the sampled rows (None: none asks for them)
    bias: RowBias | None  # logit bias of the rows that have one (None: none has)
    logprob_rows: torch.Tensor | None  # [r] rows whose request wants log-probabilities (None: none)
    num_top_logprobs: int  # the most alternatives one of them wants
    logprob_counts: list[int]  # the alternatives each of them wants (host side)
    leads: list[int]  # host: prompt tokens at the start of each row's active block (see Request.lead)
    answer_starts: torch.Tensor | None  # [rows] the same on the device (None: every lead is 0)
    record: ForwardRecord

    @property
    def num_rows(self) -> int:
        return len(self.request_ids)


def prepare_inputs(batch: PersistentBatch, refresh: Sequence[Request], window: Sequence[Request]) -> StepBatch:
    """Tensors for one step: ``refresh`` rows start a block (whole rows), ``window`` rows continue."""
    refresh, window = sorted(refresh, key=_slot), sorted(window, key=_slot)
    rows = [*refresh, *window]
    sampled = [index for index, r in enumerate(rows) if r.params.temperature > 0]
    picked = [rows[index] for index in sampled]
    slots, block_starts, step_in_block, sampled_rows, seeds, block_indices, picked_steps = to_device(
        batch.tokens, [r.slot for r in rows], [batch.block_start(r) for r in rows],
        [r.step_in_block for r in rows], sampled, [r.seed for r in picked], [r.block_index for r in picked],
        [r.step_in_block for r in picked])
    refresh_part = _refresh_part(batch, refresh, slots[:len(refresh)], block_starts[:len(refresh)])
    window_part = _window_part(batch, window, slots[len(refresh):], block_starts[len(refresh):])
    noise_keys = temperatures = None
    if sampled:
        block_length = batch.block_length
        noise_keys = (seeds, block_indices * block_length + picked_steps,
                      block_indices[:, None] * block_length + batch.block_offsets)
        (temperatures,) = to_device(batch.tokens, [float(r.params.temperature) for r in picked], dtype=torch.float32)
    wants_logprobs = [index for index, r in enumerate(rows) if r.params.logprobs is not None]
    leads = [r.block_lead for r in rows]
    return StepBatch(
        request_ids=[r.request_id for r in rows], refresh=refresh_part, window=window_part, slots=slots,
        block_columns=block_starts[:, None] + batch.block_offsets, step_in_block=step_in_block,
        sampled_rows=sampled_rows if sampled else None, noise_keys=noise_keys, temperatures=temperatures,
        filters=_filters(batch, picked), bias=_bias(batch, rows),
        logprob_rows=to_device(batch.tokens, wants_logprobs)[0] if wants_logprobs else None,
        num_top_logprobs=max((rows[index].params.logprobs for index in wants_logprobs), default=0),
        logprob_counts=[rows[index].params.logprobs for index in wants_logprobs],
        leads=leads, answer_starts=to_device(batch.tokens, leads)[0] if any(leads) else None,
        record=_record(batch, refresh, window, refresh_part, window_part))


def _filters(batch: PersistentBatch, sampled: Sequence[Request]) -> TokenFilters | None:
    """Top-k / top-p tensors for the sampled rows, only when one of them asks (no cost otherwise)."""
    if not any(r.params.filters_tokens for r in sampled):
        return None
    (top_k,) = to_device(batch.tokens, [r.params.top_k for r in sampled])
    (top_p,) = to_device(batch.tokens, [float(r.params.top_p) for r in sampled], dtype=torch.float64)
    return TokenFilters(top_k=top_k, top_p=top_p)


def _bias(batch: PersistentBatch, rows: Sequence[Request]) -> RowBias | None:
    biased = [index for index, r in enumerate(rows) if r.params.logit_bias]
    if not biased:
        return None
    values = dense_bias([rows[index].params.logit_bias for index in biased], batch.vocab_size,
                        torch.float64, batch.tokens.device)
    return RowBias(rows=to_device(batch.tokens, biased)[0], values=values)


def _refresh_part(batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                  block_starts: torch.Tensor) -> RefreshPart | None:
    """Whole rows, in the bounding box of the widest one."""
    if not rows:
        return None
    if batch.block_causal:
        return _prefill_part(batch, rows, slots, block_starts)
    width = batch.width
    first = width - max(r.width for r in rows)
    read = block_starts[:, None] - first - batch.logit_shift + batch.block_offsets
    return RefreshPart(tokens=batch.tokens[slots, first:], positions=batch.positions[slots, first:],
                       key_mask=batch.key_mask[slots, first:width], read_columns=read,
                       slots=slots if batch.kv_cache is not None else None, first_column=first,
                       row_widths=tuple(r.width for r in rows))


def _window_part(batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                 block_starts: torch.Tensor) -> WindowPart | None:
    """dual: the block; prefix: the block to the row's end. Either starts ``window_lookback`` columns
    before the block (a shifted family then predicts every block position from the window).

    Prefix windows are ragged and left-aligned: a shorter row's missing tail points at the scratch
    column, which is never attended.
    """
    if not rows:
        return None
    if batch.block_causal:
        return _block_window_part(batch, rows, slots, block_starts)
    width, lookback = batch.width, batch.window_lookback
    starts = block_starts - lookback
    if batch.cache_mode == "dual":
        row_tokens = (batch.block_length + lookback,) * len(rows)
    else:
        row_tokens = tuple(width - batch.block_start(r) + lookback for r in rows)
    columns = starts[:, None] + torch.arange(max(row_tokens), device=starts.device)
    columns = columns.masked_fill(columns >= width, width)
    safe = columns.masked_fill(columns >= width, 0)
    slot_rows = slots[:, None]  # packed: slots [0, n)
    return WindowPart(tokens=batch.tokens[slot_rows, safe], positions=batch.positions[slot_rows, safe],
                      columns=columns, context_start=width - max(r.width for r in rows),
                      num_read=batch.block_length, read_shift=batch.logit_shift - lookback,
                      row_widths=tuple(r.width for r in rows), row_tokens=row_tokens)


def _prefill_part(batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                  block_starts: torch.Tensor) -> RefreshPart:
    """Block-causal rows' first step: columns ``[0, end of the furthest first block)``, left-aligned."""
    ends = tuple(batch.block_start(r) + batch.block_length for r in rows)
    box = max(ends)
    return RefreshPart(tokens=batch.tokens[slots, :box], positions=batch.positions[slots, :box],
                       key_mask=batch.key_mask[slots, :box], read_columns=block_starts[:, None] + batch.block_offsets,
                       slots=slots, first_column=0, row_widths=ends, block_size=batch.block_length)


def _block_window_part(batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                       block_starts: torch.Tensor) -> WindowPart:
    """Block-causal window rows: the active block, preceded by the block just finished when the row
    starts a new one (its keys/values rewritten from its final tokens). Windows are ragged and
    left-aligned; a shorter window's tail points at the scratch column."""
    block_length, width = batch.block_length, batch.width
    stored = [block_length if r.between_blocks else 0 for r in rows]
    (stored_columns,) = to_device(batch.tokens, stored)
    length = block_length + max(stored)
    offsets = torch.arange(length, device=slots.device)
    columns = (block_starts - stored_columns)[:, None] + offsets
    real = offsets < (stored_columns + block_length)[:, None]
    safe = columns.masked_fill(~real, 0)
    ends = tuple(batch.block_start(r) + block_length for r in rows)
    context_end = max(ends)
    slot_rows = slots[:, None]  # packed: slots [0, n)
    return WindowPart(tokens=batch.tokens[slot_rows, safe], positions=batch.positions[slot_rows, safe],
                      columns=columns.masked_fill(~real, width), context_start=0, num_read=block_length,
                      row_widths=ends, row_tokens=tuple(block_length + s for s in stored),
                      read_columns=stored_columns[:, None] + batch.block_offsets if any(stored) else None,
                      block_size=block_length, context_end=context_end,
                      key_positions=batch.positions[:len(rows), :context_end])


def _record(batch: PersistentBatch, refresh: Sequence[Request], window: Sequence[Request],
            refresh_part: RefreshPart | None, window_part: WindowPart | None) -> ForwardRecord:
    return ForwardRecord(
        refresh_rows=len(refresh),
        refresh_width=refresh_part.tokens.shape[1] if refresh_part is not None else 0,
        window_rows=len(window),
        window_tokens=window_part.tokens.shape[1] if window_part is not None else 0,
        window_context=((window_part.context_end or batch.width) - window_part.context_start
                        if window_part is not None else 0),
        logit_positions=(len(refresh) + len(window)) * batch.block_length,
        real_tokens=sum(_real_columns(batch, r) for r in (*refresh, *window)),
        refresh_pad_tokens=_pad_tokens(refresh_part.tokens, refresh_part.row_widths) if refresh_part else 0,
        window_pad_tokens=_pad_tokens(window_part.tokens, window_part.row_tokens) if window_part else 0)


def _pad_tokens(box: torch.Tensor, row_tokens: tuple[int, ...]) -> int:
    """Positions of a part's box ``[rows, length]`` that hold no real token (``row_tokens``: () when
    every row fills it)."""
    return box.numel() - sum(row_tokens) if row_tokens else 0


def _real_columns(batch: PersistentBatch, request: Request) -> int:
    """A row's real columns in the step's box: its whole width, or for a block-causal row the columns
    up to its active block's end (the box it is computed in stops there)."""
    return batch.block_start(request) + batch.block_length if batch.block_causal else request.width


def _slot(request: Request) -> int:
    return request.slot
