"""How a rule plans a span row's step, and reads it back.

A row runs its spans after its stored context. An anchored row (Nemotron-Labs-Diffusion's layout) runs one
span a step: a **store** of its pending tokens, a **denoise** or **draft** of its active block, or a causal
**verify** of a whole draft. Its rule decides which (:meth:`PlansSpans.plan_span`), and from the step's tokens
what the row keeps, emits and does next (:meth:`PlansSpans.read_span`). A canvas row (DiffusionGemma's) runs a
**canvas** span a step, after a store of its pending context in the same forward where it has one; its rule
plans and reads both (``engine.rules.base.CanvasRule``). The runner only carries the plan out, so the
decoding modes differ in their rules alone. The default here is the dLM mode of every block rule: store
causally (``causal_context``), seed the next block with the context's next token, denoise the block with the
rule's step until it is final or ends at a stop token.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SpanPlan:
    """One row's work in one step: its span, and for a canvas row the store and the new canvas before it."""

    kind: str  # "store" | "denoise" | "draft" | "verify" | "canvas"
    causal: bool  # attended causally (its keys and values kept) or bidirectionally within the span
    logit_offsets: tuple[int, ...]  # offsets of the span whose logits the step reads
    # (a canvas reads none: the step returns its hidden states at every position, for its rule's head)
    stores: bool = False  # a canvas span: the row's pending tokens are stored causally first, in the same forward
    draws: bool = False  # a canvas span: a new canvas is drawn from the row's generator before the step


@dataclass(frozen=True)
class SpanReading:
    """What a row does with its span's step (``values``: the tokens the step decided, per logit offset for a
    store or verify, the whole block for a denoise or draft)."""

    kept: int = 0  # span positions whose keys and values stay in the cache (its context grows by this)
    emitted: list[int] | None = None  # tokens the row reports now (a completed block, token or run)
    pending: list[int] | None = None  # tokens its next step stores (None: nothing to store)
    seed: list[int] | None = None  # a new active block starts with these (None: no new block)
    block: list[int] | None = None  # its active block goes on as this (a denoise or draft not done)


class PlansSpans:
    """The anchored-row side of a rule; its default is a block rule's dLM mode (it reads the block rule's
    ``logit_offsets``, ``read_row`` and ``ends_at_stop``)."""

    mask_id: int | None
    drafts_to_budget = False  # its blocks are drafts no longer than the answer can use

    def plan_span(self, pending: Sequence[int], block: Sequence[int] | None, causal_context: bool) -> SpanPlan:
        """A row's span this step: its pending tokens stored, else its active block decided."""
        if pending:
            return SpanPlan("store", causal_context, (len(pending) - 1,) if causal_context else ())
        return SpanPlan("denoise", False, tuple(self.logit_offsets(block, 0)))

    def read_span(self, plan: SpanPlan, tokens: list[int], values: list[int],
                  stop_ids: Sequence[int] | None) -> SpanReading:
        """What the row does after the step; ``stop_ids`` None: the request does not stop at a stop token."""
        if plan.kind == "store":
            return SpanReading(kept=len(tokens), seed=values[:1])
        if self.read_row(values).final or (stop_ids is not None and self.ends_at_stop(values, stop_ids)):
            return SpanReading(emitted=values, pending=values)
        return SpanReading(block=values)
