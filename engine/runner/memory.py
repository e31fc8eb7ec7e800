"""The engine's memory model: what it allocates once, and what a step adds per bounding-box token.

Fixed: the weights, and the arena allocated at construction: the persistent batch
(``engine.runner.batch.PersistentBatch``) of ``max_batch_size`` slots x ``max_model_len`` columns. It holds keys
and values of every layer (plus one scratch column), token ids, positions and key masks. Rows joining
or leaving never allocate: they take and return slots. Transient: a step's activations grow with its
bounding box (rows x widest row), and its logits with at most rows x block_length x vocab (logits exist
only for the active blocks' masked positions).

The arena is checked against the memory the device has available before it is allocated
(:func:`check_arena_fits`), so a setting that cannot fit fails with its name, not an allocator error.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.models.kv_cache import CacheSpec, PagePool
from engine.models.loader import DiffusionLM
from engine.models.part_attention import part_attention
from engine.rules import rule_class
from engine.rules.proposals import NOISE_CHUNK_ELEMENTS
from engine.runner.canvas_rows import rows_per_chunk
from engine.runner.prefix_cache import PAGE_LENGTH, pool_pages
from engine.scheduling.model_fit import block_length_for, prefix_caching

INDEX_BYTES = 8  # token ids and positions are int64
logger = logging.getLogger(__name__)


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


def canvas_memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
    """DiffusionGemma: sliding layers keep a ring of ``sliding_window - 1`` columns, global layers every
    column; a step holds one chunk of rows' canvas logits at a time (``canvas_rows.rows_per_chunk``), and
    its self-conditioning state persists per slot. The prefix cache's pages keep every layer's columns."""
    model_config, dtype = lm.model.config, lm.dtype
    slots, width = config.max_batch_size, config.resolved_max_model_len(lm.max_length)
    element = torch.empty((), dtype=dtype).element_size()
    canvas = block_length_for(config, lm)
    state = slots * canvas * (model_config.hidden_size * element + 2 * INDEX_BYTES)
    widest_head = max(shape.num_kv_heads * shape.head_dim for shape in model_config.layers)
    hidden, heads = model_config.hidden_size, model_config.num_heads
    per_token = 8 * hidden + 3 * model_config.intermediate_size + heads * width + 4 * widest_head
    per_token += model_config.experts_per_token * (3 * model_config.moe_intermediate_size + 2 * hidden)
    return MemoryModel(
        weight_bytes=sum(p.numel() * p.element_size() for p in lm.model.parameters()),
        arena_bytes=cache_bytes(lm, config, model_config.cache_spec(width), PAGE_LENGTH) + state,
        bytes_per_box_token=element * per_token,
        # the family's sampler's float32 copies of the vocabulary per canvas position, for one chunk of rows
        logit_bytes_per_row=rule_class(lm.layout.own_rule).vocab_copies * 4 * canvas * model_config.vocab_size,
        logit_rows=rows_per_chunk(canvas, model_config.vocab_size))


def memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
    """The memory model of ``lm``'s rows (``RowLayout.step_kind``: what the runner keeps of them)."""
    return MEMORY_MODELS[lm.layout.step_kind](lm, config)


def block_memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
    """Block rows: the KV cache and the prefix cache's pool of blocks; a step holds its rows'
    activations, masks and the active blocks' logits."""
    model_config, dtype = lm.model.config, lm.dtype
    slots, width = config.max_batch_size, config.resolved_max_model_len(lm.max_length)
    element = torch.empty((), dtype=dtype).element_size()
    block_length = block_length_for(config, lm)
    kv_bytes = (cache_bytes(lm, config, model_config.cache_spec(width), block_length) if config.cache != "none"
                else slots * (width + 1))  # no cache: the key mask alone
    arena_bytes = kv_bytes + 2 * INDEX_BYTES * slots * width
    hidden, intermediate = model_config.hidden_size, model_config.intermediate_size
    per_token = 6 * hidden + 3 * intermediate + model_config.num_heads * width
    per_token += part_attention(lm.layout.part_block_size(block_length)).mask_entries_per_query(width)
    if model_config.moe is not None:  # each routed copy of a token: gate/up, its product, its output
        moe = model_config.moe
        per_token += moe.experts_per_token * (3 * moe.moe_intermediate_size + 2 * hidden)
    return MemoryModel(
        weight_bytes=sum(p.numel() * p.element_size() for p in lm.model.parameters()),
        arena_bytes=arena_bytes,
        bytes_per_box_token=element * per_token,
        # the active blocks' logits in the model's dtype, their float32 softmax and one float32 temporary
        logit_bytes_per_row=(element + 8) * block_length * model_config.vocab_size,
        sampling_bytes_per_row=2 * 4 * block_length * model_config.vocab_size,
        sampling_scratch_bytes=3 * INDEX_BYTES * NOISE_CHUNK_ELEMENTS)


