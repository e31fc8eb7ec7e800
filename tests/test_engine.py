"""The BlockServe engine, specified against the single-request reference decoder."""
import itertools

import pytest

from engine import EngineConfig, SamplingParams
from engine.decoding import DecodeRule
from engine.reference import reference_generate

BLOCK = 32


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class StepRecorder:
    """Wraps the arena's step builder to see every step: block indices, refresh/window rows, box."""

    def __init__(self, engine):
        self.steps: list[dict] = []
        build = engine.arena.build_step

        def recording_build(refresh, window):
            batch = build(refresh, window)
            self.steps.append({"block_indices": [r.block_index for r in (*refresh, *window)],
                               "refresh": {r.request_id for r in refresh},
                               "window": {r.request_id for r in window},
                               "box": batch.record.bounding_box_tokens, "rows": batch.num_rows})
            return batch

        engine.arena.build_step = recording_build

    @property
    def saw_mixed_batch(self) -> bool:
        return any(len(set(step["block_indices"])) > 1 for step in self.steps)

    @property
    def saw_block_starts_beside_window_steps(self) -> bool:
        """Some row started a block (refresh) while others continued theirs, in the same step."""
        return any(step["refresh"] and step["window"] for step in self.steps)


def mixed_workload(rows, count=16):
    prompts = [chat(row["prompt"]) for row in rows[:count]]
    caps = [BLOCK * (1 + index % 3) for index in range(count)]
    return prompts, caps


_REFERENCE_RESULTS: dict = {}  # the oracle's answers, shared by the tests of every schedule


def reference_for(engine, output, max_new_tokens, **kwargs):
    config = engine.config
    rule = DecodeRule(config.decoding, config.threshold, config.factor, config.steps_per_block)
    key = (engine.lm.dtype, tuple(output.prompt_token_ids), max_new_tokens, config.block_length, rule,
           config.cache, tuple(sorted(kwargs.items())))
    if key not in _REFERENCE_RESULTS:
        _REFERENCE_RESULTS[key] = reference_generate(
            engine.lm, output.prompt_token_ids, max_new_tokens=max_new_tokens,
            block_length=config.block_length, rule=rule, cache=config.cache, **kwargs)
    return _REFERENCE_RESULTS[key]


def assert_matches_reference(engine, outputs, caps):
    for output, cap in zip(outputs, caps):
        expected = reference_for(engine, output, cap)
        assert output.token_ids == expected.token_ids, output.request_id
        assert output.finish_reason == expected.finish_reason, output.request_id
        assert output.num_blocks == expected.num_blocks, output.request_id


# Float64: batched and solo runs sum attention over differently padded rows, which can flip a
# float32 confidence sitting exactly at the threshold; in float64 that never happens in practice.
@pytest.mark.parametrize("schedule,decoding,cache", [
    *itertools.product(["step"], ["threshold", "quota", "factor"], ["dual", "prefix", "none"]),
    *itertools.product(["block"], ["threshold"], ["dual", "prefix", "none"])])
def test_batched_requests_equal_the_reference_decoder_alone(tiny_engine_factory, heldout_rows,
                                                            schedule, decoding, cache):
    engine = tiny_engine_factory(schedule=schedule, decoding=decoding, cache=cache, max_batch_size=6,
                                 steps_per_block=8 if decoding == "quota" else None)
    recorder = StepRecorder(engine)
    prompts, caps = mixed_workload(heldout_rows)
    outputs = engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert recorder.saw_mixed_batch, "rows never sat at different block indices in one step"
    if schedule == "step" and cache != "none" and decoding != "quota":
        assert recorder.saw_block_starts_beside_window_steps
    assert_matches_reference(engine, outputs, caps)


