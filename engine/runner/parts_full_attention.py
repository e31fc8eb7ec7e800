"""A full-attention family's step parts (LLaDA, Dream): rows right-aligned, each block's first step refreshes.

A row starting a block is a *refresh* row: the whole row is computed in the box of the widest one, which
rebuilds its keys and values from its current tokens. A row continuing its block is a *window* row: the
block (``dual``) or the block to the row's end (``prefix``) against the cached keys and values. Without a
cache every row is a refresh row. A shifted family (Dream) reads each block position's logits one column
to the left, and its windows may start ``window_lookback`` columns before the block.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.step_inputs import RefreshPart, WindowPart, aligned_keys
from engine.runner.batch import PersistentBatch
from engine.scheduling.outputs import SchedulerOutput
from engine.scheduling.request import Request


class FullAttentionParts:
    seeds_greedily = False  # a block's first position is its argmax in sampled rows too
    def assign(self, batch: PersistentBatch, scheduled: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        """(whole rows, window rows) of a step: the scheduler's starting and continuing rows, or with no cache
        every row whole."""
        if batch.kv_cache is None:
            return [*scheduled.starting, *scheduled.continuing], []
        return list(scheduled.starting), list(scheduled.continuing)

    def whole_rows(self, batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                   block_starts: torch.Tensor) -> RefreshPart:
        """Whole rows, in the bounding box of the widest one."""
        width = batch.width
        first = width - max(r.width for r in rows)
        read = block_starts[:, None] - first - batch.logit_shift + batch.block_offsets
        return RefreshPart(tokens=batch.tokens[slots, first:], positions=batch.positions[slots, first:],
                           key_mask=batch.key_mask[slots, first:width], read_columns=read,
                           slots=slots if batch.kv_cache is not None else None, first_column=first,
                           row_widths=tuple(r.width for r in rows))

    def window_rows(self, batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                    block_starts: torch.Tensor) -> WindowPart:
        """dual: the block; prefix: the block to the row's end. Either starts ``window_lookback`` columns
        before the block (a shifted family then predicts every block position from the window).

        Prefix windows are ragged and left-aligned: a shorter row's missing tail points at the scratch
        column, which is never attended.
        """
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
        # columns left of a row are never its keys (PersistentBatch.place), so widening the box is free
        context = aligned_keys(max(r.width for r in rows), width)
        return WindowPart(tokens=batch.tokens[slot_rows, safe], positions=batch.positions[slot_rows, safe],
                          columns=columns, context_start=width - context,
                          num_read=batch.block_length, read_shift=batch.logit_shift - lookback,
                          row_widths=tuple(r.width for r in rows), row_tokens=row_tokens)

    def real_columns(self, batch: PersistentBatch, request: Request) -> int:
        """A row's real columns in the step's box: its whole width."""
        return request.width
