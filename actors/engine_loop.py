"""The one engine driver: an engine stepped by a background thread, for Ray Data batches and Serve alike.

    callers (any thread)                         loop thread (the only one that touches the engine)
    submit() / abort() ──> inbox ─────────────>  between two steps: apply adds and aborts,
    RequestStream.result  <── Future ──────────  step(), then one BlockEvent per row of the step
    async for ... in RequestStream <── asyncio   (streamed to the caller's event loop when asked)

A request submitted while a step runs waits in the inbox and joins at the next step, next to rows of
older submissions, so a Ray Data batch boundary is invisible to the engine (no drain-and-refill bubble).
Every request has a ``result`` future (the batch actor awaits those); Serve streams its events too.
Stall detection (``health_problem``), backpressure (``max_pending``, None for unbounded) and the busy /
idle accounting serve both. A step that raises (a CUDA error) ends the loop: its requests fail with
:class:`EngineDeadError` and ``health_problem`` says why (Serve's health check replaces the replica);
``on_death`` runs first, on the loop thread (a Ray Data actor ends its process there, so that Ray
restarts it and retries its batches). The engine says when its next step may run
(``BlockServeEngine.wait_s``): a ``static`` schedule with ``static_batch_timeout_s`` holds a batch back
until it is full or its oldest request has waited that long, and the loop sleeps meanwhile.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from actors.request_stream import BlockEvent, RequestStream
from engine import BlockServeEngine, EngineStats, RequestOutput, SamplingParams
from engine.models.prompts import Prompt
from engine.scheduling.outputs import StepReport

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.5  # an idle loop still wakes this often, so a silent loop means a stuck one


class QueueFullError(RuntimeError):
    """The pending queue is at its cap: the caller should retry later (HTTP 429)."""


class EngineDeadError(RuntimeError):
    """The loop thread has died or is shutting down: nothing will be served (HTTP 503)."""


@dataclass(frozen=True)
class StepSummary:
    """What one engine step did, for metrics (data only; built on the loop thread)."""

    num_waiting: int
    num_running: int
    step: StepReport
    stats: EngineStats
    finished: list[tuple[RequestStream, RequestOutput]]


@dataclass(frozen=True)
class AddRequest:  # inbox command: join the engine at the next step
    request_id: str
    prompt: Prompt
    params: SamplingParams
    arrival_time: float  # the submission: where the request's queue time starts (engine and stream alike)


@dataclass(frozen=True)
class AbortRequest:  # inbox command: drop it (a running row leaves at the next block boundary)
    request_id: str


class EngineLoop:
    def __init__(self, engine: BlockServeEngine, *, max_pending: int | None = 64,
                 stall_timeout_s: float = 120.0, on_step: Callable[[StepSummary], None] | None = None,
                 on_death: Callable[[BaseException], None] | None = None):
        if max_pending is not None and max_pending < 1:
            raise ValueError(f"max_pending must be >= 1 or None (unbounded), got {max_pending}")
        self.engine = engine
        self.max_pending = max_pending
        self.stall_timeout_s = stall_timeout_s
        self.on_step = on_step
        self.on_death = on_death
        self._wakeup = threading.Condition()  # guards everything below that both threads touch
        self._inbox: deque[AddRequest | AbortRequest] = deque()
        self._streams: dict[str, RequestStream] = {}
        self._waiting: dict[str, float] = {}  # submitted, not yet admitted into a row: id -> arrival
        self._num_running = 0
        self._stopping = False
        self._failure: BaseException | None = None
        self._heartbeat = time.monotonic()
        self.stats: EngineStats = engine.stats()  # refreshed by the loop thread after each step
        self.first_submit_time: float | None = None
        self.last_finish_time: float | None = None
        self.idle_s = 0.0  # time the engine sat empty between its first submission and later ones
        self._idle_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="blockserve-engine-loop", daemon=True)

    # -- the caller's side (event-loop thread) -----------------------------------------------------
    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def submit(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, *,
               stream: bool = True) -> RequestStream:
        """Queue a request for the next step; raises QueueFullError / EngineDeadError.

        ``stream=True`` (Serve) needs a running event loop and delivers one event per block to it;
        ``stream=False`` (batches, any thread) only resolves ``result``."""
        request_id = request_id if request_id is not None else f"req-{uuid.uuid4().hex}"
        event_loop = asyncio.get_running_loop() if stream else None
        with self._wakeup:
            if self._failure is not None or self._stopping:
                raise EngineDeadError(self.health_problem() or "engine loop is shutting down")
            if self.max_pending is not None and len(self._waiting) >= self.max_pending:
                raise QueueFullError(f"{len(self._waiting)} requests are already waiting "
                                     f"(max_pending={self.max_pending})")
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            stream = RequestStream(request_id, time.time(), event_loop)
            if self.first_submit_time is None:
                self.first_submit_time = stream.arrival_time
            self._streams[request_id] = stream
            self._waiting[request_id] = stream.arrival_time
            self._inbox.append(AddRequest(request_id, prompt, params, stream.arrival_time))
            self._wakeup.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """Drop a request: a waiting one leaves at once, a running one at the next block boundary."""
        with self._wakeup:
            self._inbox.append(AbortRequest(request_id))
            self._wakeup.notify()

    @property
    def active_s(self) -> float:
        """Wall time from the first submission to the latest finished request."""
        if self.first_submit_time is None or self.last_finish_time is None:
            return 0.0
        return self.last_finish_time - self.first_submit_time

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return self._num_running

    @property
    def failure(self) -> BaseException | None:
        """The error that ended the loop (set before ``on_death`` runs), or None."""
        return self._failure

    def health_problem(self) -> str | None:
        """None when healthy; otherwise why the loop cannot serve (dead thread, or stuck in a step)."""
        if self._failure is not None:
            return f"engine loop died: {type(self._failure).__name__}: {self._failure}"
        if not self._thread.is_alive():
            return "engine loop thread is not running"
        silent_s = time.monotonic() - self._heartbeat
        if silent_s > self.stall_timeout_s:
            return (f"engine loop has not completed an engine step in {silent_s:.0f} s "
                    f"(stall_timeout_s={self.stall_timeout_s})")
        return None

    def stop(self, timeout_s: float | None = 10.0) -> None:
        """Stop after the current step; requests still queued or running fail with EngineDeadError."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the loop thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._apply_inbox()
                wait_s = self._wait_before_step()
                if wait_s > 0:
                    with self._wakeup:
                        if not self._inbox and not self._stopping:
                            self._wakeup.wait(min(wait_s, HEARTBEAT_S))
                else:
                    self._step()
                self._heartbeat = time.monotonic()
            self._fail_streams(EngineDeadError("engine loop is shutting down"))
        except BaseException as error:  # the replica must report unhealthy, not hang its callers
            logger.exception("engine loop died")
            self._failure = error
            if self.on_death is not None:
                try:
                    self.on_death(error)
                except Exception:  # the callers must still hear of the death
                    logger.exception("on_death callback failed")
            self._fail_streams(EngineDeadError(f"engine loop died: {type(error).__name__}: {error}"))

    def _apply_inbox(self) -> None:
        with self._wakeup:
            commands, self._inbox = self._inbox, deque()
        for command in commands:
            if isinstance(command, AbortRequest):
                self.engine.abort_request(command.request_id)
                continue
            self._end_idle()
            try:
                self.engine.add_request(command.prompt, command.params, request_id=command.request_id,
                                        arrival_time=command.arrival_time)
            except Exception as error:  # bad input finishes as "error" itself; this is a last resort
                with self._wakeup:
                    self._waiting.pop(command.request_id, None)
                    stream = self._streams.pop(command.request_id, None)
                if stream is not None:
                    stream._push(error)

    def _end_idle(self) -> None:
        if self._idle_since is not None:
            self.idle_s += time.time() - self._idle_since  # the engine ran dry: a bubble
            self._idle_since = None

    def _wait_before_step(self) -> float:
        """Seconds to wait before the next step: idle, or the engine holding its step back."""
        if not self.engine.has_unfinished_requests():
            if self._idle_since is None and self.first_submit_time is not None:
                self._idle_since = time.time()
            return HEARTBEAT_S
        return self.engine.wait_s(time.time())

    def _step(self) -> None:
        report = self.engine.step()
        finished = {output.request_id: output for output in report.finished}
        ended = time.time()
        self.stats = self.engine.stats()
        if finished:
            self.last_finish_time = ended
        touched = list(dict.fromkeys([*report.admitted, *report.new_token_ids, *finished]))
        with self._wakeup:
            for request_id in touched:
                self._waiting.pop(request_id, None)
            streams = [(self._streams.pop(request_id, None) if request_id in finished
                        else self._streams.get(request_id), request_id) for request_id in touched]
            self._num_running = self.engine.num_running
            num_waiting = len(self._waiting)
        done: list[tuple[RequestStream, RequestOutput]] = []
        for stream, request_id in streams:
            if stream is None:
                continue
            output = finished.get(request_id)
            if request_id in report.admitted:
                stream.first_scheduled_time = report.scheduled_time  # the engine's own clock
            if request_id in report.new_token_ids:
                stream.num_blocks += 1
                if stream.first_block_time is None:
                    stream.first_block_time = output.finish_time if output is not None else ended
            if request_id not in report.new_token_ids and output is None:
                continue  # admitted, nothing committed yet
            stream._push(BlockEvent(report.new_token_ids.get(request_id, []), output))
            if output is not None:
                done.append((stream, output))
        if self.on_step is not None:
            summary = StepSummary(num_waiting=num_waiting, num_running=self._num_running, step=report,
                                  stats=self.stats, finished=done)
            try:
                self.on_step(summary)
            except Exception:  # a metrics bug must not take the engine down
                logger.exception("on_step callback failed")

    def _fail_streams(self, error: EngineDeadError) -> None:
        with self._wakeup:
            streams, self._streams = list(self._streams.values()), {}
            self._waiting.clear()
        for stream in streams:
            stream._push(error)
