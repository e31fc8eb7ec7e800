"""A step's logit positions: the only positions of its active blocks whose logits it computes.

A row's decoding rule says which offsets of its active block need logits (``BlockRule.logit_offsets``):
a mask-only rule its masks, an editing rule its masks and generated tokens. The prompt's tokens in a first
block (its lead) need none. The host knows the offsets from the blocks the previous step sent back, so the
index is built there and copied with the step's other inputs, without reading the device. Positions go
row after row, in the step's row order, each row's in block order (here for a mask-only rule)::

    row 0's block:  [ p p M M c M ]        M masked, c committed, p the prompt's (lead)
    row 1's block:  [ M M M M M M ]
    positions:      (0,2) (0,3) (0,5) (1,0) (1,1) ... (1,5)        spans: (0, 3), (3, 6)

A row's settings (temperature, seed, top-k / top-p, logit bias, log-probabilities) become its positions'
here, so the decoding functions treat each logit position as a row of one position.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.runner.batch import PersistentBatch, to_device
from engine.runner.logit_processors import RowBias, TokenFilters, dense_bias
from engine.scheduling.request import Request


@dataclass(frozen=True)
class LogitPositions:
    """The logit positions of a step's active blocks, row after row."""

    rows: torch.Tensor  # [positions] the step row of each
    offsets: torch.Tensor  # [positions] its offset in that row's active block
    spans: tuple[tuple[int, int], ...]  # host: (first position, count) of each row's positions

    @property
    def num_positions(self) -> int:
        return sum(count for _, count in self.spans)


@dataclass(frozen=True)
class SampledPositions:
    """The logit positions of the rows that sample (temperature > 0), with what their draws need."""

    positions: torch.Tensor  # [k] indices among the step's logit positions
    temperatures: torch.Tensor  # [k] float32
    noise_keys: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # [k] seeds, [k] global steps, [k, 1]
    # canvas positions (see decoding.gumbel_noise)
    filters: TokenFilters | None  # top-k / top-p of each position (None: no sampled row asks for them)


@dataclass(frozen=True)
class StepLogprobs:
    """The rows that want log-probabilities, and their logit positions."""

    rows: list[int]  # host: their step rows
    counts: list[int]  # host: the alternatives each wants
    num_top: int  # the most alternatives one of them wants
    slots: torch.Tensor  # [r] their slots
    positions: torch.Tensor  # [q] their logit positions (indices among the step's)
    position_rows: torch.Tensor  # [q] each one's step row
    position_offsets: torch.Tensor  # [q] each one's offset in its block


def position_spans(offsets: Sequence[list[int]]) -> tuple[tuple[int, int], ...]:
    """(first position, count) of each row, given each row's logit offsets."""
    spans, first = [], 0
    for row_offsets in offsets:
        spans.append((first, len(row_offsets)))
        first += len(row_offsets)
    return tuple(spans)


def positions_of(spans: Sequence[tuple[int, int]], rows: Sequence[int]) -> list[int]:
    """The logit positions of ``rows`` (step rows), in order."""
    return [position for row in rows for position in range(spans[row][0], spans[row][0] + spans[row][1])]


def draw_lists(rows: Sequence[Request], sampled: Sequence[int], offsets: Sequence[list[int]],
               spans: Sequence[tuple[int, int]], block_length: int) -> list[list[int]]:
    """Host lists of the sampled positions: their indices, seeds, global steps and canvas positions (the
    noise of a position is a function of these, whatever else the batch holds)."""
    seeds, steps, canvas = [], [], []
    for index in sampled:
        request = rows[index]
        block_offset = request.block_index * block_length
        seeds += [request.seed] * len(offsets[index])
        steps += [block_offset + request.step_in_block] * len(offsets[index])
        canvas += [block_offset + offset for offset in offsets[index]]
    return [positions_of(spans, sampled), seeds, steps, canvas]


def sampled_positions(batch: PersistentBatch, rows: Sequence[Request], sampled: Sequence[int],
                      spans: Sequence[tuple[int, int]], tensors: Sequence[torch.Tensor]) -> SampledPositions:
    """The sampled positions, from their copied :func:`draw_lists` (``tensors``) and per-position settings."""
    positions, seeds, steps, canvas = tensors
    params = [rows[index].params for index in sampled for _ in range(spans[index][1])]
    (temperatures,) = to_device(batch.tokens, [float(p.temperature) for p in params], dtype=torch.float32)
    filters = None
    if any(p.filters_tokens for p in params):
        (top_k,) = to_device(batch.tokens, [p.top_k for p in params])
        (top_p,) = to_device(batch.tokens, [float(p.top_p) for p in params], dtype=torch.float64)
        filters = TokenFilters(top_k=top_k, top_p=top_p)
    return SampledPositions(positions, temperatures, (seeds, steps, canvas[:, None]), filters)


def position_bias(batch: PersistentBatch, rows: Sequence[Request],
                  spans: Sequence[tuple[int, int]]) -> RowBias | None:
    """The logit bias of every logit position of a biased row (None: no row has one)."""
    biased = [index for index, r in enumerate(rows) if r.params.logit_bias]
    if not biased:
        return None
    values = dense_bias([rows[index].params.logit_bias for index in biased], batch.vocab_size,
                        torch.float64, batch.tokens.device)
    value_rows = [place for place, index in enumerate(biased) for _ in range(spans[index][1])]
    positions, value_index = to_device(batch.tokens, positions_of(spans, biased), value_rows)
    return RowBias(rows=positions, values=values.index_select(0, value_index))


def step_logprobs(batch: PersistentBatch, rows: Sequence[Request], offsets: Sequence[list[int]],
                  spans: Sequence[tuple[int, int]]) -> StepLogprobs | None:
    """The rows that want log-probabilities and their positions (None: no row does)."""
    asking = [index for index, r in enumerate(rows) if r.params.logprobs is not None]
    if not asking:
        return None
    slots, positions, position_rows, position_offsets = to_device(
        batch.tokens, [rows[index].slot for index in asking], positions_of(spans, asking),
        [index for index in asking for _ in offsets[index]], [offset for index in asking for offset in offsets[index]])
    counts = [rows[index].params.logprobs for index in asking]
    return StepLogprobs(rows=asking, counts=counts, num_top=max(counts), slots=slots, positions=positions,
                        position_rows=position_rows, position_offsets=position_offsets)
