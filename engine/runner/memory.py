"""The memory check: the arena a runner allocates, against what the device has, before allocating it.

Fixed: the weights, and the arena allocated at construction: ``max_batch_size`` slots x ``max_model_len``
columns of keys and values of every layer, with each step kind's own state (a block row's token ids,
positions and key masks; a canvas row's canvas and self-conditioning). Rows joining or leaving never allocate:
they take and return slots. Transient: a step's activations grow with its bounding box (rows x widest row),
and its logits with the positions its rules read. Each step kind prices its rows (``memory_model`` in its
module, ``engine.runner.memory_model``).

The arena is checked against the memory the device has available before it is allocated
(:func:`check_arena_fits`), so a setting that cannot fit fails with its name, not an allocator error.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.models.loader import DiffusionLM
from engine.runner.interface import step_rows_class
from engine.runner.memory_model import MemoryModel

logger = logging.getLogger(__name__)


def memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
    """The memory model of ``lm``'s rows, as their step kind prices them (``RowLayout.step_kind``)."""
    return step_rows_class(lm.layout.step_kind).memory_model(lm, config)


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
