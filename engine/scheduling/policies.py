"""The schedules: one small policy object each, chosen once from ``EngineConfig.schedule``.

A row whose block is final sits *between blocks*. What happens to it depends on the schedule:

* ``continuous`` (ours): at the very next step it leaves (stop token committed, cap reached, aborted)
  or starts its next block, while the other rows continue theirs. Pending requests join at every step.
* ``block_sync`` (BlockServe, the paper): a row between blocks waits, computing nothing, until every
  row is between blocks (the block boundary). Then finished rows leave, pending requests join, and
  every row starts its next block together.
* ``shrink`` (Fast-dLLM v2, dInfer): as ``block_sync``, but nobody joins until the batch is empty. The
  rows share one canvas, the batch's largest.
* ``static`` (Fast-dLLM): one shared canvas; rows walk every block in lock-step, and nobody leaves or
  joins until the whole batch is done. Outputs are trimmed at EOS afterwards. With
  ``static_batch_timeout_s`` set, a batch starts only when it is full or its oldest request has waited
  that long (the classic static batcher).

``continuous`` and ``block_sync`` admit by the token budget (``Scheduler.admit_into_box``); ``shrink``
and ``static`` admit a fresh batch on one canvas (``Scheduler.admit_fresh_batch``).
"""
from __future__ import annotations

from typing import Protocol

from engine.config import EngineConfig
from engine.scheduling.request import Request


class SchedulerState(Protocol):
    """What a policy reads from the scheduler and asks of it."""

    pending: list[tuple[tuple[int, int], Request]]
    running: list[Request]

    @property
    def at_block_boundary(self) -> bool: ...

    def admit_into_box(self, now: float) -> list[Request]: ...

    def admit_fresh_batch(self) -> list[Request]: ...


class Policy(Protocol):
    admits_every_step: bool  # so a request may wait one step for a prefix that a row joining computes

    def queue_key(self, request: Request) -> tuple[int, int]: ...

    def admit(self, state: SchedulerState, now: float) -> list[Request]: ...

    def starts_blocks(self, state: SchedulerState) -> bool: ...

    def leaving(self, state: SchedulerState) -> list[Request]: ...

    def wait_s(self, state: SchedulerState, now: float) -> float: ...


class Continuous:
    """Rows advance on their own; admission at every step."""

    admits_every_step = True

    def __init__(self, config: EngineConfig):
        self.sort_pending = config.sort_pending

    def queue_key(self, request: Request) -> tuple[int, int]:
        return (request.prompt_length if self.sort_pending else 0, request.sequence_number)

    def admit(self, state: SchedulerState, now: float) -> list[Request]:
        return state.admit_into_box(now)

    def starts_blocks(self, state: SchedulerState) -> bool:
        return True

    def leaving(self, state: SchedulerState) -> list[Request]:
        return [r for r in state.running if r.between_blocks and not r.needs_more_blocks]

    def wait_s(self, state: SchedulerState, now: float) -> float:
        return 0.0


class BlockSync(Continuous):
    """Rows join, leave and start blocks together, at block boundaries."""

    admits_every_step = False

    def admit(self, state: SchedulerState, now: float) -> list[Request]:
        return state.admit_into_box(now) if state.at_block_boundary else []

    def starts_blocks(self, state: SchedulerState) -> bool:
        return state.at_block_boundary

    def leaving(self, state: SchedulerState) -> list[Request]:
        if not state.running or not state.at_block_boundary:
            return []
        return [r for r in state.running if not r.needs_more_blocks]


class Shrink(BlockSync):
    """As BlockSync, but a new batch joins only once the last one has left."""

    def admit(self, state: SchedulerState, now: float) -> list[Request]:
        return [] if state.running else state.admit_fresh_batch()


class Static(BlockSync):
    """One batch runs every block of its shared canvas before anyone leaves or joins."""

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.max_batch_size = config.max_batch_size
        self.batch_timeout_s = config.static_batch_timeout_s

    def queue_key(self, request: Request) -> tuple[int, int]:
        return (0, request.sequence_number)

    def admit(self, state: SchedulerState, now: float) -> list[Request]:
        if state.running or self.wait_s(state, now) > 0:
            return []
        return state.admit_fresh_batch()

    def leaving(self, state: SchedulerState) -> list[Request]:
        if not state.running or not state.at_block_boundary:
            return []
        batch_done = all(request.block_index >= request.canvas_blocks for request in state.running)
        return [r for r in state.running if batch_done or r.abort_requested]

    def wait_s(self, state: SchedulerState, now: float) -> float:
        """Seconds until the next batch may start: positive only while an idle engine collects one."""
        collecting = (self.batch_timeout_s is not None and not state.running
                      and 0 < len(state.pending) < self.max_batch_size)
        if not collecting:
            return 0.0
        oldest = min(request.arrival_time for _, request in state.pending)
        return oldest + self.batch_timeout_s - now


POLICIES: dict[str, type[Continuous]] = {"continuous": Continuous, "block_sync": BlockSync,
                                         "static": Static, "shrink": Shrink}


def make_policy(config: EngineConfig) -> Policy:
    """The policy of ``config.schedule``: the one place that reads it."""
    return POLICIES[config.schedule](config)
