"""Who runs at the next denoising step: queues, token-budget admission and eviction (policy only).

A row whose block has no mask left is *complete*. What happens to it depends on the schedule:
* ``step`` (ours): at the very next step it leaves (stop token committed, cap reached, aborted) or starts
  its next block, while the other rows continue theirs; pending requests are admitted at every step.
* ``block`` (BlockServe, the paper): a complete row waits, computing nothing, until every row's block
  is complete (the block boundary); then finished rows leave, pending requests join, and every row
  starts its next block together.
Admission (both) first takes requests whose row fits the current bounding box's width, then widens the
box while ``rows x widest row <= token_budget`` holds. A request pending longer than ``max_wait_s`` is
admitted first, even if the box must grow; until it fits, nobody else joins (aging: no starvation).
* ``shrink`` (Fast-dLLM v2, dInfer): as ``block``, but nobody joins until the batch is empty. One shared
  canvas (the batch's largest).
* ``static`` (Fast-dLLM): one shared canvas, rows walk every block in lock-step, nobody leaves or joins
  until the whole batch is done (outputs are trimmed at EOS afterwards).

The runner's results come back keyed by request id (:meth:`Scheduler.update`); this file is the only
one that moves a request through its blocks.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.request import Request, RequestStatus
from engine.runner import StepOutput


@dataclass
class SchedulerOutput:
    """What runs at the next step (data only)."""

    refresh: list[Request] = field(default_factory=list)  # rows starting a block (admitted ones too)
    window: list[Request] = field(default_factory=list)  # rows continuing their block
    admitted: list[Request] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return len(self.refresh) + len(self.window)


@dataclass(frozen=True)
class SchedulerUpdate:
    """What a step's results did to its requests (data only)."""

    new_token_ids: dict[str, list[int]]  # request id -> what its just-completed block added to its
    # own output (up to a stop token; empty past one or its block cap)
    finished: list[Request]  # the requests that leave now, their output_token_ids final


@dataclass
class _Box:
    """The running batch's bounding box while admission fills it."""

    rows: int
    width: int

    def add(self, request: Request) -> Request:
        self.rows, self.width = self.rows + 1, max(self.width, request.width)
        return request


