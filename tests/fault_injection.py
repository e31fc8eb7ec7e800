"""Fault injection as test wrappers around the production actor (not options of it).

``FailAfterRows`` fails the first batch that starts once ``fail_after_rows`` rows were returned (those
get written): ``"crash"`` ends the process of the actor's first incarnation (Ray restarts it and
retries the batch), ``"engine"`` makes the first incarnation's next engine step raise (the engine loop
dies and the actor ends its process the production way, reporting the cause), ``"error"`` raises (the
job fails). ``ExitOnPrompt`` ends the actor's process whenever a batch holding a given prompt reaches
the engine, on every incarnation: a row that kills its actor every time. ``ExitAtEntry`` does the same
at the entry of its own ``generate_rows`` or ``__call__``, before calling the base class's. Both end it
as ``exit_with`` says: ``"exit"`` (``os._exit``), ``"kill"`` (SIGKILL, as the kernel's out-of-memory
killer does) or, for ``ExitOnPrompt``, ``"engine"`` (the next engine step raises, and the actor ends
its process the production way, reporting the cause). The pipeline tests select them with
``actors.actor_class=tests.fault_injection.<Name>``.
"""
from __future__ import annotations

import logging
import os
import signal
from typing import Any, Literal

from actors.ray_data.batch_rows import Batch, input_rows
from actors.ray_data.block_serve_actor import BlockServeActor

logger = logging.getLogger(__name__)

FAIL_MODES = ("crash", "engine", "error")


class FailAfterRows(BlockServeActor):
    def __init__(self, *, fail_after_rows: int, fail_mode: Literal["crash", "engine", "error"] = "crash",
                 **kwargs: Any):
        if fail_mode not in FAIL_MODES:
            raise ValueError(f"fail_mode must be one of {FAIL_MODES}, got {fail_mode!r}")
        super().__init__(**kwargs)
        self.fail_after_rows, self.fail_mode = fail_after_rows, fail_mode

    async def generate_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.stats.rows >= self.fail_after_rows:
            if self.fail_mode == "error":
                raise RuntimeError(f"injected failure after {self.stats.rows} rows (fail_after_rows)")
            if not self.restarted and self.in_ray_actor:
                if self.fail_mode == "crash":
                    logger.error("injected crash after %d rows (fail_after_rows)", self.stats.rows)
                    os._exit(1)
                fail_next_step(self, f"injected engine fault after {self.stats.rows} rows (fail_after_rows)")
        return await super().generate_rows(rows)


def fail_next_step(actor: BlockServeActor, message: str) -> None:
    """The actor's next engine step raises ``message``: its engine loop dies."""
    def failing_step():
        raise RuntimeError(message)

    actor.engine.step = failing_step


EXIT_WITH = ("exit", "kill", "engine")


def end_process(exit_with: str, why: str) -> None:
    logger.error("injected process %s %s", "kill" if exit_with == "kill" else "exit", why)
    if exit_with == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)


class ExitOnPrompt(BlockServeActor):
    def __init__(self, *, exit_on_prompt: str, exit_with: Literal["exit", "kill", "engine"] = "exit",
                 **kwargs: Any):
        if exit_with not in EXIT_WITH:
            raise ValueError(f"exit_with must be one of {EXIT_WITH}, got {exit_with!r}")
        super().__init__(**kwargs)
        self.exit_on_prompt, self.exit_with = exit_on_prompt, exit_with

    async def _serve(self, rows: list[dict[str, Any]], placement: dict[str, str]) -> list[dict[str, Any]]:
        if self.in_ray_actor and any(row.get("prompt") == self.exit_on_prompt for row in rows):
            if self.exit_with != "engine":
                end_process(self.exit_with, f"on prompt {self.exit_on_prompt!r}")
            fail_next_step(self, f"injected engine fault on prompt {self.exit_on_prompt!r}")
        return await super()._serve(rows, placement)


class ExitAtEntry(BlockServeActor):
    """Ends its process on every incarnation as the first statement of its own ``exit_at`` door
    (``generate_rows`` or ``__call__``) when the batch holds ``exit_on_prompt``."""

    def __init__(self, *, exit_on_prompt: str, exit_at: Literal["generate_rows", "__call__"] = "generate_rows",
                 exit_with: Literal["exit", "kill"] = "exit", **kwargs: Any):
        if exit_at not in ("generate_rows", "__call__"):
            raise ValueError(f"exit_at must be 'generate_rows' or '__call__', got {exit_at!r}")
        if exit_with not in EXIT_WITH[:2]:
            raise ValueError(f"exit_with must be one of {EXIT_WITH[:2]}, got {exit_with!r}")
        super().__init__(**kwargs)
        self.exit_on_prompt, self.exit_at, self.exit_with = exit_on_prompt, exit_at, exit_with

    async def __call__(self, batch: Batch) -> Batch:
        self._exit_on("__call__", input_rows(batch, self.columns))
        return await super().__call__(batch)

    async def generate_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._exit_on("generate_rows", rows)
        return await super().generate_rows(rows)

    def _exit_on(self, door: str, rows: list[dict[str, Any]]) -> None:
        if door == self.exit_at and self.in_ray_actor and any(r.get("prompt") == self.exit_on_prompt for r in rows):
            end_process(self.exit_with, f"at the entry of {door} on prompt {self.exit_on_prompt!r}")
