"""``threshold`` (Fast-dLLM's parallel decoding) and ``low_confidence`` (SGLang's ``LowConfidence``).

* ``threshold``: commit every masked position whose confidence is >= ``threshold``, and always the single
  most confident masked position, so each step makes progress.
* ``low_confidence``: the same with a strict ``>``, as SGLang serves SDAR and LLaDA2 and Fast-dLLM v2's own
  ``generate`` compares.

Both may decode a block in **sub-blocks** (``sub_block_length``, Fast-dLLM v2's ``small_block_size``): the
block's offsets are cut into runs of that many from its first offset, and a step reads logits and commits
only in the first run that still holds a mask (a prompt's lead counts as filled)::

    block of 8, sub_block_length 4:   [ p p c M | M M M M ]   this step decides offset 3 only
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.rules.base import Setting
from engine.rules.unmasking import UnmaskingRule, positive_int_or_none, unit_threshold_problems, with_most_confident

SUB_BLOCK_SETTINGS = {
    "sub_block_length": Setting(None, positive_int_or_none, "a positive int that divides block_length, or None "
                                                                "(the whole block)"),
}


@dataclass(frozen=True)
class Threshold(UnmaskingRule):
    threshold: float = 0.9
    sub_block_length: int | None = None  # None: the whole block is one sub-block
    name: ClassVar[str] = "threshold"
    settings: ClassVar[tuple[str, ...]] = ("threshold", "steps_per_block")
    own_settings: ClassVar[dict[str, Setting]] = SUB_BLOCK_SETTINGS
    row_kinds: ClassVar[tuple[str, ...]] = ("bidirectional", "block_causal", "anchored")

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        return unit_threshold_problems(config) + sub_block_problems(config) + super().settings_problems(config)

    def passes(self, confidence: torch.Tensor) -> torch.Tensor:
        return confidence >= self.threshold

    def logit_offsets(self, block: Sequence[int], lead: int) -> list[int]:
        """The masks of the block's current sub-block (every mask without sub-blocks)."""
        masks = super().logit_offsets(block, lead)
        if self.sub_block_length is None or not masks:
            return masks
        current = masks[0] // self.sub_block_length
        return [offset for offset in masks if offset // self.sub_block_length == current]

    def choose(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        deciding = masked if self.sub_block_length is None else masked & self.current_sub_block(masked)
        return with_most_confident(deciding & self.passes(confidence), confidence, deciding)

    def current_sub_block(self, masked: torch.Tensor) -> torch.Tensor:
        """bool ``[rows, block]``: the offsets of each row's first sub-block that holds a mask."""
        sub_block = torch.arange(masked.shape[-1], device=masked.device) // self.sub_block_length
        first = torch.where(masked, sub_block, masked.shape[-1]).amin(dim=-1, keepdim=True)
        return sub_block == first


@dataclass(frozen=True)
class LowConfidence(Threshold):
    name: ClassVar[str] = "low_confidence"

    def passes(self, confidence: torch.Tensor) -> torch.Tensor:
        return confidence > self.threshold


def sub_block_problems(config: Any) -> list[tuple[str, str]]:
    """``sub_block_length`` must cut the block into whole sub-blocks (Fast-dLLM v2 never decodes a partial one)."""
    length, block = config.sub_block_length, config.block_length
    if length is None or not positive_int_or_none(length):
        return []
    if block is not None and block % length:
        return [("sub_block_length", f"must divide block_length {block}, got {length}")]
    if config.steps_per_block is not None:
        return [("sub_block_length", "decodes each sub-block until it holds no mask; leave steps_per_block unset")]
    return []
