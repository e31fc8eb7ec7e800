"""How the engine schedules rows: under the continuous schedule every running row denoises at every step, a
finished request leaves at the end of the block that committed its EOS, the bounding box stays within
the token budget, sorted admission pads less, an overdue wide request is admitted, and abort evicts."""
import pytest

from engine import SamplingParams
from tests.engine_helpers import BLOCK, StepRecorder, chat, mixed_workload


def test_a_complete_row_never_waits_for_another_under_the_continuous_schedule(tiny_engine_factory, heldout_rows):
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


@pytest.mark.parametrize("schedule", ["continuous", "block_sync"])
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
