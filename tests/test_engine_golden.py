"""The BlockServe engine equals the single-request reference decoder: every request of a batch, under
every schedule, decoding rule and cache, arriving together or mid-flight, sampled with a seed or greedy,
on the tiny model and on Dream's shifted logits, gets the oracle's tokens, finish reason and blocks."""
import itertools

import pytest

from engine import EngineConfig, SamplingParams
from engine.oracle.reference import reference_generate
from engine.rules import make_rule, rule_for
from tests.engine_helpers import StepRecorder, chat, mixed_workload

_REFERENCE_RESULTS: dict = {}  # the oracle's answers, shared by the tests of every schedule


def reference_for(engine, output, max_new_tokens, **kwargs):
    config = engine.config
    rule = rule_for(config)
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
    *itertools.product(["continuous"], ["threshold", "quota", "factor"], ["dual", "prefix", "none"]),
    *itertools.product(["block_sync"], ["threshold"], ["dual", "prefix", "none"])])
def test_batched_requests_equal_the_reference_decoder_alone(tiny_engine_factory, heldout_rows,
                                                            schedule, decoding, cache):
    engine = tiny_engine_factory(schedule=schedule, decoding=decoding, cache=cache, max_batch_size=6,
                                 steps_per_block=8 if decoding == "quota" else None)
    recorder = StepRecorder(engine)
    prompts, caps = mixed_workload(heldout_rows)
    outputs = engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert recorder.saw_mixed_batch, "rows never sat at different block indices in one step"
    if schedule == "continuous" and cache != "none" and decoding != "quota":
        assert recorder.saw_block_starts_beside_continuing_rows
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


@pytest.mark.parametrize("schedule", ["static", "shrink"])
def test_baseline_schedules_equal_the_reference_when_requests_share_a_canvas(
        tiny_engine_factory, heldout_rows, schedule):
    engine = tiny_engine_factory(schedule=schedule, max_batch_size=8)
    prompts = [chat(row["prompt"]) for row in heldout_rows[:24]]
    caps = [96] * len(prompts)
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=96))
    assert_matches_reference(engine, outputs, caps)


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


@pytest.mark.parametrize("cache", ["dual", "prefix", "none"])
def test_dream_requests_equal_the_reference_in_both_shifted_decodings_and_the_two_differ(cache):
    """Dream (logits shifted by one), random fixture, float64: Fast-dLLM's block decoding (first
    position committed at a block's first step, windows start at the block) and the lookback variant
    each equal their oracle, and they are different decoders."""
    from engine import BlockServeEngine
    from engine.models import load_model
    from tests.model_helpers import DREAM_DIR

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
                                          rule=make_rule("threshold", threshold=0.05), cache=cache,
                                          shifted_decoding=mode)
            assert output.token_ids == expected.token_ids and output.num_steps == expected.num_steps
        tokens[mode] = [o.token_ids for o in outputs]
    assert tokens["fast-dllm"] != tokens["lookback"]
