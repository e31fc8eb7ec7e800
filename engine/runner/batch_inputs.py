"""The tensors of one step, built from the persistent batch without changing it.

:func:`prepare_inputs` runs after ``PersistentBatch.pack_window_rows``, so the window rows hold slots
``[0, n)`` in slot order. Whole rows come first in every per-row tensor, then window rows. What the two
parts hold is the layout's (:class:`StepParts`): ``engine.runner.parts_full_attention`` refreshes whole rows,
``engine.runner.parts_block_causal`` prefills admitted rows and stores finished blocks in the window.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.models.layout import RowLayout
from engine.models.step_inputs import RefreshPart, WindowPart
from engine.runner.batch import PersistentBatch, to_device
from engine.runner.logit_processors import RowBias, TokenFilters, dense_bias
from engine.runner.parts_block_causal import BlockCausalParts
from engine.runner.parts_full_attention import FullAttentionParts
from engine.scheduling.outputs import SchedulerOutput
from engine.scheduling.request import Request
from engine.scheduling.trace import ForwardRecord


class StepParts(Protocol):
    """How a layout fills a step's two parts: its whole rows and its window rows."""

    def assign(self, batch: PersistentBatch, scheduled: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        """The step's (whole rows, window rows)."""

    def whole_rows(self, batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                   block_starts: torch.Tensor) -> RefreshPart: ...

    def window_rows(self, batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                    block_starts: torch.Tensor) -> WindowPart: ...

    def real_columns(self, batch: PersistentBatch, request: Request) -> int:
        """A row's real columns in the box its part computes."""


def step_parts(layout: RowLayout) -> StepParts:
    return BlockCausalParts() if layout.stores_finished_blocks else FullAttentionParts()


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


def prepare_inputs(batch: PersistentBatch, parts: StepParts, refresh: Sequence[Request],
                   window: Sequence[Request]) -> StepBatch:
    """Tensors for one step: ``refresh`` rows are computed whole, ``window`` rows in their windows."""
    refresh, window = sorted(refresh, key=_slot), sorted(window, key=_slot)
    rows = [*refresh, *window]
    sampled = [index for index, r in enumerate(rows) if r.params.temperature > 0]
    picked = [rows[index] for index in sampled]
    slots, block_starts, step_in_block, sampled_rows, seeds, block_indices, picked_steps = to_device(
        batch.tokens, [r.slot for r in rows], [batch.block_start(r) for r in rows],
        [r.step_in_block for r in rows], sampled, [r.seed for r in picked], [r.block_index for r in picked],
        [r.step_in_block for r in picked])
    refresh_part = parts.whole_rows(batch, refresh, slots[:len(refresh)], block_starts[:len(refresh)]) \
        if refresh else None
    window_part = parts.window_rows(batch, window, slots[len(refresh):], block_starts[len(refresh):]) \
        if window else None
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
        record=_record(batch, parts, refresh, window, refresh_part, window_part))


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


def _record(batch: PersistentBatch, parts: StepParts, refresh: Sequence[Request], window: Sequence[Request],
            refresh_part: RefreshPart | None, window_part: WindowPart | None) -> ForwardRecord:
    return ForwardRecord(
        refresh_rows=len(refresh),
        refresh_width=refresh_part.tokens.shape[1] if refresh_part is not None else 0,
        window_rows=len(window),
        window_tokens=window_part.tokens.shape[1] if window_part is not None else 0,
        window_context=((window_part.context_end or batch.width) - window_part.context_start
                        if window_part is not None else 0),
        logit_positions=(len(refresh) + len(window)) * batch.block_length,
        real_tokens=sum(parts.real_columns(batch, r) for r in (*refresh, *window)),
        refresh_pad_tokens=_pad_tokens(refresh_part.tokens, refresh_part.row_widths) if refresh_part else 0,
        window_pad_tokens=_pad_tokens(window_part.tokens, window_part.row_tokens) if window_part else 0)


def _pad_tokens(box: torch.Tensor, row_tokens: tuple[int, ...]) -> int:
    """Positions of a part's box ``[rows, length]`` that hold no real token (``row_tokens``: () when
    every row fills it)."""
    return box.numel() - sum(row_tokens) if row_tokens else 0


def _slot(request: Request) -> int:
    return request.slot