def anchored_memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
    """Anchored rows: every layer's keys and values for each slot's columns; a step holds its spans'
    activations, their attention box and the float32 logits of the positions its rows read (a block each)."""
    model_config, dtype = lm.model.config, lm.dtype
    width = config.resolved_max_model_len(lm.max_length)
    element = torch.empty((), dtype=dtype).element_size()
    hidden, heads = model_config.hidden_size, model_config.num_heads
    per_token = 6 * hidden + 3 * model_config.intermediate_size + heads * width
    return MemoryModel(
        weight_bytes=sum(p.numel() * p.element_size() for p in lm.model.parameters()),
        arena_bytes=cache_bytes(lm, config, model_config.cache_spec(width + 1), PAGE_LENGTH),
        bytes_per_box_token=element * per_token,
        logit_bytes_per_row=(element + 8) * block_length_for(config, lm) * model_config.vocab_size)


MEMORY_MODELS = {"blocks": block_memory_model, "canvas": canvas_memory_model,
                 "anchored": anchored_memory_model}  # by RowLayout.step_kind


def gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def host_available_bytes() -> int | None:
    """The host's available memory (Linux: MemAvailable, lowered to what a cgroup limit leaves, as in
    a container); None where it cannot be read."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024  # kB
    except OSError:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    for limit_file, usage_file in (("memory.max", "memory.current"),  # cgroup v2, then v1
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit = _read_int(Path("/sys/fs/cgroup") / limit_file)
        usage = _read_int(Path("/sys/fs/cgroup") / usage_file)
        if limit is not None and usage is not None and limit < 2**60:  # v1 writes ~2**63 for no limit
            available = limit - usage if available is None else min(available, limit - usage)
            break
    return available


def available_bytes(device: torch.device) -> int | None:
    """What a new allocation on ``device`` can take now: on CUDA the driver's free memory plus what
    torch's caching allocator holds unused; on the CPU the host's available memory; None if unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        return host_available_bytes()
    return None


def check_arena_fits(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
    """Raise ``ValueError`` naming the arena and the settings that size it when it cannot fit in the
    memory available on ``lm``'s device (the weights are already there); call before allocating it.
    Warns when it fits but a step at the full token budget probably would not."""
    model = memory_model(lm, config)
    available = available_bytes(lm.device)
    if available is None:
        return model
    slots, width = config.max_batch_size, config.resolved_max_model_len(lm.max_length)
    if model.arena_bytes > available:
        what = "KV arena" if config.cache != "none" else "row arena (cache='none': no keys/values)"
        raise ValueError(
            f"the engine's {what} needs {gib(model.arena_bytes)} for max_batch_size={slots} slots x "
            f"max_model_len={width} columns (model maximum {lm.max_length}), but {lm.device} has "
            f"{gib(available)} available: lower max_model_len or max_batch_size")
    budget = config.resolved_token_budget(lm.max_length)
    step_bytes = model.step_bytes(budget, slots)
    if model.arena_bytes + step_bytes > available:
        logger.warning("the KV arena (%s) fits in the %s available on %s, but a step at the full "
                       "token_budget=%d may need ~%s more: lower token_budget if steps run out of memory",
                       gib(model.arena_bytes), gib(available), lm.device, budget, gib(step_bytes))
    return model
