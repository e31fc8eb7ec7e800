"""One DiffusionGemma forward's inputs and what every layer reads of them, built once per step.

A step has up to two parts, run as one packed forward (their linear layers share one pass over the
weights, attention runs per part):

* **store** (the encoder): rows writing new context, a prompt at admission or the canvas they just
  committed. Causal attention over the row's cached context and its new tokens; sliding layers see the
  last ``sliding_window`` positions. Their keys and values go to the cache; no logits are read.
* **decode** (the decoder): every denoising row's canvas, attending bidirectionally to itself and to the
  row's cached context (sliding layers: the context's last ``sliding_window - 1`` positions).

A row may be in both: its store runs first in every layer, so its canvas reads the context just written.
A store may also fill pages of the prefix cache's pool (``engine.runner.prefix_cache``): every layer
writes the keys and values of a prompt's whole pages there as it computes them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StorePart:
    tokens: torch.Tensor  # [tokens] every row's new context tokens, row after row
    slots: tuple[int, ...]  # host: each row's cache slot
    starts: tuple[int, ...]  # host: context positions each row has cached before this step
    counts: tuple[int, ...]  # host: new tokens of each row
    pages: tuple[tuple[int, ...], ...] = ()  # host: per row, the pool entry each page of its new tokens
    # fills, page after page from its first new token (a page-aligned position), -1: none; (): no row's

    @property
    def num_rows(self) -> int:
        return len(self.slots)

    def row(self, index: int, tokens: torch.Tensor) -> StorePart:
        """Row ``index`` alone, whose new tokens are ``tokens``."""
        pages = (self.pages[index],) if self.pages else ()
        return StorePart(tokens, (self.slots[index],), (self.starts[index],), (self.counts[index],), pages)


@dataclass
class DecodePart:
    tokens: torch.Tensor  # [rows, canvas] each row's current canvas
    slots: tuple[int, ...]  # host: each row's cache slot
    contexts: tuple[int, ...]  # host: context positions cached for each row (after this step's store)
    soft_embeddings: torch.Tensor | None = None  # [rows, canvas, hidden] the previous step's soft
    # predictions (zeros for a canvas's first step); None: every row is at its first step

    @property
    def num_rows(self) -> int:
        return len(self.slots)


@dataclass
class CanvasStep:
    store: StorePart | None
    decode: DecodePart | None


def split_by_row(step: CanvasStep) -> list[CanvasStep]:
    """``step`` as one step per decode row (its store included), in decode order: what batch-invariant
    mode runs, so every kernel sees the shapes of a batch of one."""
    stores = {}
    if step.store is not None:
        offsets = [0]
        for count in step.store.counts:
            offsets.append(offsets[-1] + count)
        for index, slot in enumerate(step.store.slots):
            stores[slot] = step.store.row(index, step.store.tokens[offsets[index]:offsets[index + 1]])
    decode = step.decode
    steps = []
    for index, slot in enumerate(decode.slots if decode is not None else ()):
        soft = decode.soft_embeddings[index:index + 1] if decode.soft_embeddings is not None else None
        steps.append(CanvasStep(stores.pop(slot, None), DecodePart(decode.tokens[index:index + 1], (slot,),
                                                                   (decode.contexts[index],), soft)))
    return [CanvasStep(store, None) for store in stores.values()] + steps


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def ring_positions(contexts: torch.Tensor, ring: int) -> torch.Tensor:
    """``[rows, ring]``: the position each ring column holds for rows with ``contexts`` cached positions
    (column = position mod ring); negative where the column holds nothing yet."""
    columns = torch.arange(ring, device=contexts.device)
    last = contexts[:, None] - 1
    return last - torch.remainder(last - columns, ring)


@dataclass
class StorePlan:
    rows: int
    length: int  # the box: the longest row's new tokens
    packed_index: torch.Tensor  # [tokens] box position of each new token
    slots: torch.Tensor  # [rows]
    token_slots: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    global_keys: int  # cache columns a global layer reads: the longest row's context after the store
    global_mask: torch.Tensor  # [rows, 1, length, global_keys]
    sliding_mask: torch.Tensor  # [rows, 1, length, ring + length]
    ring_tokens: torch.Tensor  # [written] new tokens that enter a sliding layer's ring ...
    ring_columns: torch.Tensor  # ... at these columns
    page_tokens: torch.Tensor | None  # [paged] new tokens whose keys and values fill pool pages ...
    page_entries: torch.Tensor | None  # ... these pages ...
    page_columns: torch.Tensor | None  # ... at these columns (None: the store fills no page)

    def to_box(self, packed: torch.Tensor) -> torch.Tensor:
        box = packed.new_zeros(self.rows * self.length, *packed.shape[1:])
        return box.index_copy_(0, self.packed_index, packed).view(self.rows, self.length, *packed.shape[1:])

    def from_box(self, box: torch.Tensor) -> torch.Tensor:
        return box.reshape(self.rows * self.length, *box.shape[2:]).index_select(0, self.packed_index)


def plan_store(part: StorePart, ring: int, window: int, dtype: torch.dtype, page_length: int = 0,
               global_keys: int | None = None) -> StorePlan:
    """``global_keys``: the cache columns a global layer reads, at least the longest row's context after the
    store (None: that)."""
    device = part.tokens.device
    rows, length = part.num_rows, max(part.counts)
    packed = [(row, i) for row, count in enumerate(part.counts) for i in range(count)]
    packed_index = torch.tensor([row * length + i for row, i in packed], device=device)
    positions = torch.tensor([part.starts[row] + i for row, i in packed], device=device)
    token_slots = torch.tensor([part.slots[row] for row, _ in packed], device=device)
    starts = torch.tensor(part.starts, device=device)
    ends = starts + torch.tensor(part.counts, device=device)
    query_positions = starts[:, None] + torch.arange(length, device=device)  # pad queries run past the end
    real_query = query_positions < ends[:, None]
    global_keys = int(max(s + c for s, c in zip(part.starts, part.counts))) if global_keys is None else global_keys
    key_columns = torch.arange(global_keys, device=device)
    allowed = (key_columns[None, None, :] <= query_positions[:, :, None]) & (key_columns < ends[:, None])[:, None]
    allowed |= ~real_query[:, :, None] & (key_columns == 0)  # a pad query sees one key: its softmax stays finite
    ring_keys = ring_positions(starts, ring)
    new_keys = query_positions
    key_positions = torch.cat([ring_keys, new_keys], dim=1)
    key_valid = torch.cat([ring_keys >= 0, real_query], dim=1)
    difference = query_positions[:, :, None] - key_positions[:, None, :]
    sliding = key_valid[:, None, :] & (difference >= 0) & (difference < window)
    sliding |= ~real_query[:, :, None] & (torch.arange(key_positions.shape[1], device=device) == ring)
    kept = [index for index, (row, i) in enumerate(packed) if i >= part.counts[row] - ring]
    paged = [(index, part.pages[row][i // page_length], i % page_length) for index, (row, i) in enumerate(packed)
             if part.pages and i < len(part.pages[row]) * page_length and part.pages[row][i // page_length] >= 0]
    page_tokens, page_entries, page_columns = (torch.tensor(column, device=device, dtype=torch.long)
                                               for column in zip(*paged)) if paged else (None, None, None)
    return StorePlan(rows, length, packed_index, torch.tensor(part.slots, device=device), token_slots, positions,
                     global_keys, _additive(allowed, dtype)[:, None], _additive(sliding, dtype)[:, None],
                     torch.tensor(kept, device=device, dtype=torch.long),
                     torch.remainder(positions[kept], ring), page_tokens, page_entries, page_columns)


@dataclass
class DecodePlan:
    rows: int
    length: int
    slots: torch.Tensor  # [rows]
    positions: torch.Tensor  # [rows * length]
    global_keys: int  # cache columns a global layer reads before the canvas
    global_mask: torch.Tensor  # [rows, 1, 1, global_keys + length]
    sliding_mask: torch.Tensor  # [rows, 1, 1, ring + length]


def plan_decode(part: DecodePart, ring: int, dtype: torch.dtype, global_keys: int | None = None) -> DecodePlan:
    """``global_keys``: the cache columns a global layer reads, at least the longest context (None: that)."""
    device = part.tokens.device
    rows, length = part.tokens.shape
    contexts = torch.tensor(part.contexts, device=device)
    positions = (contexts[:, None] + torch.arange(length, device=device)).reshape(-1)
    global_keys = max(part.contexts) if global_keys is None else global_keys
    canvas = torch.ones(rows, length, dtype=torch.bool, device=device)
    cached = torch.arange(global_keys, device=device)[None, :] < contexts[:, None]
    global_allowed = torch.cat([cached, canvas], dim=1)
    sliding_allowed = torch.cat([ring_positions(contexts, ring) >= 0, canvas], dim=1)
    return DecodePlan(rows, length, torch.tensor(part.slots, device=device), positions, global_keys,
                      _additive(global_allowed, dtype)[:, None, None], _additive(sliding_allowed, dtype)[:, None, None])
