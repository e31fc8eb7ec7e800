"""Span rows' data: a running row, and one row's span at a step.

The anchored and canvas rows (``engine.runner.anchored_rows``, ``engine.runner.canvas_rows``) keep a ``SpanRow``
per running request and build a ``Span`` per row at each step from its rule's plan.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.rules.base import CanvasRowState
from engine.rules.spans import SpanPlan
from engine.scheduling.outputs import SchedulerOutput
from engine.scheduling.request import Request, TokenLogprob


@dataclass
class SpanRow:
    """A running request's place in the cache, what it stores next and its active block."""

    slot: int
    max_new_tokens: int
    pending: list[int] = field(default_factory=list)  # tokens its next forward stores
    context: int = 0  # positions stored in its cache slot
    pages: tuple[int, ...] = ()  # the prefix cache's pages its next store fills, where its forward fills them
    block: list[int] | None = None  # an anchored row's active block, None while storing (a canvas sits in its
    # slot's device tensors instead)
    block_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # its positions', as committed
    block_draws: int = 0  # denoising and drafting steps it has taken: the noise step of its block draws
    generated: int = 0  # tokens it has reported
    state: CanvasRowState | None = None  # its rule's own state (a canvas rule's), None where the rule keeps none
    bias: torch.Tensor | None = None  # [vocab] float32: a canvas row's logit bias, built once when it joins


@dataclass(frozen=True)
class Span:
    """One row's plan for this step, with the tokens its span (or its canvas row's store) writes."""

    request: Request
    row: SpanRow
    plan: SpanPlan  # what its rule runs this step
    tokens: list[int]

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def causal(self) -> bool:
        return self.plan.causal

    @property
    def logit_offsets(self) -> tuple[int, ...]:
        return self.plan.logit_offsets


def joining_row(request: Request, cached: int) -> SpanRow:
    """A joining request's row: its slot, and the prompt tokens past its ``cached`` positions to store."""
    return SpanRow(request.slot, request.params.max_new_tokens, pending=list(request.prompt_token_ids[cached:]),
                   context=cached)


def planned_spans(rows: dict[str, SpanRow], scheduled: SchedulerOutput,
                  plan: Callable[[SpanRow], SpanPlan]) -> list[Span]:
    """Each scheduled row's span this step, as its rule plans it (a store or canvas span writes its pending
    tokens, the others its active block)."""
    spans = []
    for request in (*scheduled.starting, *scheduled.continuing):
        row = rows[request.request_id]
        row_plan = plan(row)
        spans.append(Span(request, row, row_plan, row.pending if row_plan.kind in ("store", "canvas") else row.block))
    return spans
