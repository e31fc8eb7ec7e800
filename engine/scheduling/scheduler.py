"""Who runs at the next denoising step: queues, token-budget admission, and who leaves (policy only).

The schedule's own rules live in ``engine.scheduling.policies``, one small object per schedule. This file keeps
the queues and the two ways to admit. Budget admission (``admit_into_box``) first takes requests whose
row fits the current bounding box's width. Then it widens the box while ``rows x widest row <=
token_budget`` holds. A request pending longer than ``max_wait_s`` is admitted first, even if the box
must grow; until it fits, nobody else joins (aging: no starvation). With a prefix cache and a schedule
that admits at every step, a request whose prompt shares a long uncached run with a row admitted in
the same step waits one step and reads the run from the cache. A fresh batch (``admit_fresh_batch``)
shares one canvas, the largest of its requests.

The runner's results come back keyed by request id (:meth:`Scheduler.update`). This file is the only
one that moves a request through its blocks.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.scheduling.outputs import RunnerOutput, SchedulerOutput, SchedulerUpdate
from engine.scheduling.policies import make_policy
from engine.scheduling.prefix_claims import PrefixClaims
from engine.scheduling.prefix_index import PrefixIndex
from engine.scheduling.request import Request, RequestStatus

# A shared run shorter than this is cheaper to compute twice than to wait a step for (a 64-token
# prefill costs about one step of a batch of 16 rows of 4-token blocks).
PREFIX_WAIT_TOKENS = 64


@dataclass
class _Box:
    """The running batch's bounding box while admission fills it."""

    rows: int
    width: int

    def add(self, request: Request) -> Request:
        self.rows, self.width = self.rows + 1, max(self.width, request.width)
        return request


class Scheduler:
    def __init__(self, config: EngineConfig, token_budget: int, max_row_width: int,
                 prefix_index: PrefixIndex | None = None):
        self.config = config
        self.prefix_index = prefix_index  # the runner's prefix cache, read to see what a step computes
        self.prefix_waits = 0  # admissions to a free row put off a step to read a prefix a joining row computes
        self.policy = make_policy(config)
        self.token_budget = token_budget
        self.max_row_width = max_row_width
        self.pending: list[tuple[tuple[int, int], Request]] = []  # sorted by queue key
        self.running: list[Request] = []

    # -- queue -------------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        bisect.insort(self.pending, (self.policy.queue_key(request), request), key=lambda item: item[0])

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

    def wait_s(self, now: float) -> float:
        """Seconds the policy holds its next step back (a static batch still collecting); else 0."""
        return self.policy.wait_s(self, now)

    # -- admission ---------------------------------------------------------------------------------
    @property
    def at_block_boundary(self) -> bool:
        """Every running row is between blocks (vacuously true for an empty batch)."""
        return all(request.between_blocks for request in self.running)

    def schedule(self, now: float) -> SchedulerOutput:
        """Rows that start a block, rows that continue one, and whom the policy admits now."""
        admitted = self.policy.admit(self, now)
        for request in admitted:
            request.status = RequestStatus.RUNNING
            request.first_scheduled_time = now
        starting = [r for r in self.running if r.between_blocks] if self.policy.starts_blocks(self) else []
        continuing = [r for r in self.running if not r.between_blocks]
        self.running.extend(admitted)
        return SchedulerOutput(starting=starting + admitted, continuing=continuing, admitted=admitted)

    def admit_into_box(self, now: float) -> list[Request]:
        """Fits-the-box first, then grow the box. A request overdue for ``max_wait_s`` goes first; while
        it does not fit, nobody else joins, so the box drains until it does (no starvation)."""
        box = _Box(len(self.running), max((r.width for r in self.running), default=0))
        admitted: list[Request] = []
        claims = (PrefixClaims(self.prefix_index, PREFIX_WAIT_TOKENS)
                  if self.prefix_index is not None and self.policy.admits_every_step else None)
        overdue = self._overdue(now)
        if overdue is not None:
            if not self._fits(box, overdue, may_grow=True):
                return admitted
            self.pending = [item for item in self.pending if item[1] is not overdue]
            admitted.append(box.add(overdue))
            if claims is not None:  # it never waits
                claims.claim(overdue)
        waited: set[int] = set()
        for may_grow in (False, True):
            kept = []
            for key, request in self.pending:
                if not self._fits(box, request, may_grow):
                    kept.append((key, request))
                elif id(request) in waited or (claims is not None and claims.must_wait(request)):
                    waited.add(id(request))
                    kept.append((key, request))
                else:
                    admitted.append(box.add(request))
                    if claims is not None:
                        claims.claim(request)
            self.pending = kept
        self.prefix_waits += min(len(waited), self.config.max_batch_size - box.rows)  # those a free row awaited
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

    def admit_fresh_batch(self) -> list[Request]:
        """A new batch sharing one canvas, in queue order, within the budget."""
        batch: list[Request] = []
        prompt_width = canvas_blocks = 0
        while self.pending and len(batch) < self.config.max_batch_size:
            request = self.pending[0][1]
            new_prompt = max(prompt_width, request.prompt_length)
            new_canvas = max(canvas_blocks, request.own_canvas_blocks)
            row_width = new_prompt + new_canvas * self.config.block_length
            if batch and ((len(batch) + 1) * row_width > self.token_budget or row_width > self.max_row_width):
                break
            batch.append(self.pending.pop(0)[1])
            prompt_width, canvas_blocks = new_prompt, new_canvas
        for request in batch:
            request.canvas_blocks = canvas_blocks
        return batch

    # -- results ----------------------------------------------------------------------------------
    def update(self, output: RunnerOutput) -> SchedulerUpdate:
        """Apply a step's results (keyed by request id): each completed block's new output tokens,
        and the requests that leave now."""
        by_id = {request.request_id: request for request in self.running}
        new_token_ids: dict[str, list[int]] = {}
        for request_id, result in output.rows.items():
            request = by_id[request_id]
            request.between_blocks = False  # it ran this step, so it was inside a block
            if result.denoised:  # an anchored row's store or verify is no denoising step of its block
                request.step_in_block += 1
            request.num_steps += request.adds_to_output  # a static row past its EOS: waste
            if result.block_complete:
                new_token_ids[request_id] = request.complete_block(result.block_tokens, result.stop_index,
                                                                   result.block_logprobs)
        leaving = self.policy.leaving(self)
        leaving_ids = {id(request) for request in leaving}
        self.running = [request for request in self.running if id(request) not in leaving_ids]
        for request in leaving:
            request.status = self._final_status(request)
        return SchedulerUpdate(new_token_ids=new_token_ids, finished=leaving)

    @staticmethod
    def _final_status(request: Request) -> RequestStatus:
        if request.abort_requested:
            return RequestStatus.FINISHED_ABORT
        if request.stopped_at_eos and request.stop_block < request.cap_blocks:  # a stop past its cap: "length"
            return RequestStatus.FINISHED_EOS
        return RequestStatus.FINISHED_LENGTH
