"""The batch actor's engine loop: one thread owns the engine and steps it while work is unfinished.

Callers on any thread (in practice: the async ``__call__`` of several in-flight Ray Data batches) hand
requests in with :meth:`EngineLoop.submit` and get a ``concurrent.futures.Future`` back. The loop thread
is the only one that touches the engine: between two engine steps it moves every queued submission into
the engine, so rows of a batch that arrived while a cycle ran join at the next block boundary, next to
rows of older batches. A batch boundary is therefore invisible to the engine (no drain-and-refill bubble)::

    batch A rows ──┐                       ┌─> A's futures resolve as A's rows finish
    batch B rows ──┼─> inbox ─> [engine.step() ... engine.step()] ─┤
    batch C rows ──┘   (drained at each block boundary)   └─> B's, C's futures ...
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from engine import BlockServeEngine, EngineStats, RequestOutput, SamplingParams
from engine.prompts import Prompt

logger = logging.getLogger(__name__)

_STOP = object()


@dataclass
class _Submission:
    prompt: Prompt
    params: SamplingParams
    future: Future


class EngineLoop:
    """Steps ``engine`` on a daemon thread; ``after_step`` runs on that thread after every cycle."""

    def __init__(self, engine: BlockServeEngine, after_step: Callable[[], None] | None = None):
        self.engine = engine
        self.after_step = after_step
        self.stats: EngineStats = engine.stats()  # refreshed by the loop thread after each cycle
        self.first_submit_time: float | None = None
        self.last_finish_time: float | None = None
        self.idle_s = 0.0  # time the engine sat empty between its first submission and later ones
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._futures: dict[str, Future] = {}
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="blockserve-engine-loop", daemon=True)
        self._thread.start()

    def submit(self, prompt: Prompt, params: SamplingParams) -> Future:
        """Queue one request; the future resolves to its RequestOutput (bad input: finish_reason "error")."""
        future: Future = Future()
        if self._failure is not None:
            future.set_exception(RuntimeError(f"engine loop has stopped: {self._failure!r}"))
            return future
        if self.first_submit_time is None:
            self.first_submit_time = time.time()
        self._inbox.put(_Submission(prompt, params, future))
        return future

    @property
    def active_s(self) -> float:
        """Wall time from the first submission to the latest finished request."""
        if self.first_submit_time is None or self.last_finish_time is None:
            return 0.0
        return self.last_finish_time - self.first_submit_time

    def close(self, wait: bool = True) -> None:
        """Stop the loop thread once the current cycle ends (requests still queued are dropped)."""
        self._inbox.put(_STOP)
        if wait:
            self._thread.join(timeout=30)

    # -- the loop thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._admit(block=not self.engine.has_unfinished_requests()):
                finished = self.engine.step()
                self.stats = self.engine.stats()
                self._resolve(finished)
                if self.after_step is not None:
                    self.after_step()
        except BaseException as error:  # a broken engine fails every waiting caller instead of hanging them
            logger.exception("engine loop failed")
            self._failure = error
            for future in self._futures.values():
                future.set_exception(error)
            self._futures.clear()
            self._drain_inbox_with(error)

    def _admit(self, block: bool) -> bool:
        """Move queued submissions into the engine (waiting for one if idle); False means stop."""
        waited_from = time.time()
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return True
        if block and self.first_submit_time is not None and item is not _STOP:
            gap = time.time() - max(waited_from, self.first_submit_time)
            self.idle_s += max(gap, 0.0)  # the engine ran dry between batches: a bubble
        while item is not None:
            if item is _STOP:
                return False
            self._add(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                item = None
        return True

    def _add(self, submission: _Submission) -> None:
        try:
            request_id = self.engine.add_request(submission.prompt, submission.params)
        except Exception as error:  # add_request reports bad input itself; this is a last resort
            submission.future.set_exception(error)
            return
        self._futures[request_id] = submission.future

    def _resolve(self, finished: list[RequestOutput]) -> None:
        if finished:
            self.last_finish_time = time.time()
        for output in finished:
            future = self._futures.pop(output.request_id, None)
            if future is not None:
                future.set_result(output)

    def _drain_inbox_with(self, error: BaseException) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                item.future.set_exception(error)