def test_requests_arriving_mid_flight_join_at_the_next_step_and_equal_the_reference(
        tiny_engine_factory, heldout_rows):
    engine = tiny_engine_factory(max_batch_size=6)
    prompts, caps = mixed_workload(heldout_rows, 18)
    ids, outputs, joined_at, step = [], {}, {}, 0
    while len(outputs) < len(prompts):
        if step % 3 == 0 and len(ids) < len(prompts):  # two arrivals every third step
            for prompt, cap in list(zip(prompts, caps))[len(ids):len(ids) + 2]:
                ids.append(engine.add_request(prompt, SamplingParams(max_new_tokens=cap)))
        running_before = {r.request_id for r in engine.scheduler.running}
        outputs.update((o.request_id, o) for o in engine.step().finished)
        for request in engine.scheduler.running:
            if request.request_id not in running_before:
                joined_at.setdefault(request.request_id, step)
        step += 1
    assert any(when % 3 == 0 and when > 0 for when in joined_at.values())
    assert_matches_reference(engine, [outputs[i] for i in ids], caps)


def test_a_complete_row_never_waits_for_another_under_the_step_schedule(tiny_engine_factory, heldout_rows):
    """Every running row denoises at every step: no row sits out a step waiting for a boundary."""
    engine = tiny_engine_factory(dtype="float32", max_batch_size=4)
    recorder = StepRecorder(engine)
    prompts, caps = mixed_workload(heldout_rows, 12)
    for prompt, cap in zip(prompts, caps):
        engine.add_request(prompt, SamplingParams(max_new_tokens=cap))
    while engine.has_unfinished_requests():
        running_before = len(engine.scheduler.running)
        engine.step()
        assert recorder.steps[-1]["rows"] >= running_before
    assert recorder.saw_block_starts_beside_window_steps


@pytest.mark.parametrize("schedule", ["static", "shrink"])
def test_baseline_schedules_equal_the_reference_when_requests_share_a_canvas(
        tiny_engine_factory, heldout_rows, schedule):
    engine = tiny_engine_factory(schedule=schedule, max_batch_size=8)
    prompts = [chat(row["prompt"]) for row in heldout_rows[:24]]
    caps = [96] * len(prompts)
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=96))
    assert_matches_reference(engine, outputs, caps)


@pytest.mark.parametrize("schedule", ["step", "block"])
def test_finished_request_is_evicted_at_the_end_of_the_block_that_committed_eos(
        tiny_engine_factory, heldout_rows, schedule):
    engine = tiny_engine_factory(max_batch_size=4, schedule=schedule)
    for row in heldout_rows[:12]:
        engine.add_request(chat(row["prompt"]), SamplingParams(max_new_tokens=256))
    blocks_completed, finished_with, outputs = {}, {}, []
    while engine.has_unfinished_requests():
        report = engine.step()
        finished = report.finished
        for request_id in report.new_token_ids:
            blocks_completed[request_id] = blocks_completed.get(request_id, 0) + 1
        for output in finished:  # it leaves in the very step that completed its EOS block
            finished_with[output.request_id] = blocks_completed.get(output.request_id, 0)
        outputs += finished
    eos_outputs = [o for o in outputs if o.finish_reason == "eos"]
    assert eos_outputs, "the tiny model should end some answers"
    for output in eos_outputs:
        eos_block = len(output.token_ids) // BLOCK
        assert output.num_blocks == eos_block + 1 == finished_with[output.request_id]


def test_bounding_box_never_exceeds_the_token_budget(tiny_engine_factory, heldout_rows):
    budget = 900
    engine = tiny_engine_factory(dtype="float32", max_batch_size=16, token_budget=budget)
    recorder = StepRecorder(engine)
    prompts, caps = mixed_workload(heldout_rows, 32)
    engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert max(step["box"] for step in recorder.steps) <= budget
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
    finished = {}
    while engine.has_unfinished_requests():  # the running one leaves when its block is complete
        finished.update((o.request_id, o) for o in engine.step().finished)
    assert finished[running].finish_reason == "abort" and finished[running].num_blocks == 1
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
    from engine.memory import memory_model

    engine = tiny_engine_factory(dtype="float32", max_batch_size=4, cache=cache)
    arena = engine.arena
    held = [arena.tokens, arena.positions, arena.key_mask] + (arena.kv.keys + arena.kv.values if arena.kv else [])
    pointers = [tensor.data_ptr() for tensor in held]
    model = memory_model(engine.lm, engine.config)
    assert model.arena_bytes == arena.num_bytes == sum(t.numel() * t.element_size() for t in held)
    prompts, caps = mixed_workload(heldout_rows, 10)
    engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert [tensor.data_ptr() for tensor in held] == pointers  # written in place, never reallocated
    assert arena.num_free_slots == 4 and arena.num_bytes == model.arena_bytes


