"""``joint_threshold``: LLaDA2.1's token editing (SGLang's ``JointThreshold``, the model card's S and Q modes).

One forward of the row's current block feeds two moves at every step:

* **mask to token**: commit every mask whose confidence is strictly above ``threshold``, and at least the
  most confident one (so the mask phase needs no step cap);
* **token to token**: rewrite every position of the block that is neither a mask nor a prompt token, whose
  argmax differs from its token and whose probability is strictly above ``editing_threshold`` (0.0: every
  disagreement; None: editing off).

Once the block holds no mask, at most ``max_post_steps`` further forwards run; the block is final at the
first of them that edits nothing, or when that budget is spent. With editing off it is final once it holds
no mask, as ``low_confidence``. This is the LLaDA2.1 remote code's budget, and SGLang's tokens. Only the
current block is edited: a final block is frozen, so its keys and values stay valid. Greedy candidates are
the argmax without MASK, with its softmax probability, as every block rule's.

Model card modes (block 32): S (speed) ``threshold 0.5, editing_threshold 0.0``; Q (quality) ``0.7 / 0.5``.
A request may carry its own ``editing_threshold`` and ``max_post_steps`` (``SamplingParams``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.rules.base import BlockRule, BlockUpdate, BlockView, RowState, RowStep, Setting
from engine.rules.unmasking import unit_threshold_problems, with_most_confident
from engine.runner.batch import to_device

DEFAULT_MAX_POST_STEPS = 16  # LLaDA2.1's remote code and diffusers' default


EDITING_SETTINGS = {
    # rewrite a generated token whose argmax differs with probability above this (0.0: every disagreement;
    # None: editing off)
    "editing_threshold": Setting(
        None, lambda value: value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                              and 0.0 <= value <= 1.0),
        "a probability in [0, 1] (0.0: edit every disagreement) or None (off)", per_request=True),
    # forwards of a block after its last mask, at most
    "max_post_steps": Setting(DEFAULT_MAX_POST_STEPS,
                                  lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                                  "an int >= 0", per_request=True),
}


@dataclass
class EditingRowState(RowState):
    post_mask_forwards: int = 0  # forwards of its active block after the block held no mask


@dataclass(frozen=True)
class EditingInputs:
    """Each row's editing settings and how many post-mask forwards its block has had: ``[rows]``."""

    editing: torch.Tensor  # bool: editing on
    editing_threshold: torch.Tensor  # float64
    post_mask_forwards: torch.Tensor  # long: before this step
    max_post_steps: torch.Tensor  # long


@dataclass(frozen=True)
class JointThreshold(BlockRule):
    threshold: float = 0.95
    editing_threshold: float | None = 0.9
    max_post_steps: int = DEFAULT_MAX_POST_STEPS
    mask_id: int | None = None
    name: ClassVar[str] = "joint_threshold"
    settings: ClassVar[tuple[str, ...]] = ("threshold",)
    own_settings: ClassVar[dict[str, Setting]] = EDITING_SETTINGS
    counters: ClassVar[dict[str, str]] = {"edits": "generated tokens rewritten by token editing",
                                          "post_mask_forwards": "row forwards of blocks that held no mask"}
    row_kinds: ClassVar[tuple[str, ...]] = ("block_causal",)
    reads_unmasked: ClassVar[bool] = True

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        return unit_threshold_problems(config)

    @classmethod
    def refusal(cls, layout: Any) -> str | None:
        if layout.row_kind not in cls.row_kinds:
            return (f"EngineConfig.decoding: 'joint_threshold' (LLaDA2.1's token editing) rewrites tokens of the "
                    f"current block and freezes finished ones, which needs block-causal rows; {layout.family}'s rows "
                    f"are {layout.row_kind}" + cls._alternatives(layout))
        return super().refusal(layout)

    def logit_offsets(self, block: Sequence[int], lead: int) -> list[int]:
        """Every offset past the lead: masks to commit and generated tokens to edit."""
        return [offset for offset, token in enumerate(block) if offset >= lead or token == self.mask_id]

    def new_row_state(self) -> EditingRowState:
        return EditingRowState()

    def row_inputs(self, states: Sequence[EditingRowState], params: Sequence[Any],
                   like: torch.Tensor) -> EditingInputs:
        thresholds = [p.editing_threshold if p.editing_threshold is not None else self.editing_threshold
                      for p in params]
        budgets = [p.max_post_steps if p.max_post_steps is not None else self.max_post_steps for p in params]
        editing, threshold, forwards, budget = to_device(  # one copy: every value fits a float64 exactly
            like, [t is not None for t in thresholds], [t or 0.0 for t in thresholds],
            [s.post_mask_forwards for s in states], budgets, dtype=torch.float64)
        return EditingInputs(editing.bool(), threshold, forwards.long(), budget.long())

    def after_step(self, state: EditingRowState, row: RowStep, lead: int) -> None:
        super().after_step(state, row, lead)
        state.post_mask_forwards = 0 if row.final else state.post_mask_forwards + row.counters["post_mask_forwards"]

    def step(self, view: BlockView) -> BlockUpdate:
        inputs: EditingInputs = view.row_inputs
        masked = view.tokens == self.mask_id
        commit = with_most_confident(masked & (view.confidence > self.threshold), view.confidence, masked)
        editable = view.computed & ~masked & inputs.editing[:, None]
        edit = editable & (view.candidates != view.tokens) & (view.confidence > inputs.editing_threshold[:, None])
        tokens = torch.where(commit | edit, view.candidates, view.tokens)
        post_mask = ~masked.any(-1)
        forwards = inputs.post_mask_forwards + post_mask.long()
        edits = edit.sum(-1)
        settled = ~inputs.editing | (post_mask & (edits == 0)) | (forwards >= inputs.max_post_steps)
        final = ~(tokens == self.mask_id).any(-1) & settled
        return BlockUpdate(tokens, commit | edit, final, edits, post_mask)

    def host_columns(self, update: BlockUpdate) -> torch.Tensor:
        """``[rows, block + 3]``: the blocks, then whether each is final, its edits and whether it was a
        post-mask forward."""
        flags = torch.stack([update.final.long(), update.edits.long(), update.post_mask.long()], dim=1)
        return torch.cat([update.tokens, flags.to(update.tokens.dtype)], dim=1)

    def read_row(self, values: list[int]) -> RowStep:
        return RowStep(values[:-3], bool(values[-3]), {"edits": values[-2], "post_mask_forwards": values[-1]})
