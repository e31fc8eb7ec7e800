"""What every mask-only block rule shares: a step commits some masked positions and writes nothing else.

A rule of this kind (threshold, quota, factor, dream and their variants) only chooses *which* masked
positions of a row's active block take their candidates now (:meth:`UnmaskingRule.choose`). This module
adds what they all do around that choice:

* MASK is never a candidate token (``engine.rules.proposals``), and rows without masks commit nothing.
* A family with shifted logits decoded as Fast-dLLM does (``first_step_first_position``) commits a block's
  first position alone while it is a mask, at the block's first step: Fast-dLLM's Dream windows cannot see
  the column that predicts it at later steps, and Fast-dLLM v2 seeds each block with it before the others
  (Dream's own sampler has no such step, so ``dream`` needs the "lookback" windows there).
* The last allowed step (``steps_per_block``, or ``block_length`` at most) commits whatever is still
  masked, each with its best non-MASK token.
* The block is final once it holds no mask, or, for a request that stops at a stop token on a layout that ends
  a block there, once a stop token has no mask before it (``BlockRule.read_block``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.rules.base import BlockRule, BlockUpdate, BlockView


def positive_int_or_none(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


def first_position_first(name: str, logit_shift: int, shifted_decoding: str) -> bool:
    """Whether a block's first step commits only its first position (Fast-dLLM's Dream block decoding)."""
    if logit_shift == 0 or shifted_decoding == "lookback":
        return False
    if name == "dream":
        raise ValueError("decoding 'dream' on a family with shifted logits needs shifted_decoding='lookback': "
                         "Dream's sampler applies its rule at every step, and Fast-dLLM's windows cannot "
                         "predict a block's first position")
    return True


@dataclass(frozen=True)
class UnmaskingRule(BlockRule):
    steps_per_block: int | None = None  # cap on steps per block; the fixed step count of the quota rules
    first_step_first_position: bool = False
    mask_id: int | None = None
    settings: ClassVar[tuple[str, ...]] = ("steps_per_block",)
    commits_once: ClassVar[bool] = True

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        steps = config.steps_per_block
        if not positive_int_or_none(steps):
            return [("steps_per_block", f"must be a positive int or None, got {steps!r}")]
        if steps is not None and config.block_length is not None and steps > config.block_length:
            return [("steps_per_block", f"{steps} exceeds block_length {config.block_length}: some steps would "
                                        "commit nothing")]
        return []

    @classmethod
    def _model_settings(cls, *, mask_id: int | None, logit_shift: int, config: Any) -> dict[str, Any]:
        return {"mask_id": mask_id,
                "first_step_first_position": first_position_first(cls.name, logit_shift, config.shifted_decoding)}

    def choose(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """The rule's own choice of masked positions to commit: bool ``[rows, block]``."""
        raise NotImplementedError

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """Which masked positions to commit now: bool ``[rows, block]``.

        step [rows]: 0-based denoising step within the current block. Rows without masks commit nothing. At
        the last allowed step every masked position commits."""
        commit = self.choose(confidence, masked, step)
        if self.first_step_first_position:
            first_only = torch.zeros_like(masked)
            first_only[:, 0] = masked[:, 0]
            commit = torch.where(masked[:, :1], first_only, commit)
        last_step = self.steps_per_block or masked.shape[-1]
        return commit | (masked & (step + 1 >= last_step)[:, None])

    def step(self, view: BlockView) -> BlockUpdate:
        commit = self.select(view.confidence, view.tokens == self.mask_id, view.step_in_block)
        return self._update(torch.where(commit, view.candidates, view.tokens), commit)


def rank_by_confidence(confidence: torch.Tensor, masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ranks (0 = most confident) of masked positions, ties to the leftmost, and the sorted scores."""
    # -inf, not -1: Dream's negative entropy is below -1 for any flat distribution
    scores = torch.where(masked, confidence, torch.full_like(confidence, float("-inf")))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return ranks, scores.gather(-1, order)


def with_most_confident(commit: torch.Tensor, confidence: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """``commit`` (bool ``[rows, block]``, a new tensor the caller owns) with each row's most confident
    masked position (leftmost on a tie) set too, if the row has one: every step makes progress."""
    best = torch.where(masked, confidence, float("-inf")).argmax(dim=-1, keepdim=True)
    return commit.scatter_(-1, best, masked.gather(-1, best))


def unit_threshold_problems(config: Any) -> list[tuple[str, str]]:
    """``threshold`` must be a probability in (0, 1] (a rule that reads 0.0 too validates it itself)."""
    from engine.rules import RULES, rule_class

    if config.decoding in RULES and getattr(rule_class(config.decoding), "accepts_zero_threshold", False):
        return []
    value = config.threshold
    if value is None:  # unset: the checkpoint's, else DEFAULT_THRESHOLD
        return []
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        return [("threshold", f"must be in (0, 1], got {value!r}")]
    return []
