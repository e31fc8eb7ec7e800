"""The data passed between scheduler, runner and engine in one step, and the chain it follows.

    SchedulerOutput -> StepBatch{RefreshPart, WindowPart} -> StepPlan{PartPlan}
        -> RunnerOutput{RowResult} -> SchedulerUpdate -> StepReport -> BlockEvent / StepSummary

- SchedulerOutput is built by ``Scheduler.schedule`` and read by a runner's ``execute``
  (``engine.runner.interface``). It lists the running ``Request`` objects of this step, so it lives on
  the host and is not a copy.
- StepBatch is built by ``engine.runner.batch_inputs.prepare_inputs`` from the runner's ``PersistentBatch``.
  The runner reads it. Its tensors are on the device; its request ids and counts are on the host.
- RefreshPart and WindowPart (``engine.models.step_inputs``) are the StepBatch's two parts, read by the
  transformer. They are device tensors with a few host tuples for the per-row attention.
- StepPlan and PartPlan (``engine.models.packed_step``) are built by the transformer once per forward
  and read by every layer: masks, write indices and rotary tables, on the device.
- RunnerOutput and its RowResults are built by a runner's ``execute`` after its one host sync, from
  what the decoding rule decided (``engine.rules``). The scheduler reads them; they are host data keyed by
  request id.
- SchedulerUpdate is built by ``Scheduler.update`` and read by the engine: new tokens and leavers.
- StepReport is built by ``BlockServeEngine.step`` and read by its callers. It is host data only.
- BlockEvent (``actors.request_stream``) and StepSummary (``actors.engine_loop``) are built from a
  StepReport by the serving loop, for streams and metrics.

This module imports neither torch nor the runner, so the scheduler stays a pure-Python policy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.scheduling.request import Request, RequestOutput, TokenLogprob
from engine.scheduling.trace import ForwardRecord


@dataclass
class SchedulerOutput:
    """What runs at the next step. The requests are the scheduler's own live objects, not copies."""

    starting: list[Request] = field(default_factory=list)  # rows starting a block (admitted ones too)
    continuing: list[Request] = field(default_factory=list)  # rows continuing their block
    admitted: list[Request] = field(default_factory=list)  # rows that need a slot before this step

    @property
    def num_rows(self) -> int:
        return len(self.starting) + len(self.continuing)


@dataclass(frozen=True)
class RowResult:
    """What a step did to one row."""

    block_complete: bool  # its rule made the block final: it leaves the row's active block
    stop_index: int | None  # the completed block's first stop token (None: none, or not complete)
    block_tokens: list[int] | None  # the completed block; None while it is not final
    block_logprobs: list[TokenLogprob] | None = None  # the completed block's, if its request asked
    counters: dict[str, int] = field(default_factory=dict)  # the rule's counts of this row's step, by name
    denoised: bool = True  # the step denoised or drafted its active block; False: an anchored row's store or
    # verify span, which ``Request.step_in_block`` does not count


@dataclass(frozen=True)
class RunnerOutput:
    """What the runner's ``execute`` returned, keyed by request id."""

    rows: dict[str, RowResult]
    model_time_s: float  # the step's forward and decoding rule (a block row's input building is host overhead)
    record: ForwardRecord = ForwardRecord()  # the forward's shape (all zeros when no row ran)


@dataclass(frozen=True)
class SchedulerUpdate:
    """What a step's results did to its requests."""

    new_token_ids: dict[str, list[int]]  # request id -> what its just-completed block added to its
    # own output (up to a stop token; empty past one or its block cap)
    finished: list[Request]  # the requests that leave now, their output_token_ids final


@dataclass(frozen=True)
class StepReport:
    """What one ``step()`` did: its finished requests, and what each completed block added and who
    joined, for streaming and monitoring."""

    finished: list[RequestOutput] = field(default_factory=list)  # finished at its end (and any
    # rejected or aborted while pending)
    new_token_ids: dict[str, list[int]] = field(default_factory=dict)  # request id -> tokens its
    # just-completed block added to its output (up to a stop token; empty past one or its cap)
    admitted: tuple[str, ...] = ()  # request ids that joined at this step
    scheduled_time: float = 0.0  # when it admitted them: their first_scheduled_time (the queue clock)
    num_rows: int = 0
    bounding_box_tokens: int = 0
