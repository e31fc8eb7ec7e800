"""The tensors of one step, built from the persistent batch without changing it.

:func:`prepare_inputs` runs after ``PersistentBatch.pack_window_rows``, so the window rows hold slots
``[0, n)`` in slot order. Whole rows come first in every per-row tensor, then window rows. What the two
parts hold is the layout's (:class:`StepParts`): ``engine.runner.parts_full_attention`` refreshes whole rows,
``engine.runner.parts_block_causal`` prefills admitted rows and stores finished blocks in the window.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.models.layout import RowLayout
from engine.models.step_inputs import RefreshPart, WindowPart
from engine.runner.batch import PersistentBatch, to_device
from engine.runner.logit_positions import (
    LogitPositions,
    SampledPositions,
    StepLogprobs,
    draw_lists,
    position_bias,
    position_spans,
    sampled_positions,
    step_logprobs,
)
from engine.runner.logit_processors import RowBias
from engine.runner.parts_block_causal import BlockCausalParts
from engine.runner.parts_full_attention import FullAttentionParts
from engine.runner.parts_shifted_block_causal import ShiftedBlockCausalParts
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


STEP_PARTS: dict[str, type] = {"bidirectional": FullAttentionParts, "block_causal": BlockCausalParts}


def step_parts(layout: RowLayout) -> StepParts:
    """The parts of a block rows' step, by the layout's row kind (shifted logits: read one column left)."""
    if layout.block_causal and layout.logit_shift:
        return ShiftedBlockCausalParts()
    return STEP_PARTS[layout.row_kind]()


@dataclass
class StepBatch:
    """What one step runs, row by row (refresh rows first, then window rows), and the logit positions of
    the rows' active blocks, the only ones whose logits it computes (``engine.runner.logit_positions``)."""

    request_ids: list[str]
    refresh: RefreshPart | None
    window: WindowPart | None
    slots: torch.Tensor  # [rows]
    block_columns: torch.Tensor  # [rows, block_length] batch columns of each row's active block
    step_in_block: torch.Tensor  # [rows] denoising step within the row's current block
    positions: LogitPositions
    rows: list[Request]  # host: the step's rows, in its order
    sampled: SampledPositions | None  # the positions of rows with temperature > 0 (None: every row is greedy)
    bias: RowBias | None  # logit bias of the positions of rows that have one (None: none has)
    logprobs: StepLogprobs | None  # rows whose request wants log-probabilities (None: none)
    leads: list[int]  # host: prompt tokens at the start of each row's active block (see Request.lead)
    record: ForwardRecord

    @property
    def num_rows(self) -> int:
        return len(self.request_ids)


def prepare_inputs(batch: PersistentBatch, parts: StepParts, refresh: Sequence[Request],
                   window: Sequence[Request], logit_offsets: Callable[[Request], list[int]]) -> StepBatch:
    """Tensors for one step: ``refresh`` rows are computed whole, ``window`` rows in their windows, and
    each row's logits at its ``logit_offsets``, the offsets its decoding rule reads."""
    refresh, window = sorted(refresh, key=_slot), sorted(window, key=_slot)
    rows = [*refresh, *window]
    offsets = [logit_offsets(r) for r in rows]
    spans = position_spans(offsets)
    sampled = [index for index, r in enumerate(rows) if r.params.temperature > 0]
    draws = draw_lists(rows, sampled, offsets, spans, batch.block_length) if sampled else []
    slots, block_starts, step_in_block, position_rows, position_offsets, *draw_tensors = to_device(
        batch.tokens, [r.slot for r in rows], [batch.block_start(r) for r in rows], [r.step_in_block for r in rows],
        [row for row, row_offsets in enumerate(offsets) for _ in row_offsets],
        [offset for row_offsets in offsets for offset in row_offsets], *draws)
    refresh_part = parts.whole_rows(batch, refresh, slots[:len(refresh)], block_starts[:len(refresh)]) \
        if refresh else None
    window_part = parts.window_rows(batch, window, slots[len(refresh):], block_starts[len(refresh):]) \
        if window else None
    positions = LogitPositions(rows=position_rows, offsets=position_offsets, spans=spans)
    return StepBatch(
        request_ids=[r.request_id for r in rows], refresh=refresh_part, window=window_part, slots=slots,
        block_columns=block_starts[:, None] + batch.block_offsets, step_in_block=step_in_block, positions=positions,
        sampled=sampled_positions(batch, rows, sampled, spans, draw_tensors) if sampled else None,
        bias=position_bias(batch, rows, spans), logprobs=step_logprobs(batch, rows, offsets, spans),
        leads=[r.block_lead for r in rows],
        rows=rows, record=_record(batch, parts, refresh, window, refresh_part, window_part, positions.num_positions))


def _record(batch: PersistentBatch, parts: StepParts, refresh: Sequence[Request], window: Sequence[Request],
            refresh_part: RefreshPart | None, window_part: WindowPart | None, logit_positions: int) -> ForwardRecord:
    return ForwardRecord(
        refresh_rows=len(refresh),
        refresh_width=refresh_part.tokens.shape[1] if refresh_part is not None else 0,
        window_rows=len(window),
        window_tokens=window_part.tokens.shape[1] if window_part is not None else 0,
        window_context=_window_box(window_part, batch.width) if window_part is not None else 0,
        logit_positions=logit_positions,
        real_tokens=sum(parts.real_columns(batch, r) for r in (*refresh, *window)),
        refresh_pad_tokens=_pad_tokens(refresh_part.tokens, refresh_part.row_widths) if refresh_part else 0,
        window_pad_tokens=_pad_tokens(window_part.tokens, window_part.row_tokens) if window_part else 0)


def _window_box(part: WindowPart, width: int) -> int:
    """Keys of the window rows' bounding box: its widest row's (its context before key alignment)."""
    return max(part.row_widths) if part.row_widths else (part.context_end or width) - part.context_start


def _pad_tokens(box: torch.Tensor, row_tokens: tuple[int, ...]) -> int:
    """Positions of a part's box ``[rows, length]`` that hold no real token (``row_tokens``: () when
    every row fills it)."""
    return box.numel() - sum(row_tokens) if row_tokens else 0


def _slot(request: Request) -> int:
    return request.slot
