"""The BlockServe engine, specified against the single-request reference decoder."""
import itertools

import pytest
import torch

from engine import EngineConfig, SamplingParams
from engine.decoding import DecodeRule
from engine.reference import reference_generate

BLOCK = 32


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class CycleRecorder:
    """Wraps the runner to see every block cycle's batch (block indices, bounding box)."""

    def __init__(self, engine):
        self.cycles: list[dict] = []
        run = engine.runner.run_block_cycle

        def recording_run(batch):
            self.cycles.append({"block_indices": batch.block_indices.tolist(),
                                "box": batch.bounding_box_tokens, "rows": batch.num_rows})
            return run(batch)

        engine.runner.run_block_cycle = recording_run

    @property
    def saw_mixed_batch(self) -> bool:
        return any(len(set(cycle["block_indices"])) > 1 for cycle in self.cycles)


def mixed_workload(rows, count=40):
    prompts = [chat(row["prompt"]) for row in rows[:count]]
    caps = [BLOCK * (1 + index % 4) for index in range(count)]
    return prompts, caps


def reference_for(engine, output, max_new_tokens, **kwargs):
    config = engine.config
    rule = DecodeRule(config.decoding, config.threshold, config.factor, config.steps_per_block)
    return reference_generate(engine.lm, output.prompt_token_ids, max_new_tokens=max_new_tokens,
                              block_length=config.block_length, rule=rule, cache=config.cache, **kwargs)


def assert_matches_reference(engine, outputs, caps):
    for output, cap in zip(outputs, caps):
        expected = reference_for(engine, output, cap)
        assert output.token_ids == expected.token_ids, output.request_id
        assert output.finish_reason == expected.finish_reason, output.request_id
        assert output.num_blocks == expected.num_blocks, output.request_id


# Float64: batched and solo runs sum attention over differently padded rows, which can flip a
# float32 confidence sitting exactly at the threshold; in float64 that never happens in practice.
@pytest.mark.parametrize("decoding,cache", list(itertools.product(
    ["threshold", "quota", "factor"], ["dual", "prefix", "none"])))
def test_batched_requests_equal_the_reference_decoder_alone(tiny_engine_factory, heldout_rows,
                                                            decoding, cache):
    engine = tiny_engine_factory(decoding=decoding, cache=cache, max_batch_size=8,
                                 steps_per_block=8 if decoding == "quota" else None,
                                 token_budget=5 * 200)
    recorder = CycleRecorder(engine)
    prompts, caps = mixed_workload(heldout_rows)
    outputs = engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert recorder.saw_mixed_batch, "rows never sat at different block indices in one cycle"
    assert_matches_reference(engine, outputs, caps)


@pytest.mark.parametrize("schedule", ["static", "shrink"])
def test_baseline_schedules_equal_the_reference_when_requests_share_a_canvas(
        tiny_engine_factory, heldout_rows, schedule):
    engine = tiny_engine_factory(schedule=schedule, max_batch_size=8)
    prompts = [chat(row["prompt"]) for row in heldout_rows[:24]]
    caps = [96] * len(prompts)
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=96))
    assert_matches_reference(engine, outputs, caps)


def test_finished_request_is_evicted_at_the_end_of_the_block_that_committed_eos(
        tiny_engine_factory, heldout_rows):
    engine = tiny_engine_factory(max_batch_size=4)
    for row in heldout_rows[:12]:
        engine.add_request(chat(row["prompt"]), SamplingParams(max_new_tokens=256))
    admitted_cycle, finished_cycle, outputs = {}, {}, []
    for cycle in itertools.count():
        if not engine.has_unfinished_requests():
            break
        running_before = {request.request_id for request in engine.scheduler.running}
        finished = engine.step()
        running_after = {request.request_id for request in engine.scheduler.running}
        for request_id in (running_after | {o.request_id for o in finished}) - running_before:
            admitted_cycle.setdefault(request_id, cycle)
        for output in finished:
            finished_cycle[output.request_id] = cycle
        outputs += finished
    eos_outputs = [o for o in outputs if o.finish_reason == "eos"]
    assert eos_outputs, "the tiny model should end some answers"
    for output in eos_outputs:
        eos_block = len(output.token_ids) // BLOCK
        assert output.num_blocks == eos_block + 1
        assert finished_cycle[output.request_id] - admitted_cycle[output.request_id] == eos_block


def test_bounding_box_never_exceeds_the_token_budget(tiny_engine_factory, heldout_rows):
    budget = 900
    engine = tiny_engine_factory(dtype="float32", max_batch_size=16, token_budget=budget)
    recorder = CycleRecorder(engine)
    prompts, caps = mixed_workload(heldout_rows, 32)
    engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert max(cycle["box"] for cycle in recorder.cycles) <= budget
    assert engine.stats().peak_bounding_box_tokens <= budget


def test_sorted_admission_pads_less_than_arrival_order_on_a_skewed_workload(tiny_engine_factory):
    short = [chat(f"count from {n} to {n + 3}") for n in range(10)]
    long = [chat("for a test of the server, please count down from 90 to 80, one number after "
                 f"another, and remember to use spaces between the numbers {n}") for n in range(10)]
    prompts = [p for pair in zip(short, long) for p in pair]
    padding = {}
    for sort_pending in (True, False):
        engine = tiny_engine_factory(dtype="float32", max_batch_size=4, sort_pending=sort_pending)
        engine.generate(prompts, SamplingParams(max_new_tokens=32))
        padding[sort_pending] = engine.stats().padding_fraction
    assert padding[True] < padding[False]


