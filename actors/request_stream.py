"""One request as its caller sees it: a future for its output and, with an event loop, its block events.

The engine loop's thread pushes; the caller awaits ``result`` (any thread) or iterates the stream on the
event loop it submitted from (Serve's streaming responses).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from engine import RequestOutput


@dataclass(frozen=True)
class BlockEvent:
    token_ids: list[int]  # what this block added to the request's output
    output: RequestOutput | None = None  # set on the request's last event


@dataclass(eq=False)
class RequestStream:
    """One request as its caller sees it: ``result`` resolves to its RequestOutput; with an event loop,
    ``async for event in stream`` also yields one event per block."""

    request_id: str
    arrival_time: float
    event_loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    first_scheduled_time: float | None = None  # when the engine admitted it into a row (its own clock)
    first_block_time: float | None = None  # end of the step that completed its first block
    num_blocks: int = 0
    result: Future = field(default_factory=Future, repr=False)
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)

    def _push(self, item: BlockEvent | BaseException) -> None:  # called from the loop thread
        if isinstance(item, BaseException):
            if not self.result.done():
                self.result.set_exception(item)
        elif item.output is not None and not self.result.done():
            self.result.set_result(item.output)
        if self.event_loop is None:
            return
        try:
            self.event_loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
            pass

    async def __aiter__(self) -> AsyncIterator[BlockEvent]:
        if self.event_loop is None:
            raise RuntimeError("this request was submitted with stream=False: await its result instead")
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.output is not None:
                return