def test_a_model_whose_argmax_is_mask_still_ends_every_block(tiny_engine_factory, heldout_rows, monkeypatch):
    engine = tiny_engine_factory(dtype="float32", max_batch_size=4)
    lm, logits = engine.lm, engine.lm.model.logits

    def mask_first(hidden):
        scores = logits(hidden)
        scores[..., lm.tokens.mask_id] = scores.amax(-1) + 10.0  # MASK is every position's argmax
        return scores

    monkeypatch.setattr(lm.model, "logits", mask_first)
    outputs = engine.generate([chat(r["prompt"]) for r in heldout_rows[:4]], SamplingParams(max_new_tokens=64))
    assert all(o.finish_reason in ("eos", "length") and lm.tokens.mask_id not in o.token_ids for o in outputs)
    assert all(o.num_steps <= o.num_blocks * BLOCK for o in outputs)


@pytest.mark.parametrize("cache", ["dual", "prefix", "none"])
def test_dream_requests_equal_the_reference_in_both_shifted_decodings_and_the_two_differ(cache):
    """Dream (logits shifted by one), random fixture, float64: Fast-dLLM's block decoding (first
    position committed at a block's first step, windows start at the block) and the lookback variant
    each equal their oracle, and they are different decoders."""
    from engine import BlockServeEngine
    from engine.models import load_model
    from tests.test_models import DREAM_DIR

    lm = load_model(DREAM_DIR, dtype="float64")
    prompts = [[5 + (i * 7 + j) % 90 for j in range(3 + 2 * i)] for i in range(6)]
    caps = [16 * (1 + i % 3) for i in range(6)]
    tokens = {}
    for mode in ("fast-dllm", "lookback"):
        engine = BlockServeEngine(lm, EngineConfig(block_length=16, cache=cache, max_batch_size=4,
                                                   decoding="threshold", threshold=0.05, shifted_decoding=mode))
        recorder = StepRecorder(engine)
        outputs = engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
        assert recorder.saw_mixed_batch
        for output, cap in zip(outputs, caps):
            expected = reference_generate(lm, output.prompt_token_ids, max_new_tokens=cap, block_length=16,
                                          rule=DecodeRule("threshold", threshold=0.05), cache=cache,
                                          shifted_decoding=mode)
            assert output.token_ids == expected.token_ids and output.num_steps == expected.num_steps
        tokens[mode] = [o.token_ids for o in outputs]
    assert tokens["fast-dllm"] != tokens["lookback"]


@pytest.mark.parametrize("max_wait_s", [0.0, None])
def test_a_wide_request_in_a_stream_of_short_ones_is_admitted_once_overdue(tiny_engine_factory, max_wait_s):
    short_prompt, wide_prompt = [7] * 10, [9] * 150  # rows of 42 and 182 tokens
    engine = tiny_engine_factory(dtype="float32", max_batch_size=4, token_budget=4 * 60,
                                 max_wait_s=max_wait_s, decoding="quota", steps_per_block=2)
    short = SamplingParams(max_new_tokens=32, stop_at_eos=False)
    for _ in range(4):
        engine.add_request(short_prompt, short)
    engine.step()
    wide = engine.add_request(wide_prompt, SamplingParams(max_new_tokens=32, stop_at_eos=False))
    finished_at = None
    for step in range(60):  # a steady stream: a new short request at every step
        engine.add_request(short_prompt, short)
        if any(output.request_id == wide for output in engine.step().finished):
            finished_at = step
            break
    if max_wait_s is None:
        assert finished_at is None, "without aging the wide request starves behind the short ones"
    else:
        assert finished_at is not None and finished_at <= 8
