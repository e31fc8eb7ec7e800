"""How the engine carries out the scheduler's decisions on the tiny model: the bounding boxes its forwards
compute and its stats report stay within the token budget (each is the scheduler's rows x widest row), and
``abort_request`` evicts a pending request at once and a running one when its block is complete.

The decisions themselves (who runs, waits, joins and leaves at each step, under each schedule) are
specified with no model in tests/test_scheduler_admission.py and tests/test_scheduler_schedules.py.
"""
from engine import SamplingParams
from tests.engine_helpers import StepRecorder, chat, mixed_workload


def test_the_boxes_the_engine_computes_and_reports_stay_within_the_token_budget(tiny_engine_factory, heldout_rows):
    budget = 900
    engine = tiny_engine_factory(dtype="float32", max_batch_size=16, token_budget=budget)
    recorder = StepRecorder(engine)
    prompts, caps = mixed_workload(heldout_rows, 32)
    engine.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert max(step["box"] for step in recorder.steps) <= budget
    assert engine.stats().peak_bounding_box_tokens <= budget
    # the box is the scheduler's rows x widest row, as tests/factories.py's drive() computes it
    assert all(step["box"] == step["rows"] * step["widest"] for step in recorder.steps)


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
