"""The persistent batch: the only place that knows slots, right alignment, positions and block columns.

Every running request owns a slot of a preallocated arena. Its row (prompt + canvas) sits right-aligned
in the slot, so rows of any width share one column frame and a bounding box of width ``w`` is the last
``w`` columns of the slots it holds::

    slot 0:  . . . . [ prompt 0         | blk | blk |>blk<| blk ]
    slot 1:  . . [ prompt 1 (longer)          |>blk<| blk | blk ]
    slot 2:  (free)
    slot 3:  . . . . . . . . . [ prompt 3 | blk |>blk<| blk ]        + one scratch column
                                              >blk< = the row's active block

Positions start at 0 on each row's first real token and the columns left of a row are masked as keys,
so a row computes exactly what it would alone. Slots are handed out lowest first and a leaving row
only returns its slot: nothing is copied.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.logit_processors import RowBias, TokenFilters, dense_bias
from engine.models.kv_arena import KVArena
from engine.models.loader import DiffusionLM
from engine.models.step_inputs import RefreshPart, WindowPart
from engine.request import Request
from engine.trace import ForwardRecord


@dataclass
class StepBatch:
    """What one step runs, row by row (refresh rows first, then window rows). Data only."""

    request_ids: list[str]
    refresh: RefreshPart | None
    window: WindowPart | None
    slots: torch.Tensor  # [rows]
    block_columns: torch.Tensor  # [rows, block_length] arena columns of each row's active block
    steps: torch.Tensor  # [rows] denoising step within the row's current block
    sampled_rows: torch.Tensor | None  # [k] rows with temperature > 0 (None: every row is greedy)
    noise_keys: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # seeds, global steps, canvas
    # positions of the sampled rows (see decoding.gumbel_noise)
    temperatures: torch.Tensor | None  # [len(sampled_rows)]
    filters: TokenFilters | None  # top-k / top-p of the sampled rows (None: none asks for them)
    bias: RowBias | None  # logit bias of the rows that have one (None: none has)
    logprob_rows: torch.Tensor | None  # [r] rows whose request wants log-probabilities (None: none)
    num_top_logprobs: int  # the most alternatives one of them wants
    logprob_counts: list[int]  # the alternatives each of them wants (host side)
    record: ForwardRecord
    moved_slots: tuple[tuple[int, int], ...] = ()  # (from, to) of rows moved mid-block before this step

    @property
    def num_rows(self) -> int:
        return len(self.request_ids)


class RowArena:
    """Token ids, positions, key masks and (with a cache) keys/values for ``slots`` rows of ``width``."""

    def __init__(self, lm: DiffusionLM, slots: int, width: int, block_length: int, cache_mode: str,
                 window_lookback: int = 0):
        device = lm.device
        self.width, self.block_length, self.cache_mode = width, block_length, cache_mode
        self.mask_id, self.pad_id, self.logit_shift = lm.tokens.mask_id, lm.tokens.pad_id, lm.logit_shift
        self.vocab_size = lm.vocab_size
        self.window_lookback = window_lookback  # columns a window starts before the block (<= logit_shift)
        self.kv = KVArena(lm.model.config, slots, width, lm.dtype, device) if cache_mode != "none" else None
        self.key_mask = (self.kv.key_mask if self.kv is not None
                         else torch.zeros((slots, width + 1), dtype=torch.bool, device=device))
        self.tokens = torch.full((slots, width), self.pad_id, dtype=torch.long, device=device)
        self.positions = torch.zeros((slots, width), dtype=torch.long, device=device)
        self._columns = torch.arange(width, device=device)
        self._block_offsets = torch.arange(block_length, device=device)
        self._free = list(range(slots))
        self._owners: dict[int, Request] = {}  # slot -> the running request that holds it

    @property
    def num_bytes(self) -> int:
        """Bytes of every tensor the arena holds (they are allocated once, here)."""
        state = [self.tokens, self.positions] + ([] if self.kv is not None else [self.key_mask])
        return sum(t.numel() * t.element_size() for t in state) + (self.kv.num_bytes if self.kv else 0)

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    # -- rows --------------------------------------------------------------------------------------
    def row_start(self, request: Request) -> int:
        """Arena column of the request's first prompt token."""
        return self.width - request.width

    def block_start(self, request: Request) -> int:
        """Arena column of the first token of the request's current block."""
        return self.row_start(request) + request.block_start

    def place(self, request: Request) -> None:
        """Give the request a slot and write its row: pads, prompt, a canvas of masks."""
        slot = heapq.heappop(self._free)
        start = self.row_start(request)
        prompt = self._to_device(request.prompt_token_ids)[0]
        self.tokens[slot, :start] = self.pad_id
        self.tokens[slot, start:start + request.prompt_length] = prompt
        self.tokens[slot, start + request.prompt_length:] = self.mask_id
        self.positions[slot] = (self._columns - start).clamp(min=0)
        self.key_mask[slot] = False
        self.key_mask[slot, start:self.width] = True
        request.slot = slot
        self._owners[slot] = request

    def release(self, request: Request) -> None:
        if request.slot is not None:
            heapq.heappush(self._free, request.slot)
            del self._owners[request.slot]
            request.slot = None

    def _pack_window_rows(self, window: Sequence[Request]) -> tuple[tuple[int, int], ...]:
        """Move rows so the window rows hold slots ``[0, len(window))``, and return the window rows'
        moves ``(from, to)``.

        A window row above that range moves into a hole below it with its cache (one copy of its
        keys/values, all layers at once). A row in the way is not in its block's middle (it starts a
        block now, or waits to at a block boundary), so its next forward rewrites every column of its
        cache: it takes the vacated slot with its tokens only. So a window step reads its cache as one
        view of consecutive slots, with no row between its rows.
        """
        count = len(window)
        in_place = {r.slot for r in window if r.slot < count}
        holes = [slot for slot in range(count) if slot not in in_place]
        movers = sorted((r for r in window if r.slot >= count), key=_slot)
        moves = []
        for hole, mover in zip(holes, movers):
            vacated = mover.slot
            holder = self._owners.get(hole)
            if holder is not None:
                holder_row = self._row(hole)
                self._write_row(hole, self._row(vacated), cache_from=vacated)
                self._write_row(vacated, holder_row)
                holder.slot, self._owners[vacated] = vacated, holder
            else:
                self._write_row(hole, self._row(vacated), cache_from=vacated)
                self._free.remove(hole)
                heapq.heapify(self._free)
                heapq.heappush(self._free, vacated)
                del self._owners[vacated]
            mover.slot, self._owners[hole] = hole, mover
            moves.append((vacated, hole))
        return tuple(moves)

    def _row(self, slot: int) -> tuple[torch.Tensor, ...]:
        """A copy of a slot's tokens, positions and key mask."""
        return self.tokens[slot].clone(), self.positions[slot].clone(), self.key_mask[slot].clone()

    def _write_row(self, slot: int, row: tuple[torch.Tensor, ...], cache_from: int | None = None) -> None:
        self.tokens[slot], self.positions[slot], self.key_mask[slot] = row
        if cache_from is not None:
            self.kv.kv[:, slot] = self.kv.kv[:, cache_from]

    # -- one step ----------------------------------------------------------------------------------
    def build_step(self, refresh: Sequence[Request], window: Sequence[Request]) -> StepBatch:
        """Tensors for one step: ``refresh`` rows start a block (whole rows), ``window`` rows continue.

        Without a cache every step is a whole-row forward."""
        if self.kv is None:
            refresh, window = [*refresh, *window], []
        moved = self._pack_window_rows(window)
        refresh, window = sorted(refresh, key=_slot), sorted(window, key=_slot)
        rows = [*refresh, *window]
        sampled = [index for index, r in enumerate(rows) if r.params.temperature > 0]
        picked = [rows[index] for index in sampled]
        slots, block_starts, steps, sampled_rows, seeds, block_indices, picked_steps = self._to_device(
            [r.slot for r in rows], [self.block_start(r) for r in rows], [r.step_in_block for r in rows],
            sampled, [r.seed for r in picked], [r.block_index for r in picked], [r.step_in_block for r in picked])
        refresh_part = self._refresh_part(refresh, slots[:len(refresh)], block_starts[:len(refresh)])
        window_part = self._window_part(window, slots[len(refresh):], block_starts[len(refresh):])
        noise_keys = temperatures = None
        if sampled:
            noise_keys = (seeds, block_indices * self.block_length + picked_steps,
                          block_indices[:, None] * self.block_length + self._block_offsets)
            temperatures = self._to_device([float(r.params.temperature) for r in picked], dtype=torch.float32)[0]
        filters, bias = self._filters(picked), self._bias(rows)
        wants_logprobs = [index for index, r in enumerate(rows) if r.params.logprobs is not None]
        return StepBatch(
            request_ids=[r.request_id for r in rows], refresh=refresh_part, window=window_part, slots=slots,
            block_columns=block_starts[:, None] + self._block_offsets, steps=steps,
            sampled_rows=sampled_rows if sampled else None, noise_keys=noise_keys, temperatures=temperatures,
            filters=filters, bias=bias,
            logprob_rows=self._to_device(wants_logprobs)[0] if wants_logprobs else None,
            num_top_logprobs=max((rows[index].params.logprobs for index in wants_logprobs), default=0),
            logprob_counts=[rows[index].params.logprobs for index in wants_logprobs],
            record=self._record(refresh, window, refresh_part, window_part), moved_slots=moved)

    def _filters(self, sampled: Sequence[Request]) -> TokenFilters | None:
        """Top-k / top-p tensors for the sampled rows, only when one of them asks (no cost otherwise)."""
        if not any(r.params.filters_tokens for r in sampled):
            return None
        (top_k,) = self._to_device([r.params.top_k for r in sampled])
        (top_p,) = self._to_device([float(r.params.top_p) for r in sampled], dtype=torch.float64)
        return TokenFilters(top_k=top_k, top_p=top_p)

    def _bias(self, rows: Sequence[Request]) -> RowBias | None:
        biased = [index for index, r in enumerate(rows) if r.params.logit_bias]
        if not biased:
            return None
        values = dense_bias([rows[index].params.logit_bias for index in biased], self.vocab_size,
                            torch.float64, self.tokens.device)
        return RowBias(rows=self._to_device(biased)[0], values=values)

    def _to_device(self, *lists: list, dtype: torch.dtype = torch.long) -> list[torch.Tensor]:
        """Host lists to device tensors in ONE copy that does not wait for the device (pinned memory on
        CUDA), so building a step never synchronises with the one still running."""
        sizes = [len(values) for values in lists]
        flat = torch.tensor([value for values in lists for value in values], dtype=dtype,
                            pin_memory=self.tokens.is_cuda)
        return list(flat.to(self.tokens.device, non_blocking=True).split(sizes))

    def _refresh_part(self, rows: Sequence[Request], slots: torch.Tensor,
                      block_starts: torch.Tensor) -> RefreshPart | None:
        """Whole rows, in the bounding box of the widest one."""
        if not rows:
            return None
        first = self.width - max(r.width for r in rows)
        read = block_starts[:, None] - first - self.logit_shift + self._block_offsets
        return RefreshPart(tokens=self.tokens[slots, first:], positions=self.positions[slots, first:],
                           key_mask=self.key_mask[slots, first:self.width], read_columns=read,
                           slots=slots if self.kv is not None else None, first_column=first,
                           row_widths=tuple(r.width for r in rows))

    def _window_part(self, rows: Sequence[Request], slots: torch.Tensor,
                     block_starts: torch.Tensor) -> WindowPart | None:
        """dual: the block; prefix: the block to the row's end. Either starts ``window_lookback`` columns
        before the block (a shifted family then predicts every block position from the window).

        Prefix windows are ragged and left-aligned: a shorter row's missing tail points at the scratch
        column, which is never attended.
        """
        if not rows:
            return None
        lookback = self.window_lookback
        starts = block_starts - lookback
        if self.cache_mode == "dual":
            row_tokens = (self.block_length + lookback,) * len(rows)
        else:
            row_tokens = tuple(self.width - self.block_start(r) + lookback for r in rows)
        length = max(row_tokens)
        columns = starts[:, None] + torch.arange(length, device=starts.device)
        columns = columns.masked_fill(columns >= self.width, self.width)
        safe = columns.masked_fill(columns >= self.width, 0)
        slot_rows = slots[:, None]
        return WindowPart(tokens=self.tokens[slot_rows, safe], positions=self.positions[slot_rows, safe],
                          columns=columns, slots=slots, context_start=self.width - max(r.width for r in rows),
                          num_read=self.block_length, read_shift=self.logit_shift - lookback,
                          slot_range=_slot_range([r.slot for r in rows]), row_widths=tuple(r.width for r in rows),
                          row_slots=tuple(r.slot for r in rows), row_tokens=row_tokens)

    def _record(self, refresh: Sequence[Request], window: Sequence[Request], refresh_part: RefreshPart | None,
                window_part: WindowPart | None) -> ForwardRecord:
        return ForwardRecord(
            refresh_rows=len(refresh),
            refresh_width=refresh_part.tokens.shape[1] if refresh_part is not None else 0,
            window_rows=len(window),
            window_tokens=window_part.tokens.shape[1] if window_part is not None else 0,
            window_context=self.width - window_part.context_start if window_part is not None else 0,
            logit_positions=(len(refresh) + len(window)) * self.block_length,
            real_tokens=sum(r.width for r in (*refresh, *window)))

    # -- reading and writing blocks ----------------------------------------------------------------
    def block_tokens(self, batch: StepBatch) -> torch.Tensor:
        """[rows, block_length] the rows' active blocks as they stand."""
        return self.tokens[batch.slots[:, None], batch.block_columns]

    def write_blocks(self, batch: StepBatch, blocks: torch.Tensor) -> None:
        self.tokens[batch.slots[:, None], batch.block_columns] = blocks


def _slot(request: Request) -> int:
    return request.slot


def _slot_range(slots: list[int]) -> tuple[int, int]:
    """Sorted slots -> the consecutive range that holds them: ``[2, 3, 4, 7] -> (2, 6)``."""
    return slots[0], slots[-1] - slots[0] + 1
