"""The span runner's data: a running row, one row's span at a step, and what a row kind provides.

The span runner (``engine.runner.span_runner``) keeps a ``SpanRow`` per running request and builds a ``Span``
per row at each step from its rule's plan; a row kind's module (``SpanRows``) runs the step's spans.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.models.kv_cache import KVCache
from engine.rules.base import CanvasRowState, DecodingRule
from engine.rules.spans import SpanPlan
from engine.runner.prefix_cache import PrefixCache
from engine.scheduling.outputs import RowResult
from engine.scheduling.request import Request, TokenLogprob
from engine.scheduling.trace import ForwardRecord


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


class SpanRows(Protocol):
    """A row kind's side of the span runner: its cache, its rule's plans, its forward and its reading."""

    cache: KVCache
    rule: DecodingRule  # the rule that plans its rows' spans and reads them back
    rows_per_chunk: int | None  # rows whose vocabulary-sized temporaries a step holds at once (None: every row's)

    def reusable_pages(self, prompt_length: int) -> int:
        """The most prompt pages a joining row may take from the prefix cache."""

    def admit(self, request: Request, row: SpanRow) -> None:
        """What the row kind keeps of a joining row beyond the runner's: its rule's state, a dense bias."""

    def claim_prompts(self, prefix_cache: PrefixCache, admitted: list[Request], rows: list[SpanRow]) -> None:
        """Claim the joining rows' whole prompt pages for the prefix cache to keep."""

    def plan(self, row: SpanRow) -> SpanPlan:
        """The row's plan for this step, from its rule."""

    def run(self, spans: list[Span], prefix_cache: PrefixCache | None) -> tuple[dict[str, RowResult], ForwardRecord]:
        """One forward of every span, then each row's result as its rule reads it."""
