"""What the engine accounts for: its stats add up to the tokens, steps and time of what it served, and
its arena holds exactly the bytes of the memory model, written in place and never reallocated."""
import pytest

from engine import SamplingParams
from tests.engine_helpers import chat, mixed_workload


def test_stats_account_for_tokens_steps_and_time(tiny_engine_factory, heldout_rows):
    engine = tiny_engine_factory(dtype="float32", max_batch_size=4)
    outputs = engine.generate([chat(r["prompt"]) for r in heldout_rows[:8]], SamplingParams(max_new_tokens=64))
    stats = engine.stats()
    assert stats.generated_tokens == sum(len(o.token_ids) for o in outputs)
    assert stats.denoise_steps == len(engine.stats_collector.trace)
    assert stats.refresh_forwards >= 2 and stats.window_forwards >= 1
    assert stats.blocks_decoded >= sum(o.num_blocks for o in outputs)
    assert 0 < stats.rows_per_forward <= 4
    assert 0 < stats.model_time_s <= stats.elapsed_s
    assert 0 < stats.useful_row_fraction <= 1.0
    assert 0 < stats.effective_compute_ratio <= 1.0
    assert set(stats.to_dict()) >= {"tokens_per_s", "padding_fraction", "peak_bounding_box_tokens"}
    assert all(o.first_scheduled_time >= o.arrival_time and o.finish_time >= o.first_scheduled_time
               for o in outputs)


@pytest.mark.parametrize("cache", ["dual", "none"])
def test_the_arena_holds_exactly_the_memory_model_and_rows_leaving_allocate_nothing(
        tiny_engine_factory, heldout_rows, cache):
    from engine.runner.memory import memory_model

    engine = tiny_engine_factory(dtype="float32", max_batch_size=4, cache=cache)
    batch = engine.runner.rows.batch
    kv_cache = batch.kv_cache
    held = [batch.tokens, batch.positions, batch.key_mask] + (kv_cache.keys + kv_cache.values if kv_cache else [])
    pointers = [tensor.data_ptr() for tensor in held]
    model = memory_model(engine.lm, engine.config)
    assert model.arena_bytes == batch.num_bytes == sum(t.numel() * t.element_size() for t in held)
    prompts, caps = mixed_workload(heldout_rows, 10)
    engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert [tensor.data_ptr() for tensor in held] == pointers  # written in place, never reallocated
    assert engine.runner.slots.num_free == 4 and batch.num_bytes == model.arena_bytes
