"""One step's inputs to an anchored-block model: per row, one span of tokens placed after its stored context.

A row's span starts at its context length (the positions already in its cache slot) and is attended either
causally (a prompt or a finished block being stored, an autoregressive token, a speculative block being
verified) or bidirectionally (a block being denoised or drafted). Every span writes its keys and values at
its positions: a stored span keeps them; a denoised span's are overwritten when the finished block is stored,
and no query ever reads a column of its row past its own span.

Rows are planned in two groups, long spans (prompts) and short ones, so a prompt does not pad every block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

LONG_SPAN = 64  # spans longer than this attend in their own group


@dataclass(frozen=True)
class SpanStep:
    """A step's spans, rows in order; the tokens packed row after row."""

    tokens: torch.Tensor  # [total] long
    slots: tuple[int, ...]
    starts: tuple[int, ...]  # each span's first position: its row's context length
    lengths: tuple[int, ...]
    causal: tuple[bool, ...]
    logit_index: torch.Tensor  # [positions] packed indices whose final hidden states are returned

    @property
    def num_rows(self) -> int:
        return len(self.slots)


@dataclass(frozen=True)
class GroupPlan:
    """One group of rows as attention reads them: queries scattered into a ``[rows, span, ...]`` box."""

    packed: torch.Tensor  # [tokens] indices of the group's tokens in the packed order
    box: torch.Tensor  # [tokens] their flat index in the box [rows * span]
    rows: int
    span: int
    slots: torch.Tensor  # [rows]
    width: int  # cache columns read
    mask: torch.Tensor  # [rows, 1, span, width] bool: query may read key


@dataclass(frozen=True)
class SpanPlan:
    positions: torch.Tensor  # [total] each packed token's position
    write_slots: torch.Tensor  # [total]
    groups: tuple[GroupPlan, ...]
    max_position: int


def plan_spans(step: SpanStep, device: torch.device) -> SpanPlan:
    offsets, total = [], 0
    for length in step.lengths:
        offsets.append(total)
        total += length
    positions = torch.cat([torch.arange(start, start + length, device=device)
                           for start, length in zip(step.starts, step.lengths)])
    write_slots = torch.cat([torch.full((length,), slot, device=device)
                             for slot, length in zip(step.slots, step.lengths)])
    rows = range(step.num_rows)
    groups = tuple(_plan_group(step, [r for r in rows if long == (step.lengths[r] > LONG_SPAN)], offsets, device)
                   for long in (False, True))
    return SpanPlan(positions, write_slots, tuple(group for group in groups if group is not None),
                    max(start + length for start, length in zip(step.starts, step.lengths)) - 1)


def _plan_group(step: SpanStep, rows: list[int], offsets: list[int], device: torch.device) -> GroupPlan | None:
    if not rows:
        return None
    span = max(step.lengths[r] for r in rows)
    width = -(-max(step.starts[r] + step.lengths[r] for r in rows) // 16) * 16  # a multiple of 16 keys
    packed = torch.cat([torch.arange(offsets[r], offsets[r] + step.lengths[r]) for r in rows])
    box = torch.cat([torch.arange(i * span, i * span + step.lengths[r]) for i, r in enumerate(rows)])
    starts = torch.tensor([step.starts[r] for r in rows])[:, None, None]
    lengths = torch.tensor([step.lengths[r] for r in rows])[:, None, None]
    causal = torch.tensor([step.causal[r] for r in rows])[:, None, None]
    query = torch.arange(span)[None, :, None]
    key = torch.arange(width)[None, None, :]
    in_span = (key >= starts) & (key < starts + lengths)
    visible = (key < starts) | (in_span & (~causal | (key - starts <= query)))
    visible |= (query >= lengths) & (key == 0)  # a padding query reads one key: no row of NaNs
    return GroupPlan(packed.to(device), box.to(device), len(rows), span,
                     torch.tensor([step.slots[r] for r in rows], device=device), width,
                     visible[:, None].to(device))


def split_by_row(step: SpanStep) -> list[SpanStep]:
    """Each row's span as a step of its own (batch-invariant mode), logits in the same order."""
    steps, offset = [], 0
    logit_index = step.logit_index.tolist()
    for row in range(step.num_rows):
        end = offset + step.lengths[row]
        own = [index - offset for index in logit_index if offset <= index < end]
        steps.append(SpanStep(step.tokens[offset:end], step.slots[row:row + 1], step.starts[row:row + 1],
                              step.lengths[row:row + 1], step.causal[row:row + 1],
                              torch.tensor(own, dtype=torch.long, device=step.tokens.device)))
        offset = end
    return steps
