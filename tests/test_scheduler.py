"""The scheduler on the CPU, fed hand-made runner results: what ``update`` returns is the step's data."""
from __future__ import annotations

from engine import EngineConfig, SamplingParams
from engine.config import blocks_needed
from engine.outputs import RowResult, RunnerOutput
from engine.request import Request
from engine.scheduler import Scheduler

BLOCK = 4
EOS = 9


def scheduler_with(*caps: int, schedule: str = "continuous", stop_at_eos: bool = True, **config) -> Scheduler:
    scheduler = Scheduler(EngineConfig(block_length=BLOCK, schedule=schedule, max_batch_size=4, **config), 1000, 100)
    for number, cap in enumerate(caps):
        request = Request(request_id=f"r{number}", prompt_token_ids=[1, 2], block_length=BLOCK, arrival_time=0.0,
                          params=SamplingParams(max_new_tokens=cap, stop_at_eos=stop_at_eos), sequence_number=number)
        request.cap_blocks = request.canvas_blocks = blocks_needed(cap, BLOCK)
        scheduler.add(request)
    return scheduler


def complete(tokens: list[int]) -> RowResult:
    stop = tokens.index(EOS) if EOS in tokens else None
    return RowResult(block_complete=True, stop_index=stop, block_tokens=tokens)


def test_update_returns_each_completed_blocks_new_tokens_and_the_requests_that_leave():
    scheduler = scheduler_with(8, 8)
    scheduler.schedule(0.0)
    update = scheduler.update(RunnerOutput(rows={"r0": complete([5, 6, 7, 8]),
                                                 "r1": RowResult(False, None, None)}, model_time_s=0.0))
    assert update.new_token_ids == {"r0": [5, 6, 7, 8]} and update.finished == []
    scheduler.schedule(0.0)
    update = scheduler.update(RunnerOutput(rows={"r0": complete([3, EOS, 4, 4]), "r1": complete([1, 1, 1, 1])},
                                           model_time_s=0.0))
    assert update.new_token_ids == {"r0": [3], "r1": [1, 1, 1, 1]}  # trimmed before the stop token
    assert [request.request_id for request in update.finished] == ["r0"]
    assert update.finished[0].output_token_ids == [5, 6, 7, 8, 3]


def test_a_static_row_past_its_stop_token_adds_nothing_to_its_output():
    scheduler = scheduler_with(4, 8, schedule="static")
    scheduler.schedule(0.0)
    first = scheduler.update(RunnerOutput(rows={"r0": complete([EOS, 2, 2, 2]), "r1": complete([6, 6, 6, 6])},
                                          model_time_s=0.0))
    assert first.new_token_ids == {"r0": [], "r1": [6, 6, 6, 6]} and first.finished == []
    scheduler.schedule(0.0)
    second = scheduler.update(RunnerOutput(rows={"r0": complete([7, 7, 7, 7]), "r1": complete([6, EOS, 0, 0])},
                                           model_time_s=0.0))
    assert second.new_token_ids == {"r0": [], "r1": [6]}  # r0 is past its cap and its EOS
    assert {request.request_id: request.output_token_ids for request in second.finished} == {
        "r0": [], "r1": [6, 6, 6, 6, 6]}


def test_a_static_batch_waits_until_it_is_full_or_its_oldest_request_has_waited_the_timeout():
    collecting = scheduler_with(4, 4, schedule="static", static_batch_timeout_s=1.0)
    assert collecting.wait_s(0.25) == 0.75 and collecting.schedule(0.25).admitted == []
    assert [r.request_id for r in collecting.schedule(1.0).admitted] == ["r0", "r1"]
    full = scheduler_with(4, 4, 4, 4, schedule="static", static_batch_timeout_s=1.0)
    assert full.wait_s(0.0) == 0.0 and len(full.schedule(0.0).admitted) == 4


def test_a_row_that_completes_its_block_starts_the_next_one_at_step_zero():
    scheduler = scheduler_with(8)
    scheduler.schedule(0.0)
    scheduler.update(RunnerOutput(rows={"r0": RowResult(False, None, None)}, model_time_s=0.0))
    (request,) = scheduler.running
    assert (request.step_in_block, request.between_blocks) == (1, False)
    scheduler.update(RunnerOutput(rows={"r0": complete([5, 6, 7, 8])}, model_time_s=0.0))
    assert (request.step_in_block, request.between_blocks) == (0, True)
    scheduled = scheduler.schedule(0.0)
    assert scheduled.refresh == [request] and request.between_blocks  # schedule() changes no row state
