"""What each schedule does with a row whose block is complete: who starts a block, who waits at a block
boundary, who leaves. On the CPU, with the runner played by hand (tests/factories.py): ``completes_after``
says how many steps a row's blocks take, ``stops`` which block commits its stop token.

* ``continuous``: every running row denoises at every step; a row starts its next block, or leaves, at
  once, beside rows continuing theirs.
* ``block_sync``: a row between blocks waits until every row is; then rows leave, join and start together.
* ``shrink``: as ``block_sync``, but nobody joins until the whole batch has left.
* ``static``: the batch walks every block of its shared canvas in lock-step and leaves together.
"""
from __future__ import annotations

import pytest

from engine.scheduling.request import RequestStatus
from tests.factories import BLOCK, drive, make_requests, make_scheduler

MIXED_STEPS = {f"r{n}": 1 + n % 3 for n in range(12)}  # blocks taking 1, 2 or 3 steps: rows fall out of phase


def test_a_complete_row_never_waits_for_another_under_the_continuous_schedule():
    """Every running row denoises at every step: no row sits out a step waiting for a boundary."""
    requests = make_requests(prompt_lengths=[2 + n % 5 for n in range(12)], caps=[4 * (1 + n % 3) for n in range(12)])
    trace = drive(make_scheduler(max_batch_size=4, requests=requests), completes_after=MIXED_STEPS)
    assert all(step.waiting == () for step in trace)
    assert any(step.starting and step.continuing for step in trace), "no row started a block beside others"


@pytest.mark.parametrize("schedule", ["continuous", "block_sync"])
def test_finished_request_is_evicted_at_the_end_of_the_block_that_committed_eos(schedule):
    requests = make_requests(12, caps=4 * BLOCK)
    stops = {f"r{n}": n % 5 for n in range(12) if n % 5 < 4}  # r4 and r9 never stop: they run to their cap
    trace = drive(make_scheduler(max_batch_size=4, schedule=schedule, requests=requests),
                  completes_after=MIXED_STEPS, stops=stops)
    blocks_completed, finished_with = {}, {}
    for step in trace:
        for request_id in step.completed:
            blocks_completed[request_id] = blocks_completed.get(request_id, 0) + 1
        for request_id in step.finished:  # it leaves in the very step that completed its EOS block
            finished_with[request_id] = blocks_completed.get(request_id, 0)
    eos_requests = [r for r in requests if r.status == RequestStatus.FINISHED_EOS]
    assert {r.request_id for r in eos_requests} == set(stops)
    for request in eos_requests:
        eos_block = len(request.output_token_ids) // BLOCK
        assert request.output_blocks == eos_block + 1 == finished_with[request.request_id]


@pytest.mark.parametrize("schedule,second_step", [("continuous", {"starting": ("r0",), "continuing": ("r1",)}),
                                                  ("block_sync", {"waiting": ("r0",), "continuing": ("r1",)})])
def test_a_row_between_blocks_starts_its_next_block_at_once_or_waits_for_the_boundary(schedule, second_step):
    scheduler = make_scheduler(schedule=schedule, requests=make_requests(caps=[8, 8]))
    trace = drive(scheduler, 4, completes_after={"r0": 1, "r1": 3})
    assert all(getattr(trace[1], what) == ids for what, ids in second_step.items())
    if schedule == "block_sync":  # r1 completes its block at step 2: both start block 1 together
        assert trace[2].waiting == ("r0",) and trace[3].starting == ("r0", "r1")


@pytest.mark.parametrize("schedule,r0_leaves_at,r2_joins_at", [("continuous", 0, 1), ("block_sync", 2, 3)])
def test_requests_leave_and_join_at_once_or_only_at_a_block_boundary(schedule, r0_leaves_at, r2_joins_at):
    scheduler = make_scheduler(schedule=schedule, requests=make_requests(caps=[4, 8]))  # r0: one block
    late = make_requests(first=2)  # arrives before step 1, while r1 is inside its first block (3 steps)
    trace = drive(scheduler, 4, completes_after={"r0": 1, "r1": 3}, arrivals={1: late})
    assert trace.first("finished", "r0") == r0_leaves_at and trace.first("admitted", "r2") == r2_joins_at


def test_under_shrink_nobody_joins_until_the_whole_batch_has_left():
    scheduler = make_scheduler(schedule="shrink", max_batch_size=2, requests=make_requests(caps=[4, 12, 4]))
    trace = drive(scheduler)
    assert trace[0].admitted == ("r0", "r1") and trace[0].finished == ("r0",)  # r0 leaves at the boundary
    assert trace.first("finished", "r1") == 2 and trace.first("admitted", "r2") == 3  # r1 ran its canvas alone
    assert [step.rows for step in trace[1:3]] == [("r1",), ("r1",)] and trace[1].pending == ("r2",)


def test_a_static_batch_walks_every_block_in_lock_step_and_leaves_together():
    requests = make_requests(caps=[4, 12, 8])
    trace = drive(make_scheduler(schedule="static", requests=requests), completes_after={"r0": 1, "r1": 2, "r2": 2},
                  stops={"r2": 0})
    assert [step.starting for step in trace if step.starting] == [("r0", "r1", "r2")] * 3  # 3 blocks: r1's cap
    assert [step.waiting for step in trace] == [(), ("r0",)] * 3  # r0's blocks take 1 step, the others' 2
    assert [step.finished for step in trace] == [()] * 5 + [("r0", "r1", "r2")]
    assert [request.output_blocks for request in requests] == [1, 3, 1]  # trimmed at its cap, at its EOS


@pytest.mark.parametrize("schedule", ["continuous", "block_sync", "shrink", "static"])
def test_a_running_request_asked_to_abort_leaves_once_its_block_is_complete(schedule):
    requests = make_requests(caps=[12, 12])
    scheduler = make_scheduler(schedule=schedule, requests=requests)
    drive(scheduler, 1, completes_after=2)
    requests[0].abort_requested = True  # inside its first block
    trace = drive(scheduler, completes_after=2)
    assert trace.first("finished", "r0") == 0 and requests[0].status == RequestStatus.FINISHED_ABORT
    assert requests[0].output_blocks == 1 and len(requests[0].output_token_ids) == BLOCK
    assert requests[1].status == RequestStatus.FINISHED_LENGTH and requests[1].output_blocks == 3