class Scheduler:
    def __init__(self, config: EngineConfig, token_budget: int, max_row_width: int):
        self.config = config
        self.token_budget = token_budget
        self.max_row_width = max_row_width
        self.pending: list[tuple[tuple[int, int], Request]] = []  # sorted by queue key
        self.running: list[Request] = []

    # -- queue -------------------------------------------------------------------------------------
    def _queue_key(self, request: Request) -> tuple[int, int]:
        if self.config.sort_pending and self.config.schedule != "static":
            return (request.prompt_length, request.sequence_number)
        return (0, request.sequence_number)

    def add(self, request: Request) -> None:
        bisect.insort(self.pending, (self._queue_key(request), request), key=lambda item: item[0])

    def remove_pending(self, request_id: str) -> Request | None:
        for index, (_, request) in enumerate(self.pending):
            if request.request_id == request_id:
                return self.pending.pop(index)[1]
        return None

    @property
    def num_pending(self) -> int:
        return len(self.pending)

    def has_work(self) -> bool:
        return bool(self.pending or self.running)

    # -- admission ---------------------------------------------------------------------------------
    @property
    def at_block_boundary(self) -> bool:
        """Every running row's block is complete (vacuously true for an empty batch)."""
        return all(request.block_complete for request in self.running)

    def schedule(self, now: float) -> SchedulerOutput:
        """Rows that start a block, rows that continue one, and whom the policy admits now."""
        schedule = self.config.schedule
        if schedule == "step":
            admitted = self._admit_continuous(now)
        elif schedule == "block":
            admitted = self._admit_continuous(now) if self.at_block_boundary else []
        else:
            admitted = [] if self.running else self._admit_fresh_batch()
        for request in admitted:
            request.status = RequestStatus.RUNNING
            request.first_scheduled_time = now
        starting = [r for r in self.running if r.block_complete] if (
            schedule == "step" or self.at_block_boundary) else []
        for request in starting:
            request.block_complete, request.step_in_block = False, 0
        window = [r for r in self.running if not r.block_complete and r not in starting]
        self.running.extend(admitted)
        return SchedulerOutput(refresh=starting + admitted, window=window, admitted=admitted)

    def _admit_continuous(self, now: float) -> list[Request]:
        """Fits-the-box first, then grow the box; a request overdue for ``max_wait_s`` goes first, and
        while it does not fit nobody else joins, so the box drains until it does (no starvation)."""
        box = _Box(len(self.running), max((r.width for r in self.running), default=0))
        admitted: list[Request] = []
        overdue = self._overdue(now)
        if overdue is not None:
            if not self._fits(box, overdue, may_grow=True):
                return admitted
            self.pending = [item for item in self.pending if item[1] is not overdue]
            admitted.append(box.add(overdue))
        for may_grow in (False, True):
            kept = []
            for key, request in self.pending:
                if self._fits(box, request, may_grow):
                    admitted.append(box.add(request))
                else:
                    kept.append((key, request))
            self.pending = kept
        return admitted

    def _overdue(self, now: float) -> Request | None:
        """The longest-waiting pending request, if it has waited more than ``max_wait_s``."""
        if self.config.max_wait_s is None or not self.pending:
            return None
        oldest = min((request for _, request in self.pending), key=lambda request: request.sequence_number)
        return oldest if now - oldest.arrival_time > self.config.max_wait_s else None

    def _fits(self, box: _Box, request: Request, may_grow: bool) -> bool:
        width = max(box.width, request.width)
        return (box.rows < self.config.max_batch_size and (may_grow or request.width <= box.width)
                and request.width <= self.max_row_width and (box.rows + 1) * width <= self.token_budget)

    def _admit_fresh_batch(self) -> list[Request]:
        """Static/shrink: a new batch sharing one canvas, in queue order, within the budget."""
        batch: list[Request] = []
        prompt_width = canvas_blocks = 0
        while self.pending and len(batch) < self.config.max_batch_size:
            request = self.pending[0][1]
            new_prompt = max(prompt_width, request.prompt_length)
            new_canvas = max(canvas_blocks, request.cap_blocks)
            row_width = new_prompt + new_canvas * self.config.block_length
            if batch and ((len(batch) + 1) * row_width > self.token_budget or row_width > self.max_row_width):
                break
            batch.append(self.pending.pop(0)[1])
            prompt_width, canvas_blocks = new_prompt, new_canvas
        for request in batch:
            request.canvas_blocks = canvas_blocks
        return batch

    # -- results ----------------------------------------------------------------------------------
    def update(self, output: StepOutput) -> SchedulerUpdate:
        """Apply a step's results (keyed by request id): each completed block's new output tokens,
        and the requests that leave now."""
        by_id = {request.request_id: request for request in self.running}
        new_token_ids: dict[str, list[int]] = {}
        for request_id, result in output.rows.items():
            request = by_id[request_id]
            request.step_in_block += 1
            request.num_steps += request.is_decoding_own_output  # a static row past its EOS: waste
            if result.block_complete:
                new_token_ids[request_id] = request.complete_block(result.block_tokens, result.stop_index,
                                                                   result.block_logprobs)
        leaving = self._leaving()
        leaving_ids = {id(request) for request in leaving}
        self.running = [request for request in self.running if id(request) not in leaving_ids]
        for request in leaving:
            request.status = self._final_status(request)
        return SchedulerUpdate(new_token_ids=new_token_ids, finished=leaving)

    def _leaving(self) -> list[Request]:
        if self.config.schedule == "step":
            return [r for r in self.running if r.block_complete and r.is_done]
        if not self.running or not self.at_block_boundary:
            return []
        if self.config.schedule == "static":
            batch_done = all(request.block_index >= request.canvas_blocks for request in self.running)
            return [r for r in self.running if batch_done or r.abort_requested]
        return [r for r in self.running if r.is_done]

    @staticmethod
    def _final_status(request: Request) -> RequestStatus:
        if request.abort_requested:
            return RequestStatus.FINISHED_ABORT
        if request.has_stopped and request.stop_block < request.cap_blocks:  # ignore_eos: "length"
            return RequestStatus.FINISHED_EOS
        return RequestStatus.FINISHED_LENGTH