def test_bad_requests_fail_alone_with_a_message(tiny_engine_factory, heldout_rows):
    engine = tiny_engine_factory(dtype="float32", max_batch_size=4, token_budget=300)
    good = chat(heldout_rows[0]["prompt"])
    cases = {
        "empty": ("", SamplingParams(max_new_tokens=32)),
        "too_long": ([5] * (engine.lm.max_length + 1), SamplingParams(max_new_tokens=32)),
        "no_tokens": (good, SamplingParams(max_new_tokens=0)),
        "bad_ids": ([5, engine.lm.vocab_size + 7], SamplingParams(max_new_tokens=32)),
        "never_fits": ([5] * 100, SamplingParams(max_new_tokens=256)),  # 356 > 300 tokens
        "not_a_prompt": (3.5, SamplingParams(max_new_tokens=32)),
    }
    prompts = [good] + [case[0] for case in cases.values()] + [good]
    params = [SamplingParams(max_new_tokens=64)] + [case[1] for case in cases.values()] + [
        SamplingParams(max_new_tokens=64)]
    outputs = engine.generate(prompts, params)
    for output in outputs[1:-1]:
        assert output.finish_reason == "error"
        assert output.error
    messages = [o.error for o in outputs[1:-1]]
    assert "empty" in messages[0]
    assert "maximum length" in messages[1]
    assert "max_new_tokens" in messages[2]
    assert "vocabulary" in messages[3]
    assert "budget" in messages[4]
    assert outputs[0].finish_reason in ("eos", "length") and outputs[-1].token_ids == outputs[0].token_ids


def test_sampling_with_a_seed_is_reproducible_and_independent_of_the_batch(tiny_engine_factory,
                                                                           heldout_rows):
    target = chat(heldout_rows[3]["prompt"])
    params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=1234)
    alone = tiny_engine_factory().generate([target], params)[0]
    others = [chat(row["prompt"]) for row in heldout_rows[10:16]]
    crowd = tiny_engine_factory(max_batch_size=4).generate(
        others[:3] + [target] + others[3:],
        [SamplingParams(max_new_tokens=96, temperature=0.7, seed=n) for n in range(3)] + [params]
        + [SamplingParams(max_new_tokens=32) for _ in range(3)])
    assert crowd[3].token_ids == alone.token_ids
    engine = tiny_engine_factory()
    expected = reference_for(engine, alone, 64, temperature=1.0, seed=1234)
    assert alone.token_ids == expected.token_ids
    other_seed = tiny_engine_factory().generate([target], SamplingParams(
        max_new_tokens=64, temperature=1.0, seed=99))[0]
    assert other_seed.token_ids != alone.token_ids


def test_abort_evicts_running_and_pending_requests(tiny_engine_factory, heldout_rows):
    engine = tiny_engine_factory(dtype="float32", max_batch_size=1)
    running = engine.add_request(chat(heldout_rows[0]["prompt"]), SamplingParams(max_new_tokens=256,
                                                                                 stop_at_eos=False))
    pending = engine.add_request(chat(heldout_rows[1]["prompt"]), SamplingParams(max_new_tokens=64))
    engine.step()
    engine.abort_request(running)
    engine.abort_request(pending)
    finished = {o.request_id: o for o in engine.step()}
    assert finished[running].finish_reason == "abort" and finished[running].num_blocks == 2
    assert finished[pending].finish_reason == "abort" and finished[pending].num_blocks == 0
    assert not engine.has_unfinished_requests()


def test_engine_config_rejects_unknown_or_inconsistent_fields():
    with pytest.raises(ValueError, match="unknown field.*block_size"):
        EngineConfig.from_dict({"block_size": 32})
    with pytest.raises(ValueError, match="steps_per_block"):
        EngineConfig(decoding="quota")
    with pytest.raises(ValueError, match="schedule"):
        EngineConfig(schedule="fifo")
    with pytest.raises(ValueError, match="steps_per_block"):
        EngineConfig(block_length=16, steps_per_block=32)


def test_stats_account_for_tokens_steps_and_time(tiny_engine_factory, heldout_rows):
    engine = tiny_engine_factory(dtype="float32", max_batch_size=4)
    outputs = engine.generate([chat(r["prompt"]) for r in heldout_rows[:8]], SamplingParams(max_new_tokens=64))
    stats = engine.stats()
    assert stats.generated_tokens == sum(len(o.token_ids) for o in outputs)
    assert stats.denoise_steps >= stats.block_cycles >= 4
    assert 0 < stats.model_time_s <= stats.elapsed_s
    assert 0 < stats.useful_row_fraction <= 1.0
    assert 0 < stats.effective_compute_ratio <= 1.0
    assert set(stats.to_dict()) >= {"tokens_per_s", "padding_fraction", "peak_bounding_box_tokens"}
    assert all(o.first_scheduled_time >= o.arrival_time and o.finish_time >= o.first_scheduled_time
               for o in outputs)
