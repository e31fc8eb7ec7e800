"""Runs one step of span rows and owns their state: Nemotron-Labs-Diffusion's anchored rows and DiffusionGemma's
canvases. No policy.

Every row runs its spans after its stored context each step, whatever the others do, in one forward of its
model (``run_spans``). Its rule plans them (``engine.rules.spans``); the runner carries the plan out and
asks the rule to read the step back. The rows of a model share one kind, whose side of the step is a module:

* an **anchored** row (``engine.runner.anchored_rows``) runs one span: a causal store of its pending tokens,
  a denoised or drafted block, or a verified draft. It reads logits at its rule's offsets through the sampler;
* a **canvas** row (``engine.runner.canvas_rows``) stores its pending context (the prompt, then each committed
  canvas) and denoises its canvas in the same forward. Its rule runs the head over chunks of rows and draws
  from the row's own generator.

With prefix caching a joining row starts from its prompt's cached pages (``prefix_cache``).
"""
from __future__ import annotations

import time

import torch

from engine.config import EngineConfig
from engine.models.loader import DiffusionLM
from engine.rules.base import DecodingRule
from engine.runner.anchored_rows import AnchoredRows
from engine.runner.canvas_rows import CanvasRows
from engine.runner.prefix_cache import PAGE_LENGTH, PrefixCache, pool_pages
from engine.runner.slots import SlotAllocator
from engine.runner.span_rows import Span, SpanRow, SpanRows
from engine.scheduling.outputs import RunnerOutput, SchedulerOutput
from engine.scheduling.request import Request


class SpanRunner:
    """Runs the span rows of one model: slots, admission and prefix pages here, the rest its row kind's."""

    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int, rule: DecodingRule):
        kind = CanvasRows if lm.layout.decodes_canvases else AnchoredRows
        self.kind: SpanRows = kind(lm, config, max_row_width, rule)
        self.cache = self.kind.cache  # every layer's keys and values of every slot, as the row kind's model needs
        self.prefix_cache = (PrefixCache(self.cache, pool_pages(config, max_row_width, PAGE_LENGTH), PAGE_LENGTH)
                             if config.enable_prefix_caching else None)
        self.slots: SlotAllocator[str] = SlotAllocator(config.max_batch_size)
        self.rows: dict[str, SpanRow] = {}

    @property
    def rule(self) -> DecodingRule:
        """The rule its rows decode with: its row kind's, which plans and reads every span."""
        return self.kind.rule

    @rule.setter
    def rule(self, rule: DecodingRule) -> None:
        self.kind.rule = rule

    @property
    def rows_per_chunk(self) -> int | None:
        """Rows whose vocabulary-sized temporaries a step holds at once (None: every row's)."""
        return self.kind.rows_per_chunk

    @torch.no_grad()
    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        self._admit(scheduled.admitted)
        requests = [*scheduled.starting, *scheduled.continuing]
        if not requests:
            return RunnerOutput(rows={}, model_time_s=0.0)
        started = time.perf_counter()
        spans = [self._span(request) for request in requests]
        results, record = self.kind.run(spans, self.prefix_cache)
        return RunnerOutput(rows=results, model_time_s=time.perf_counter() - started, record=record)

    def release(self, finished: list[Request]) -> None:
        for request in finished:
            row = self.rows.pop(request.request_id, None)
            if row is not None:
                self.slots.give_back(row.slot)

    def _admit(self, admitted: list[Request]) -> None:
        """Joining rows take a slot, their prompt's cached pages and their rule's state."""
        for request in admitted:
            slot = self.slots.take(request.request_id)
            cached = (self.prefix_cache.reuse(request, slot, self.kind.reusable_pages(request.prompt_length))
                      if self.prefix_cache is not None else 0)
            row = SpanRow(slot, request.params.max_new_tokens, pending=list(request.prompt_token_ids[cached:]),
                          context=cached)
            self.kind.admit(request, row)
            self.rows[request.request_id] = row
        if self.prefix_cache is not None and admitted:
            rows = [self.rows[request.request_id] for request in admitted]
            self.kind.claim_prompts(self.prefix_cache, admitted, rows)

    def _span(self, request: Request) -> Span:
        row = self.rows[request.request_id]
        plan = self.kind.plan(row)
        return Span(request, row, plan, row.pending if plan.kind in ("store", "canvas") else row.block)
