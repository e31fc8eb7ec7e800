"""The rules with a fixed number of steps per block: LLaDA's ``quota`` and SDAR's / LLaDA2's variants.

* ``quota``: LLaDA's low-confidence remasking with S steps per block; step k commits the k-th share of
  the block (split evenly, the remainder going to the first steps), most confident first.
* ``low_confidence_static`` (SDAR's ``low_confidence_static``): the same.
* ``low_confidence_dynamic`` (SDAR's ``low_confidence_dynamic``, LLaDA2.0's ``generate``): if at least the
  step's quota q of masked positions are strictly above ``threshold``, commit all of them; else the q most
  confident.

A first block that starts inside the prompt holds fewer masks than the block length; these rules then
commit at most the masks left, as the references do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.rules.unmasking import UnmaskingRule, rank_by_confidence, unit_threshold_problems


def quota_for_step(block_length: int | torch.Tensor, step: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to commit at ``step`` (0-based) of a block (all masks at its start): an even split,
    remainder first."""
    base, remainder = block_length // steps, block_length % steps
    return base + (step < remainder).long()


@dataclass(frozen=True)
class Quota(UnmaskingRule):
    name: ClassVar[str] = "quota"
    row_kinds: ClassVar[tuple[str, ...]] = ("bidirectional", "block_causal", "anchored")  # anchored: one token a
    # step at steps_per_block = block_length is Nemotron-Labs-Diffusion's generate with threshold=None

    @classmethod
    def requirement_problems(cls, config: Any) -> list[tuple[str, str]]:
        if config.steps_per_block is None:
            return [("steps_per_block", f"{cls.name} decoding needs a fixed number of steps per block")]
        return []

    def choose(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        ranks, _ = rank_by_confidence(confidence, masked)
        return masked & (ranks < quota_for_step(masked.shape[-1], step, self.steps_per_block)[:, None])


@dataclass(frozen=True)
class LowConfidenceStatic(Quota):
    name: ClassVar[str] = "low_confidence_static"
    row_kinds: ClassVar[tuple[str, ...]] = ("bidirectional", "block_causal")


@dataclass(frozen=True)
class LowConfidenceDynamic(Quota):
    threshold: float = 0.9
    name: ClassVar[str] = "low_confidence_dynamic"
    row_kinds: ClassVar[tuple[str, ...]] = ("bidirectional", "block_causal")
    settings: ClassVar[tuple[str, ...]] = ("threshold", "steps_per_block")

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        return unit_threshold_problems(config) + super().settings_problems(config)

    def choose(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        by_quota = super().choose(confidence, masked, step)
        confident = masked & (confidence > self.threshold)
        quota = quota_for_step(masked.shape[-1], step, self.steps_per_block)
        return torch.where((confident.sum(-1) >= quota)[:, None], confident, by_quota)
