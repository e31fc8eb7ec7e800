"""Replay the engine's own scheduler without a model, for workloads whose length is known in advance.

With ``stop_at_eos=False`` every request runs exactly its block cap, so which rows share each block
cycle does not depend on what the model writes: the schedule (rows per cycle, bounding boxes) can be
computed by the real :class:`engine.scheduler.Scheduler` alone, in milliseconds, for any token budget.
The GPU script uses it to find the largest batch a memory budget allows.
"""
from __future__ import annotations

from engine import EngineConfig, SamplingParams
from engine.request import Request
from engine.scheduler import Scheduler


def simulate_schedule(prompt_lengths: list[int], max_new_tokens: list[int], config: EngineConfig,
                      token_budget: int) -> dict:
    """Rows and boxes of every block cycle when each request runs to its cap (no early stop)."""
    scheduler = Scheduler(config, token_budget)
    for number, (prompt_length, cap) in enumerate(zip(prompt_lengths, max_new_tokens)):
        request = Request(request_id=str(number), prompt_token_ids=[0] * prompt_length,
                          params=SamplingParams(max_new_tokens=cap, stop_at_eos=False),
                          block_length=config.block_length, arrival_time=0.0, sequence_number=number)
        request.cap_blocks = request.canvas_blocks = -(-cap // config.block_length)
        if request.own_width > token_budget:
            raise ValueError(f"request {number} ({request.own_width} tokens) never fits {token_budget}")
        scheduler.add(request)
    rows_per_cycle, boxes = [], []
    while scheduler.has_work():
        rows = scheduler.schedule(0.0).rows
        rows_per_cycle.append(len(rows))
        boxes.append(len(rows) * max(request.width for request in rows))
        scheduler.finish_boundary([False] * len(rows))
    return {"cycles": len(rows_per_cycle), "peak_rows": max(rows_per_cycle),
            "mean_rows": sum(rows_per_cycle) / len(rows_per_cycle), "peak_box": max(boxes),
            "row_cycles": sum(rows_per_cycle)}
