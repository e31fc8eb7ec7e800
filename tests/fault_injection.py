"""Fault injection as a test wrapper around the production actor (not an option of it).

``FailAfterRows`` fails the first batch that starts once ``fail_after_rows`` rows were returned (those
get written): ``"crash"`` ends the process of the actor's first incarnation (Ray restarts it and
retries the batch), ``"error"`` raises (the job fails). The pipeline tests select it with
``actors.actor_class=tests.fault_injection.FailAfterRows``.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Literal

from actors.block_serve_actor import BlockServeActor

logger = logging.getLogger(__name__)


class FailAfterRows(BlockServeActor):
    def __init__(self, *, fail_after_rows: int, fail_mode: Literal["crash", "error"] = "crash", **kwargs: Any):
        if fail_mode not in ("crash", "error"):
            raise ValueError(f"fail_mode must be 'crash' or 'error', got {fail_mode!r}")
        super().__init__(**kwargs)
        self.fail_after_rows, self.fail_mode = fail_after_rows, fail_mode

    async def generate_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.stats.rows >= self.fail_after_rows:
            if self.fail_mode == "error":
                raise RuntimeError(f"injected failure after {self.stats.rows} rows (fail_after_rows)")
            if not self.restarted and self.in_ray_actor:
                logger.error("injected crash after %d rows (fail_after_rows)", self.stats.rows)
                os._exit(1)
        return await super().generate_rows(rows)
