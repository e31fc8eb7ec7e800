"""The confidence-factor rules: Fast-dLLM's ``factor`` and the paper's ``factor_prefix``.

With masked confidences sorted c_1 >= c_2 >= ... >= c_m:

* ``factor`` (Fast-dLLM's ``get_transfer_index_dynamic``): rank n passes when c_n >= 1 - f / (n + 1) (rank
  1 always passes); commit the ranks before the first one that fails, except that when only the
  last-ranked one fails (or none does) all m are committed, so a block's last two masks go together.
* ``factor_prefix`` (the paper's statement of the rule): commit the largest prefix n with
  (n + 1)(1 - c_n) < f, and at least one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.rules.unmasking import UnmaskingRule, rank_by_confidence


@dataclass(frozen=True)
class Factor(UnmaskingRule):
    factor: float = 1.0
    name: ClassVar[str] = "factor"
    settings: ClassVar[tuple[str, ...]] = ("factor", "steps_per_block")

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        factor = config.factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            return [("factor", f"must be positive, got {factor!r}")]
        return super().settings_problems(config)

    def choose(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        ranks, sorted_scores = rank_by_confidence(confidence, masked)
        num_masked, length = masked.sum(-1), sorted_scores.shape[-1]
        rank_numbers = torch.arange(1, length + 1, device=masked.device, dtype=torch.float64)
        thresholds = 1 - self.factor / (rank_numbers + 1)
        thresholds[0] = -1.0
        index = torch.arange(length, device=masked.device)
        fails = (sorted_scores.to(torch.float64) < thresholds) & (index < num_masked[:, None])
        first_fail = torch.where(fails, index, length).amin(-1)
        count = torch.where(first_fail >= num_masked - 1, num_masked, first_fail)
        return masked & (ranks < count[:, None])


@dataclass(frozen=True)
class FactorPrefix(Factor):
    name: ClassVar[str] = "factor_prefix"

    def choose(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        ranks, sorted_scores = rank_by_confidence(confidence, masked)
        counts = torch.arange(1, masked.shape[-1] + 1, device=masked.device, dtype=confidence.dtype)
        passes = (counts + 1) * (1 - sorted_scores) < self.factor
        passes[:, 0] = True
        prefix = passes.long().cumprod(dim=-1).sum(dim=-1)
        return masked & (ranks < prefix[:, None])
