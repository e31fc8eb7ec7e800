"""``autoregressive``: one token per causal forward, the context's next token.

This is Nemotron-Labs-Diffusion's ``ar_generate``. Its rows run as anchored rows
(``engine.runner.anchored_rows``): each step stores the row's last token causally and draws the next from
that one position's logits (``engine.runner.sampler``), as its span plan says. The scheduler's
blocks are single tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.rules.base import DecodingRule
from engine.rules.spans import SpanPlan, SpanReading

CAUSAL_SCHEDULES = ("continuous", "block_sync")  # a static or shrinking batch shares one canvas of blocks


def causal_mode_problems(name: str, config: Any) -> list[tuple[str, str]]:
    """What a rule that stores every token causally needs of ``config``."""
    problems = []
    if config.schedule not in CAUSAL_SCHEDULES:
        problems.append(("schedule", f"{config.schedule!r} shares one canvas of blocks across a batch; "
                                     f"decoding={name!r} commits tokens one run at a time: use 'continuous'"))
    if config.causal_context is False:
        problems.append(("causal_context", f"decoding={name!r} is causal by definition: leave causal_context True"))
    return problems


@dataclass(frozen=True)
class Autoregressive(DecodingRule):
    name: ClassVar[str] = "autoregressive"
    row_kinds: ClassVar[tuple[str, ...]] = ("anchored",)

    @classmethod
    def requirement_problems(cls, config: Any) -> list[tuple[str, str]]:
        return causal_mode_problems(cls.name, config)

    def scheduled_block(self, block_length: int) -> int:
        return 1

    def plan_span(self, pending: Sequence[int], block: Sequence[int] | None, causal_context: bool) -> SpanPlan:
        """Every step stores the row's pending tokens causally and reads the next token at the last."""
        return SpanPlan("store", True, (len(pending) - 1,))

    def read_span(self, plan: SpanPlan, tokens: list[int], values: list[int],
                  stop_ids: Sequence[int] | None) -> SpanReading:
        """The next token is reported, and stored by the next step."""
        return SpanReading(kept=len(tokens), emitted=values, pending=values)
