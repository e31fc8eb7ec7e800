"""Who runs in the next block cycle: queues, token-budget admission and eviction (policy only).

Schedules:
* ``block`` (BlockServe): at every block boundary, finished rows leave and pending requests join.
  Admission first takes requests whose row fits the current bounding box's width, then widens the box
  while ``rows x widest row <= token_budget`` holds.
* ``shrink`` (Fast-dLLM v2, dInfer): finished rows leave at boundaries; nobody joins until the batch is
  empty. One shared canvas (the batch's largest).
* ``static`` (Fast-dLLM): one shared canvas, rows walk every block in lock-step, nobody leaves or joins
  until the whole batch is done (outputs are trimmed at EOS afterwards).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """The rows of the next block cycle, in row order, and which of them joined at this boundary."""

    rows: list[Request]
    admitted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: EngineConfig, token_budget: int):
        self.config = config
        self.token_budget = token_budget
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
    def schedule(self, now: float) -> SchedulerOutput:
        """Admit what the policy allows at this boundary; return the rows of the next cycle."""
        if self.config.schedule == "block":
            admitted = self._admit_continuous()
        elif not self.running:
            admitted = self._admit_fresh_batch()
        else:
            admitted = []
        for request in admitted:
            request.status = RequestStatus.RUNNING
            request.first_scheduled_time = now
        self.running.extend(admitted)
        return SchedulerOutput(rows=list(self.running), admitted=admitted)

    def _admit_continuous(self) -> list[Request]:
        rows = len(self.running)
        box_width = max((request.width for request in self.running), default=0)
        admitted: list[Request] = []
        for may_grow in (False, True):
            kept = []
            for key, request in self.pending:
                new_width = max(box_width, request.width)
                fits = (rows < self.config.max_batch_size
                        and (may_grow or request.width <= box_width)
                        and (rows + 1) * new_width <= self.token_budget)
                if fits:
                    admitted.append(request)
                    rows, box_width = rows + 1, new_width
                else:
                    kept.append((key, request))
            self.pending = kept
        return admitted

    def _admit_fresh_batch(self) -> list[Request]:
        """Static/shrink: a new batch sharing one canvas, in queue order, within the budget."""
        batch: list[Request] = []
        prompt_width = canvas_blocks = 0
        while self.pending and len(batch) < self.config.max_batch_size:
            request = self.pending[0][1]
            new_prompt = max(prompt_width, request.prompt_length)
            new_canvas = max(canvas_blocks, request.cap_blocks)
            box = (len(batch) + 1) * (new_prompt + new_canvas * self.config.block_length)
            if batch and box > self.token_budget:
                break
            batch.append(self.pending.pop(0)[1])
            prompt_width, canvas_blocks = new_prompt, new_canvas
        for request in batch:
            request.canvas_blocks = canvas_blocks
        return batch

    # -- eviction ----------------------------------------------------------------------------------
    def finish_boundary(self, stop_found: list[bool]) -> list[Request]:
        """Advance every row past its block; evict the rows this schedule lets go now."""
        for request, found in zip(self.running, stop_found):
            if found and request.stop_block is None:
                request.stop_block = request.block_index
            request.block_index += 1
        if self.config.schedule == "static":
            batch_done = all(request.block_index >= request.canvas_blocks for request in self.running)
            leaving = [r for r in self.running if batch_done or r.abort_requested]
        else:
            leaving = [r for r in self.running if self._is_done(r)]
        leaving_ids = {id(request) for request in leaving}
        self.running = [request for request in self.running if id(request) not in leaving_ids]
        for request in leaving:
            request.status = self._final_status(request)
        return leaving

    def _is_done(self, request: Request) -> bool:
        stopped = request.stop_block is not None and request.params.stop_at_eos
        return stopped or request.block_index >= request.cap_blocks or request.abort_requested

    @staticmethod
    def _final_status(request: Request) -> RequestStatus:
        if request.abort_requested:
            return RequestStatus.FINISHED_ABORT
        if request.stop_block is not None and request.stop_block < request.cap_blocks:
            return RequestStatus.FINISHED_EOS
        return RequestStatus.FINISHED_LENGTH
