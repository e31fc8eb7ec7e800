"""The step parts of a block-causal family whose logits are shifted by one (Fast-dLLM v2).

Such a model predicts position i from the hidden state at i - 1, so every part reads hidden states one column
to the left of the positions it decodes. A block's first position is predicted by the last column of the block
before it, which the step that starts the block computes anyway: the prefill computes the prompt with the
first block, and a window that starts a block stores the finished one in front of it::

    window that starts block k:   [ block k-1 (stored now) | M M M M ]     offset 0 reads block k-1's last column
    later windows of block k:     [ s M c M ]                              offset j reads offset j - 1

A row admitted on a cached prefix that covers its whole prompt (a prompt of whole blocks) computes its prompt's
last column again, so that its first step sees it. The model's own loop takes that first position's argmax even
when the row samples (its rule commits the position alone while it is a mask, ``engine.rules.unmasking``), so
sampled rows get the argmax there too (:func:`greedy_block_starts`, which the block rows apply where
``seeds_greedily``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from engine.models.step_inputs import RefreshPart, WindowPart
from engine.runner.batch import PersistentBatch
from engine.runner.parts_block_causal import BlockCausalParts
from engine.scheduling.outputs import SchedulerOutput
from engine.scheduling.request import Request


class ShiftedBlockCausalParts(BlockCausalParts):
    """Block-causal parts that read each decoded position's hidden state one column to its left."""

    seeds_greedily = True

    def assign(self, batch: PersistentBatch, scheduled: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        for request in scheduled.admitted:
            if request.cached_prefix and request.cached_prefix == batch.block_start(request) and not request.block_lead:
                request.cached_prefix -= 1  # its first answer position is predicted at the prompt's last column
        return super().assign(batch, scheduled)

    def whole_rows(self, batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                   block_starts: torch.Tensor) -> RefreshPart:
        part = super().whole_rows(batch, rows, slots, block_starts)
        return dataclasses.replace(part, read_columns=_left(part.read_columns))

    def window_rows(self, batch: PersistentBatch, rows: Sequence[Request], slots: torch.Tensor,
                    block_starts: torch.Tensor) -> WindowPart:
        part = super().window_rows(batch, rows, slots, block_starts)
        if part.read_columns is not None:
            return dataclasses.replace(part, read_columns=_left(part.read_columns))
        return dataclasses.replace(part, read_shift=1)


def _left(columns: torch.Tensor) -> torch.Tensor:
    """The columns one to the left; a first block's column 0 (a prompt token, never decoded) reads itself."""
    return (columns - 1).clamp(min=0)


def greedy_block_starts(offsets: torch.Tensor, logits: torch.Tensor, candidates: torch.Tensor,
                        mask_id: int) -> torch.Tensor:
    """``candidates`` ``[positions, 1]`` with each block's first position (``offsets`` 0) proposed by its argmax,
    never MASK, in sampled rows too."""
    firsts = (offsets == 0)[:, None]  # a rule asks for it only while masked
    greedy = logits.index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf")).argmax(dim=-1)
    return torch.where(firsts, greedy, candidates)
