"""A block-causal family's step parts (SDAR, LLaDA2): rows left-aligned, each finished block stored once.

An admitted row *prefills*: it computes columns ``[0, end of its first block)``, which writes its prompt's
keys and values and runs its first block's first step. Every other row is a window row: its active block
over its cached keys and values. A row that has just finished a block also *stores* that block, rewriting
its keys and values from the final tokens in the same window (the block before the active one), so each
finished block is written once.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.step_inputs import RefreshPart, WindowPart, aligned_keys
from engine.runner.batch import PersistentBatch, to_device
from engine.scheduling.outputs import SchedulerOutput
from engine.scheduling.request import Request


class BlockCausalParts:
    seeds_greedily = False  # a block's first position is its argmax in sampled rows too
    def assign(self, batch: PersistentBatch, scheduled: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        """(whole rows, window rows) of a step: admitted rows prefill; a row starting a block continues in
        the window, storing the block it finished; an admitted row whose prompt starts with cached blocks
        computes the rest of its prompt in the window too."""
        prefills = {id(request) for request in scheduled.admitted if not request.cached_prefix}
        window = [*scheduled.continuing, *(r for r in scheduled.starting if id(r) not in prefills)]
        return [r for r in scheduled.starting if id(r) in prefills], window

    def whole_rows(self, batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                   block_starts: torch.Tensor) -> RefreshPart:
        """The prefill: columns ``[0, end of the furthest first block)``, left-aligned."""
        ends = tuple(batch.block_start(r) + batch.block_length for r in rows)
        box = max(ends)
        return RefreshPart(tokens=batch.tokens[slots, :box], positions=batch.positions[slots, :box],
                           key_mask=batch.key_mask[slots, :box],
                           read_columns=block_starts[:, None] + batch.block_offsets, slots=slots, first_column=0,
                           row_widths=ends, block_size=batch.block_length)

    def window_rows(self, batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                    block_starts: torch.Tensor) -> WindowPart:
        """The active block, preceded by the columns whose keys/values the row writes now: the block just
        finished when it starts a new one (stored from its final tokens), or for a row admitted on a cached
        prefix the rest of its prompt. Windows are ragged and left-aligned; a shorter window's tail points
        at the scratch column."""
        block_length, width = batch.block_length, batch.width
        stored = [_unwritten_columns(batch, r) for r in rows]
        starts = [batch.block_start(r) for r in rows]
        length = block_length + max(stored)
        # Built on the host, where every value is known, and sent in one copy: fewer device operations.
        columns = [start - s + j if j < s + block_length else width
                   for start, s in zip(starts, stored) for j in range(length)]
        safe = [column if column < width else 0 for column in columns]
        reads = [s + j for s in stored for j in range(block_length)] if any(stored) else []
        columns_flat, safe_flat, reads_flat = to_device(batch.tokens, columns, safe, reads)
        safe_box = safe_flat.view(len(rows), length)
        ends = tuple(start + block_length for start in starts)
        # columns past a row's active block hold later positions: the block-causal mask hides them
        context_end = aligned_keys(max(ends), width)
        slot_rows = slots[:, None]  # packed: slots [0, n)
        return WindowPart(tokens=batch.tokens[slot_rows, safe_box], positions=batch.positions[slot_rows, safe_box],
                          columns=columns_flat.view(len(rows), length), context_start=0, num_read=block_length,
                          row_widths=ends, row_tokens=tuple(block_length + s for s in stored),
                          read_columns=reads_flat.view(len(rows), block_length) if reads else None,
                          block_size=block_length, context_end=context_end,
                          key_positions=batch.positions[:len(rows), :context_end])

    def real_columns(self, batch: PersistentBatch, request: Request) -> int:
        """A row's real columns in the step's box: up to its active block's end (the box stops there)."""
        return batch.block_start(request) + batch.block_length


def _unwritten_columns(batch: PersistentBatch, request: Request) -> int:
    """Columns before the row's active block whose keys/values its window writes this step."""
    if request.between_blocks:
        return batch.block_length
    starting = request.block_index == 0 and request.step_in_block == 0
    return batch.block_start(request) - request.cached_prefix if starting and request.cached_prefix else 0
