"""The engine's memory model: what it allocates once, and what a step adds per bounding-box token.

Fixed: the weights, and the arena (``engine.batch.RowArena``) allocated at construction for
``max_batch_size`` slots x ``max_model_len`` columns: keys and values of every layer (plus one scratch
column), token ids, positions and key masks. Rows joining or leaving never allocate: they take and
return slots. Transient: a step's activations grow with its bounding box (rows x widest row), and its
logits with rows x block_length x vocab (logits exist only for the active blocks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.models.loader import DiffusionLM
from engine.models.step_inputs import KVArena

INDEX_BYTES = 8  # token ids and positions are int64


@dataclass(frozen=True)
class MemoryModel:
    weight_bytes: int
    arena_bytes: int  # allocated once: KV slots (if cached) + token ids, positions, key masks
    bytes_per_box_token: int  # activations of one bounding-box token in a whole-row forward (estimate)
    logit_bytes_per_row: int  # float32 logits of one row's active block

    @property
    def fixed_bytes(self) -> int:
        return self.weight_bytes + self.arena_bytes

    def peak_bytes(self, box_tokens: int, rows: int) -> int:
        """Estimated peak for a step whose bounding box holds ``box_tokens`` tokens over ``rows`` rows."""
        return self.fixed_bytes + box_tokens * self.bytes_per_box_token + rows * self.logit_bytes_per_row


def memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
    model_config, dtype = lm.model.config, lm.dtype
    slots, width = config.max_batch_size, config.resolved_max_model_len(lm.max_length)
    columns = slots * (width + 1)
    kv_bytes = KVArena.bytes_per_slot_column(model_config, dtype) * columns if config.cache != "none" else columns
    element = torch.empty((), dtype=dtype).element_size()
    arena_bytes = kv_bytes + 2 * INDEX_BYTES * slots * width
    hidden, intermediate = model_config.hidden_size, model_config.intermediate_size
    return MemoryModel(
        weight_bytes=sum(p.numel() * p.element_size() for p in lm.model.parameters()),
        arena_bytes=arena_bytes,
        bytes_per_box_token=element * (6 * hidden + 3 * intermediate + model_config.num_heads * width),
        logit_bytes_per_row=4 * config.block_length * model_config.vocab_size)
