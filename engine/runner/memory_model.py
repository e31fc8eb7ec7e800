"""What a step kind's rows cost in memory: the arena allocated once and what a step adds per bounding-box token.

Each step kind's module prices its own rows (``memory_model(lm, config)``, next to what it allocates), from
the same ``CacheSpec`` its ``KVCache`` is built from; ``engine.runner.memory`` checks the result against the
device before anything is allocated.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.models.kv_cache import CacheSpec, PagePool
from engine.models.loader import DiffusionLM
from engine.runner.prefix_cache import pool_pages
from engine.scheduling.model_fit import prefix_caching

INDEX_BYTES = 8  # token ids and positions are int64


@dataclass(frozen=True)
class MemoryModel:
    weight_bytes: int
    arena_bytes: int  # allocated once: KV slots (if cached) + token ids, positions, key masks
    bytes_per_box_token: int  # activations of one bounding-box token in a whole-row forward (estimate)
    logit_bytes_per_row: int  # vocabulary-sized temporaries of one row's active block (logits, softmax)
    sampling_bytes_per_row: int = 0  # a sampled row's float32 noise and scaled logits (its block)
    sampling_scratch_bytes: int = 0  # the noise's int64 hash temporaries, bounded by chunking
    logit_rows: int | None = None  # rows whose logit temporaries a step holds at once (a chunk's); None: all

    def step_bytes(self, box_tokens: int, rows: int, sampled_rows: int = 0) -> int:
        """Estimated memory a step needs beyond the weights and the arena, for a bounding box of
        ``box_tokens`` tokens over ``rows`` rows, ``sampled_rows`` of them with temperature > 0."""
        sampling = sampled_rows * self.sampling_bytes_per_row + (self.sampling_scratch_bytes if sampled_rows else 0)
        logit_rows = rows if self.logit_rows is None else min(rows, self.logit_rows)
        return box_tokens * self.bytes_per_box_token + logit_rows * self.logit_bytes_per_row + sampling


def cache_bytes(lm: DiffusionLM, config: EngineConfig, spec: CacheSpec, page_length: int) -> int:
    """What the runner's ``KVCache`` of ``spec`` allocates for ``max_batch_size`` slots, and with prefix caching
    its ``PagePool`` of pages of ``page_length`` positions (``engine.runner.prefix_cache``)."""
    slots, width = config.max_batch_size, config.resolved_max_model_len(lm.max_length)
    pool = 0
    if prefix_caching(config, lm):
        pool = PagePool.num_bytes_for(spec, pool_pages(config, width, page_length), page_length, lm.dtype)
    return spec.num_bytes(slots, lm.dtype) + pool


def weight_bytes(lm: DiffusionLM) -> int:
    return sum(p.numel() * p.element_size() for p in lm.model.parameters())


def element_bytes(lm: DiffusionLM) -> int:
    """Bytes of one element in the model's dtype."""
    return torch.empty((), dtype=lm.dtype).element_size()
