"""Replay the engine's own scheduler without a model, for workloads whose length is known in advance.

With ``stop_at_eos=False`` and a fixed number of steps per block (``quota`` decoding), which rows share
each step does not depend on what the model writes: the schedule (rows per step, bounding boxes) can be
computed by the real :class:`engine.scheduler.Scheduler` fed hand-made runner results, in
milliseconds, for any token budget. The GPU script uses it to find the largest batch a memory budget
allows.
"""
from __future__ import annotations

import dataclasses

from engine import EngineConfig, SamplingParams
from engine.config import DEFAULT_BLOCK_LENGTH, blocks_needed
from engine.outputs import RowResult, RunnerOutput
from engine.request import Request
from engine.scheduler import Scheduler


def simulate_schedule(prompt_lengths: list[int], max_new_tokens: list[int], config: EngineConfig,
                      token_budget: int, max_row_width: int | None = None) -> dict:
    """Rows and boxes of every step when each request runs to its cap and every block takes
    ``steps_per_block`` steps (``block_length`` without a cap: one token a step, the worst case). An
    unset ``block_length`` is a full-attention model's default, as the engine settles it."""
    config = dataclasses.replace(config, block_length=config.block_length or DEFAULT_BLOCK_LENGTH)
    max_row_width = max_row_width or token_budget
    scheduler = Scheduler(config, token_budget, max_row_width)
    for number, (prompt_length, cap) in enumerate(zip(prompt_lengths, max_new_tokens)):
        request = Request(request_id=str(number), prompt_token_ids=[0] * prompt_length,
                          params=SamplingParams(max_new_tokens=cap, stop_at_eos=False),
                          block_length=config.block_length, arrival_time=0.0, sequence_number=number)
        request.cap_blocks = request.canvas_blocks = blocks_needed(cap, config.block_length)
        if request.own_width > min(token_budget, max_row_width):
            raise ValueError(f"request {number} ({request.own_width} tokens) never fits {token_budget}")
        scheduler.add(request)
    steps_per_block = config.steps_per_block or config.block_length
    block = [0] * config.block_length
    rows_per_step, boxes = [], []
    while scheduler.has_work():
        scheduled = scheduler.schedule(0.0)
        rows = scheduled.refresh + scheduled.window
        rows_per_step.append(len(rows))
        boxes.append(len(rows) * max(request.width for request in rows))
        complete = {r.request_id: r.step_in_block + 1 >= steps_per_block for r in rows}
        scheduler.update(RunnerOutput(rows={request_id: RowResult(done, None, block if done else None)
                                            for request_id, done in complete.items()}, model_time_s=0.0))
    return {"steps": len(rows_per_step), "peak_rows": max(rows_per_step),
            "mean_rows": sum(rows_per_step) / len(rows_per_step), "peak_box": max(boxes),
            "row_steps": sum(rows_per_step)}
