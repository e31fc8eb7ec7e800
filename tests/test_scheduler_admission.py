"""Who joins the running batch, and when: the scheduler's admission on the CPU, with the runner played by
hand (tests/factories.py) and every time an explicit ``now``.

Budget admission first takes the requests whose row fits the current bounding box, then widens the box
while rows x widest row stays within the token budget, never past ``max_batch_size`` rows nor a row of
``max_row_width``. A request pending longer than ``max_wait_s`` goes first, and nobody joins until it
fits. ``shrink`` and ``static`` admit a fresh batch on one shared canvas; a static batch with a timeout
starts only when it is full or its oldest request has waited that long.
"""
from __future__ import annotations

import pytest

from tests.factories import drive, make_requests, make_scheduler


def test_rows_that_fit_the_current_box_join_before_any_row_widens_it():
    scheduler = make_scheduler(token_budget=40, sort_pending=False, requests=make_requests(caps=8))  # 10 wide
    drive(scheduler, 1, completes_after=3)
    for request in make_requests(prompt_lengths=[12, 2, 2], first=1):  # r1 (20 wide) arrived before r2, r3
        scheduler.add(request)
    (step,) = drive(scheduler, 1, completes_after=3)
    assert step.admitted == ("r2", "r3") and step.pending == ("r1",)  # r1 would make the box 4 x 20 = 80
    assert step.box == 3 * 10


@pytest.mark.parametrize("budget,admitted", [(40, ("r0", "r2")), (60, ("r0", "r2", "r1"))])
def test_the_box_grows_while_rows_times_its_widest_row_stays_within_the_budget(budget, admitted):
    scheduler = make_scheduler(token_budget=budget, requests=make_requests(prompt_lengths=[2, 12, 2]))
    (step,) = drive(scheduler, 1)  # rows of 10, 20 and 10 tokens, the narrow ones first in the queue
    assert step.admitted == admitted and step.box <= budget


def test_no_more_rows_than_max_batch_size_and_no_row_wider_than_max_row_width_ever_join():
    scheduler = make_scheduler(max_batch_size=4, requests=make_requests(6))
    assert len(drive(scheduler, 1)[0].admitted) == 4
    scheduler = make_scheduler(max_row_width=15, requests=make_requests(prompt_lengths=[2, 12]))  # 10 and 20 wide
    trace = drive(scheduler, 5)
    assert trace.first("admitted", "r0") == 0 and trace.first("admitted", "r1") is None
    assert trace[-1].pending == ("r1",)


def test_bounding_box_never_exceeds_the_token_budget():
    budget = 90
    requests = make_requests(prompt_lengths=[3 + 7 * n % 17 for n in range(32)],
                             caps=[4 * (1 + n % 3) for n in range(32)])
    scheduler = make_scheduler(max_batch_size=16, token_budget=budget, requests=requests)  # rows of 7 to 31 tokens
    trace = drive(scheduler, completes_after={f"r{n}": 1 + n % 3 for n in range(32)})
    assert max(step.box for step in trace) <= budget
    assert any(step.pending and len(step.rows) < 16 for step in trace), "the budget, not the batch size, bound"
    assert all(request.is_finished for request in requests)


def padding_fraction(sort_pending: bool) -> float:
    """Pad positions over bounding-box positions of every step of an interleaved short / long workload
    (what ``EngineStats.padding_fraction`` reports for a full-attention model)."""
    requests = make_requests(prompt_lengths=[8, 40] * 10, caps=32, block_length=32)
    scheduler = make_scheduler(block_length=32, max_batch_size=4, sort_pending=sort_pending, requests=requests)
    trace = drive(scheduler, completes_after=4)
    return sum(step.box - step.real_tokens for step in trace) / sum(step.box for step in trace)


def test_sorted_admission_pads_less_than_arrival_order_on_a_skewed_workload():
    assert padding_fraction(sort_pending=True) < padding_fraction(sort_pending=False)


def short_stream_beside_a_wide_request(max_wait_s: float | None):
    """Four short rows (42 tokens) run; a wide one (182) arrives at 0.5 s, then a short one before every
    step. Steps are 1 s apart; every block takes 2 steps; 4 x 60 tokens allow a wide row only alone."""
    shorts = {"prompt_lengths": 10, "caps": 32, "block_length": 32}
    scheduler = make_scheduler(block_length=32, max_batch_size=4, token_budget=4 * 60, max_wait_s=max_wait_s,
                               requests=make_requests(4, **shorts))
    drive(scheduler, 1, completes_after=2, now=0.0)
    scheduler.add(make_requests(prompt_lengths=150, caps=32, block_length=32, arrivals=0.5, first=4, prefix="wide")[0])
    stream = {step: make_requests(**shorts, arrivals=step + 0.5, first=5 + step) for step in range(60)}
    return drive(scheduler, 60, completes_after=2, now=1.0, arrivals=stream)


@pytest.mark.parametrize("max_wait_s", [0.0, None])
def test_a_wide_request_in_a_stream_of_short_ones_is_admitted_once_overdue(max_wait_s):
    finished_at = short_stream_beside_a_wide_request(max_wait_s).first("finished", "wide4")
    if max_wait_s is None:
        assert finished_at is None, "without aging the wide request starves behind the short ones"
    else:
        assert finished_at is not None and finished_at <= 8


def test_an_overdue_request_goes_first_and_nobody_joins_until_it_fits():
    trace = short_stream_beside_a_wide_request(max_wait_s=3.0)
    overdue = 3  # step 3 runs at 4.0 s: the first at which the wide request (arrived at 0.5 s) waited over 3 s
    admitted_at = trace.first("admitted", "wide4")
    assert {request_id for step in trace[:overdue] for request_id in step.admitted} == {"r5", "r6", "r7"}, \
        "until it is overdue, short requests that arrived after it join past it"
    assert admitted_at > overdue and all(not step.admitted for step in trace[overdue:admitted_at])
    assert trace[admitted_at - 1].finished and trace[admitted_at].admitted == ("wide4",)  # once the box drained


def test_a_static_batch_waits_until_it_is_full_or_its_oldest_request_has_waited_the_timeout():
    collecting = make_scheduler(schedule="static", static_batch_timeout_s=1.0, requests=make_requests(2, caps=4))
    assert collecting.wait_s(0.25) == 0.75 and collecting.schedule(0.25).admitted == []
    assert [r.request_id for r in collecting.schedule(1.0).admitted] == ["r0", "r1"]
    full = make_scheduler(schedule="static", static_batch_timeout_s=1.0, requests=make_requests(4, caps=4))
    assert full.wait_s(0.0) == 0.0 and len(full.schedule(0.0).admitted) == 4


@pytest.mark.parametrize("schedule", ["shrink", "static"])
def test_a_fresh_batch_shares_its_largest_canvas_and_stops_at_the_budget(schedule):
    requests = make_requests(prompt_lengths=[2, 2, 6], caps=[4, 12, 8])
    scheduler = make_scheduler(schedule=schedule, token_budget=50, requests=requests)
    (step,) = drive(scheduler, 1)
    assert step.admitted == ("r0", "r1")  # with r2 the rows would be 6 + 3 blocks of 4 wide: 3 x 18 > 50
    assert [request.canvas_blocks for request in requests[:2]] == [3, 3] and step.box == 2 * 14
