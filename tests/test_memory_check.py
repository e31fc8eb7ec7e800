"""The arena against available memory, specified on the CPU: an engine whose preallocated arena cannot
fit fails at construction with a message naming the arena and the settings that size it."""
from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.config import DEFAULT_MAX_MODEL_LEN
from engine.models import load_model
from engine.runner.memory import available_bytes, check_arena_fits, memory_model

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo")
def test_on_the_cpu_available_memory_is_the_hosts():
    total_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal:"))
    import torch

    assert 0 < available_bytes(torch.device("cpu")) <= total_kib * 1024


def test_an_arena_larger_than_available_memory_fails_at_construction_naming_it(tiny):
    import torch

    per_slot = memory_model(tiny, EngineConfig(max_batch_size=1)).arena_bytes
    slots = 1000 * available_bytes(torch.device("cpu")) // per_slot  # ~1000x what the host has: an
    # attempt to allocate it would fail in the allocator, so the message below proves nothing was tried
    with pytest.raises(ValueError) as error:
        BlockServeEngine(tiny, EngineConfig(max_batch_size=slots))
    message = str(error.value)
    assert re.search(rf"KV arena needs [\d.]+ GiB for max_batch_size={slots} slots x max_model_len="
                     rf"{tiny.max_length} columns", message), message
    assert "available: lower max_model_len or max_batch_size" in message


def test_without_a_cache_the_row_arena_is_checked_too(tiny):
    import torch

    per_slot = memory_model(tiny, EngineConfig(max_batch_size=1, cache="none")).arena_bytes
    slots = 1000 * available_bytes(torch.device("cpu")) // per_slot
    with pytest.raises(ValueError, match=r"row arena \(cache='none'"):
        BlockServeEngine(tiny, EngineConfig(max_batch_size=slots, cache="none"))


def test_an_arena_that_fits_but_a_full_budget_step_may_not_is_a_warning(tiny, caplog):
    config = EngineConfig(max_batch_size=4, token_budget=10**12)  # activations of 10^12 box tokens
    with caplog.at_level(logging.WARNING, logger="engine.runner.memory"):
        model = check_arena_fits(tiny, config)
    assert model.arena_bytes == BlockServeEngine(tiny, config).runner.rows.batch.num_bytes
    assert any("token_budget=1000000000000" in record.getMessage() for record in caplog.records)


def test_a_model_advertising_a_long_context_gets_a_capped_default_row_width():
    dream = load_model(FIXTURES / "tiny-dream", dtype="float32")
    assert dream.max_length == 32768 > DEFAULT_MAX_MODEL_LEN
    engine = BlockServeEngine(dream, EngineConfig(max_batch_size=2))
    assert engine.max_row_width == engine.runner.rows.batch.width == DEFAULT_MAX_MODEL_LEN
    output = engine.generate([[5] * DEFAULT_MAX_MODEL_LEN], SamplingParams(max_new_tokens=32))[0]
    assert output.finish_reason == "error" and str(DEFAULT_MAX_MODEL_LEN) in output.error
    wider = BlockServeEngine(dream, EngineConfig(max_batch_size=2, max_model_len=8192))
    assert wider.max_row_width == 8192  # set explicitly, up to the model's own maximum
