"""The persistent batch: the slots the runner's rows live in, between steps and across them.

Every running request owns a slot of a preallocated batch. Its row (prompt + canvas) sits right-aligned
in the slot, so rows of any width share one column frame and a bounding box of width ``w`` is the last
``w`` columns of the slots it holds::

    slot 0:  . . . . [ prompt 0         | blk | blk |>blk<| blk ]
    slot 1:  . . [ prompt 1 (longer)          |>blk<| blk | blk ]
    slot 2:  (free)
    slot 3:  . . . . . . . . . [ prompt 3 | blk |>blk<| blk ]        + one scratch column
                                              >blk< = the row's active block

Positions start at 0 on each row's first real token and the columns left of a row are masked as keys,
so a row computes exactly what it would alone. A block-causal family's rows sit left-aligned instead
(column = position): a step reads only the columns up to its rows' active blocks, and those grow from
the left as rows advance. Slots are handed out lowest first. A leaving row only
returns its slot. Before a step, :meth:`PersistentBatch.pack_window_rows` moves the rows that continue
a block into slots ``[0, n)``, copying a moved row's keys and values. ``engine.runner.batch_inputs`` then
builds the step's tensors from this batch without changing it.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.kv_cache import KVCache
from engine.models.loader import DiffusionLM
from engine.runner.logit_processors import LogprobBuffer
from engine.runner.slots import SlotAllocator
from engine.scheduling.request import Request


class PersistentBatch:
    """Token ids, positions, key masks and (with a cache) keys/values for ``slots`` rows of ``width``."""

    def __init__(self, lm: DiffusionLM, slots: SlotAllocator[Request], width: int, block_length: int,
                 cache_mode: str, window_lookback: int = 0):
        device, num_slots = lm.device, slots.num_slots
        self.width, self.block_length, self.cache_mode = width, block_length, cache_mode
        self.layout = lm.layout
        self.mask_id, self.pad_id, self.logit_shift = lm.special_ids.mask_id, lm.special_ids.pad_id, lm.logit_shift
        self.vocab_size = lm.vocab_size
        self.window_lookback = window_lookback  # columns a window starts before the block (<= logit_shift)
        self.kv_cache = (KVCache(lm.model.config.cache_spec(width), num_slots, lm.dtype, device) if cache_mode != "none"
                         else None)
        self.key_mask = (self.kv_cache.key_mask if self.kv_cache is not None
                         else torch.zeros((num_slots, width + 1), dtype=torch.bool, device=device))
        self.tokens = torch.full((num_slots, width), self.pad_id, dtype=torch.long, device=device)
        self.positions = torch.zeros((num_slots, width), dtype=torch.long, device=device)
        self.logprobs: LogprobBuffer | None = None  # allocated when a request first asks for them
        self.columns = torch.arange(width, device=device)
        self.block_offsets = torch.arange(block_length, device=device)
        self.slots = slots  # the runner's: it hands slots out and takes them back; packing moves rows

    @property
    def num_slots(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_bytes(self) -> int:
        """Bytes of every tensor the batch holds (they are allocated once, here)."""
        state = [self.tokens, self.positions] + ([] if self.kv_cache is not None else [self.key_mask])
        kv_bytes = self.kv_cache.num_bytes if self.kv_cache is not None else 0
        return sum(t.numel() * t.element_size() for t in state) + kv_bytes

    def logprob_buffer(self) -> LogprobBuffer:
        """Each slot's log-probabilities of its active block, allocated on first use."""
        if self.logprobs is None:
            self.logprobs = LogprobBuffer(self.num_slots, self.block_length, self.tokens.device)
        return self.logprobs

    # -- rows --------------------------------------------------------------------------------------
    def row_start(self, request: Request) -> int:
        """Batch column of the request's first prompt token."""
        return self.layout.row_start(self.width, request.width)

    def block_start(self, request: Request) -> int:
        """Batch column of the first token of the request's current block."""
        return self.row_start(request) + request.block_start

    def place(self, request: Request) -> None:
        """Write the request's row into the slot it was given: pads, prompt, a canvas of masks."""
        slot = request.slot
        start = self.row_start(request)
        (prompt,) = to_device(self.tokens, request.prompt_token_ids)
        self.tokens[slot, :start] = self.pad_id
        self.tokens[slot, start:start + request.prompt_length] = prompt
        self.tokens[slot, start + request.prompt_length:start + request.width] = self.mask_id
        self.tokens[slot, start + request.width:] = self.pad_id
        self.positions[slot] = (self.columns - start).clamp(min=0)
        self.key_mask[slot] = False
        self.key_mask[slot, start:start + request.width] = True

    def pack_window_rows(self, window: Sequence[Request]) -> None:
        """Move rows so the window rows hold slots ``[0, len(window))``.

        A window row above that range moves into a hole below it with its cache (one copy of its
        keys/values, all layers at once) and its log-probabilities. A row in the way is not in its
        block's middle: it starts a block now, or waits to at a block boundary. A full-attention row's
        next forward rewrites every column of its cache, so it takes the vacated slot with its tokens
        only; a block-causal row keeps its finished blocks' keys/values, so they move with it. A window
        step then reads its cache as one view of consecutive slots.
        """
        count = len(window)
        in_place = {r.slot for r in window if r.slot < count}
        holes = [slot for slot in range(count) if slot not in in_place]
        movers = sorted((r for r in window if r.slot >= count), key=lambda request: request.slot)
        for hole, mover in zip(holes, movers):
            vacated = mover.slot
            holder = self.slots.holder(hole)
            if holder is not None:
                holder_row = self._row(hole)
                holder_cache = self.kv_cache.data[:, hole].clone() if self.layout.carries_cache_when_moved else None
                self._write_row(hole, self._row(vacated), cache_from=vacated)
                self._write_row(vacated, holder_row)
                if holder_cache is not None:
                    self.kv_cache.data[:, vacated] = holder_cache
                holder.slot = vacated
                self.slots.swap(hole, vacated)
            else:
                self._write_row(hole, self._row(vacated), cache_from=vacated)
                self.slots.move(vacated, hole)
            mover.slot = hole
            if self.logprobs is not None:
                self.logprobs.move([(vacated, hole)])

    def _row(self, slot: int) -> tuple[torch.Tensor, ...]:
        """A copy of a slot's tokens, positions and key mask."""
        return self.tokens[slot].clone(), self.positions[slot].clone(), self.key_mask[slot].clone()

    def _write_row(self, slot: int, row: tuple[torch.Tensor, ...], cache_from: int | None = None) -> None:
        self.tokens[slot], self.positions[slot], self.key_mask[slot] = row
        if cache_from is not None:
            self.kv_cache.data[:, slot] = self.kv_cache.data[:, cache_from]

    # -- reading and writing blocks ----------------------------------------------------------------
    def block_tokens(self, slots: torch.Tensor, block_columns: torch.Tensor) -> torch.Tensor:
        """[rows, block_length] the rows' active blocks as they stand."""
        return self.tokens[slots[:, None], block_columns]

    def write_blocks(self, slots: torch.Tensor, block_columns: torch.Tensor, blocks: torch.Tensor) -> None:
        self.tokens[slots[:, None], block_columns] = blocks

    def untouched_block(self, request: Request) -> list[int]:
        """Host tokens of the request's active block before any step touched it: its lead of prompt
        tokens, then MASK."""
        start, prompt = request.block_start, request.prompt_token_ids
        return [prompt[start + offset] if start + offset < len(prompt) else self.mask_id
                for offset in range(self.block_length)]


def to_device(like: torch.Tensor, *lists: list, dtype: torch.dtype = torch.long) -> list[torch.Tensor]:
    """Host lists to tensors on ``like``'s device in ONE copy that does not wait for the device (pinned
    memory on CUDA), so building a step never synchronises with the one still running."""
    sizes = [len(values) for values in lists]
    flat = torch.tensor([value for values in lists for value in values], dtype=dtype, pin_memory=like.is_cuda)
    return list(flat.to(like.device, non_blocking=True).split(sizes))
