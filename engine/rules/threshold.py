"""``threshold`` (Fast-dLLM's parallel decoding) and ``low_confidence`` (SGLang's ``LowConfidence``).

* ``threshold``: commit every masked position whose confidence is >= ``threshold``, and always the single
  most confident masked position, so each step makes progress.
* ``low_confidence``: the same with a strict ``>``, as SGLang serves SDAR and LLaDA2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.rules.unmasking import UnmaskingRule, unit_threshold_problems, with_most_confident


@dataclass(frozen=True)
class Threshold(UnmaskingRule):
    threshold: float = 0.9
    name: ClassVar[str] = "threshold"
    settings: ClassVar[tuple[str, ...]] = ("threshold", "steps_per_block")
    row_kinds: ClassVar[tuple[str, ...]] = ("bidirectional", "block_causal", "anchored")

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        return unit_threshold_problems(config) + super().settings_problems(config)

    def passes(self, confidence: torch.Tensor) -> torch.Tensor:
        return confidence >= self.threshold

    def choose(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        return with_most_confident(masked & self.passes(confidence), confidence, masked)


@dataclass(frozen=True)
class LowConfidence(Threshold):
    name: ClassVar[str] = "low_confidence"

    def passes(self, confidence: torch.Tensor) -> torch.Tensor:
        return confidence > self.threshold
