"""The runner: runs one step of the scheduled rows and owns their state between steps. No policy.

Every step kind runs here. The runner gives a joining row its slot and its prompt's cached pages, and takes
both back when the row leaves; one sampler turns every kind's logits into tokens. A step kind's module
(``engine.runner.interface``) holds the rest of its rows' device state and runs the step: one forward of
every row's span, each span planned by the row's rule and read back by it. Results return keyed by request
id; the scheduler alone decides who runs.
"""
from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.models.loader import DiffusionLM
from engine.rules.base import DecodingRule
from engine.runner.interface import StepRows, step_rows_class
from engine.runner.prefix_cache import PrefixCache, pool_pages
from engine.runner.sampler import Sampler
from engine.runner.slots import SlotAllocator
from engine.scheduling.outputs import RunnerOutput, SchedulerOutput
from engine.scheduling.request import Request


class Runner:
    """The slots, prefix cache and sampler of one model's rows, and the step kind's module that runs them."""

    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int, rule: DecodingRule):
        self.slots: SlotAllocator[Request] = SlotAllocator(config.max_batch_size)
        mask_id = lm.special_ids.mask_id if rule.excludes_mask else None
        self.sampler = Sampler(mask_id, rule.measure)
        self.rows: StepRows = step_rows_class(lm.layout.step_kind)(lm, config, max_row_width, rule, self.slots,
                                                                   self.sampler)
        cache, page_length = self.rows.cache, self.rows.page_length
        self.prefix_cache = (PrefixCache(cache, pool_pages(config, max_row_width, page_length), page_length)
                             if config.enable_prefix_caching and cache is not None else None)

    @property
    def rule(self) -> DecodingRule:
        """The rule its rows decode with: it plans every row's span and reads it back."""
        return self.rows.rule

    @rule.setter
    def rule(self, rule: DecodingRule) -> None:
        self.rows.rule = rule

    @property
    def rows_per_chunk(self) -> int | None:
        """Rows whose vocabulary-sized temporaries a step holds at once (None: every row's)."""
        return self.rows.rows_per_chunk

    @torch.no_grad()
    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        """Admit the joining rows, then run every scheduled row for one step."""
        self._admit(scheduled.admitted)
        if not scheduled.num_rows:
            return RunnerOutput(rows={}, model_time_s=0.0)
        return self.rows.run(scheduled, self.prefix_cache)

    def release(self, finished: list[Request]) -> None:
        """The rows that left give their slots back at once, so an idle engine holds no row."""
        self.rows.release(finished, self.prefix_cache)
        for request in finished:
            if request.slot is not None:
                self.slots.give_back(request.slot)
                request.slot = None

    def _admit(self, admitted: list[Request]) -> None:
        """Joining rows take the lowest free slots and their prompts' cached pages; then their whole prompt
        pages are claimed, once every one of them has reused its run."""
        for request in admitted:
            request.slot = self.slots.take(request)
            cached = (self.prefix_cache.reuse(request, request.slot, self.rows.reusable_pages(request))
                      if self.prefix_cache is not None else 0)
            self.rows.admit(request, cached)
        if self.prefix_cache is not None and admitted:
            self.rows.claim_prompts(self.prefix_cache, admitted)
