"""``linear_spec``: Nemotron-Labs-Diffusion's self-speculation (``linear_spec_generate``), batched.

A row drafts the block after its last accepted token bidirectionally, ``[next token, MASK x (B - 1)]``: at
``threshold`` 0.0 every mask takes its argmax from one forward; above 0, each forward commits the masks whose
confidence is >= ``threshold``, and always the most confident one, until none is left. One causal forward
then verifies the draft and stores its keys and values. Its argmax at offset i is the model's own next token
after the draft's first i + 1 tokens, so the row accepts ``1 + (the leading i with verified[i] == draft[i + 1])``
tokens, the last a bonus, and keeps the cache up to them. Greedy speculation is lossless: a row's tokens
are ``autoregressive``'s, and its worth is the tokens each forward yields.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.rules.autoregressive import causal_mode_problems
from engine.rules.base import BlockUpdate, BlockView, DecodingRule
from engine.rules.spans import SpanPlan, SpanReading
from engine.rules.unmasking import with_most_confident


@dataclass(frozen=True)
class LinearSpec(DecodingRule):
    threshold: float = 0.0
    mask_id: int | None = None
    name: ClassVar[str] = "linear_spec"
    settings: ClassVar[tuple[str, ...]] = ("threshold",)
    row_kinds: ClassVar[tuple[str, ...]] = ("anchored",)
    accepts_zero_threshold: ClassVar[bool] = True
    drafts_to_budget: ClassVar[bool] = True

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        value = config.threshold
        if config.decoding == cls.name and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0):
            return [("threshold", f"must be in [0, 1] for decoding='linear_spec' (0: draft every mask from one "
                                  f"forward), got {value!r}")]
        return []

    @classmethod
    def requirement_problems(cls, config: Any) -> list[tuple[str, str]]:
        return causal_mode_problems(cls.name, config)

    @classmethod
    def _model_settings(cls, *, mask_id: int | None, logit_shift: int, config: Any) -> dict[str, Any]:
        return {"mask_id": mask_id}

    def scheduled_block(self, block_length: int) -> int:
        return 1

    def logit_offsets(self, block: Sequence[int], lead: int) -> list[int]:
        """Offsets of a drafted block still to draft (its masks); none left: the draft is whole."""
        return [offset for offset, token in enumerate(block) if token == self.mask_id]

    def plan_span(self, pending: Sequence[int], block: Sequence[int] | None, causal_context: bool) -> SpanPlan:
        """Store pending tokens causally (the last one's logits give the next token); draft the block's masks
        bidirectionally; verify a whole draft causally, reading every offset."""
        if pending:
            return SpanPlan("store", True, (len(pending) - 1,))
        offsets = tuple(self.logit_offsets(block, 0))
        if not offsets:
            return SpanPlan("verify", True, tuple(range(len(block))))
        return SpanPlan("draft", False, offsets)

    def read_span(self, plan: SpanPlan, tokens: list[int], values: list[int],
                  stop_ids: Sequence[int] | None) -> SpanReading:
        """A store's next token is the first output token and seeds the draft; a verify keeps and reports the
        accepted run, whose last token seeds the next draft."""
        if plan.kind == "store":
            return SpanReading(kept=len(tokens), emitted=values[:1], seed=values[:1])
        if plan.kind == "verify":
            run = values[:self.accepted(tokens, values)]
            return SpanReading(kept=len(run), emitted=run, seed=run[-1:])
        return SpanReading(block=values)

    def step(self, view: BlockView) -> BlockUpdate:
        """A drafting forward: the masked positions of the blocks it commits take their candidates."""
        masked = view.tokens == self.mask_id
        written = (masked.clone() if self.threshold <= 0.0 else
                   with_most_confident(masked & (view.confidence >= self.threshold), view.confidence, masked))
        return BlockUpdate(torch.where(written, view.candidates, view.tokens), written)

    @staticmethod
    def accepted(draft: Sequence[int], verified: Sequence[int]) -> int:
        """Tokens a row accepts: its verified tokens up to the first that differs from the draft's next, and
        that one (the bonus)."""
        count = 0
        while count < len(draft) - 1 and verified[count] == draft[count + 1]:
            count += 1
        return count + 1
