"""The scheduler's bookkeeping, on the CPU with hand-made runner results (tests/factories.py): what
``update`` returns is the step's data, a row moves through its blocks one step at a time, and a leaving
request gets the finish reason of what ended it. No model and no torch."""
from __future__ import annotations

from engine.scheduling.request import RequestStatus
from tests.factories import EOS, STOP_AT, drive, make_requests, make_scheduler, runner_output
from tests.test_import_boundaries import modules_loaded_by


def test_update_returns_each_completed_blocks_new_tokens_and_the_requests_that_leave():
    scheduler = make_scheduler(requests=make_requests(caps=[8, 8]))
    scheduled = scheduler.schedule(0.0)
    update = scheduler.update(runner_output(scheduled, complete={"r0": [5, 6, 7, 8]}))
    assert update.new_token_ids == {"r0": [5, 6, 7, 8]} and update.finished == []
    scheduled = scheduler.schedule(0.0)
    update = scheduler.update(runner_output(scheduled, complete={"r0": [3, EOS, 4, 4], "r1": [1, 1, 1, 1]}))
    assert update.new_token_ids == {"r0": [3], "r1": [1, 1, 1, 1]}  # trimmed before the stop token
    assert [request.request_id for request in update.finished] == ["r0"]
    assert update.finished[0].output_token_ids == [5, 6, 7, 8, 3]


def test_a_static_row_past_its_stop_token_adds_nothing_to_its_output():
    scheduler = make_scheduler(schedule="static", requests=make_requests(caps=[4, 8]))
    scheduled = scheduler.schedule(0.0)
    first = scheduler.update(runner_output(scheduled, complete={"r0": [EOS, 2, 2, 2], "r1": [6, 6, 6, 6]}))
    assert first.new_token_ids == {"r0": [], "r1": [6, 6, 6, 6]} and first.finished == []
    scheduled = scheduler.schedule(0.0)
    second = scheduler.update(runner_output(scheduled, complete={"r0": [7, 7, 7, 7], "r1": [6, EOS, 0, 0]}))
    assert second.new_token_ids == {"r0": [], "r1": [6]}  # r0 is past its cap and its EOS
    assert {request.request_id: request.output_token_ids for request in second.finished} == {
        "r0": [], "r1": [6, 6, 6, 6, 6]}


def test_a_static_rows_steps_past_its_stop_token_are_not_its_own_steps():
    requests = make_requests(caps=[4, 12])
    trace = drive(make_scheduler(schedule="static", requests=requests), completes_after=2, stops={"r0": 0})
    assert [len(step.rows) for step in trace] == [2] * 6  # r0 walks all 3 blocks of the shared canvas
    assert [request.num_steps for request in requests] == [2, 6]  # ... but only its first block is its own


def test_a_row_that_completes_its_block_starts_the_next_one_at_step_zero():
    scheduler = make_scheduler(requests=make_requests(caps=8))
    scheduler.update(runner_output(scheduler.schedule(0.0)))
    (request,) = scheduler.running
    assert (request.step_in_block, request.between_blocks) == (1, False)
    scheduler.update(runner_output(scheduler.schedule(0.0), complete={"r0": [5, 6, 7, 8]}))
    assert (request.step_in_block, request.between_blocks) == (0, True)
    scheduled = scheduler.schedule(0.0)
    assert scheduled.starting == [request] and request.between_blocks  # schedule() changes no row state


def test_a_leaving_request_is_finished_by_its_stop_token_its_cap_or_an_abort():
    ended = [*make_requests(caps=[8, 8]), *make_requests(caps=8, stop_at_eos=False, first=2),
             *make_requests(caps=8, first=3)]  # r2 ignores EOS: it runs to its cap
    ended[3].abort_requested = True  # r3 leaves once its first block is complete
    drive(make_scheduler(requests=ended), stops={"r0": 0, "r2": 0})
    assert [request.status for request in ended] == [RequestStatus.FINISHED_EOS, RequestStatus.FINISHED_LENGTH,
                                                     RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORT]
    assert [request.output_blocks for request in ended] == [1, 2, 2, 1]
    # r2 keeps its EOS and every token after it, as vLLM's ignore_eos does
    assert [len(request.output_token_ids) for request in ended] == [1, 8, 8, 4]
    assert ended[2].output_token_ids[STOP_AT] == EOS


def test_the_scheduling_specs_need_neither_torch_nor_a_model():
    assert not {"torch", "transformers"} & modules_loaded_by("import tests.factories")
