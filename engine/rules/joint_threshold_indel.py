"""``joint_threshold_indel``: LLaDA2.2's editing with insertions and deletions (SGLang's ``JointThresholdInDel``).

A block keeps its positions (absolute); each step reads one forward of it and rewrites it whole; prompt
positions never change. In the order of SGLang 0.5.23's ``dllm/algorithm/joint_threshold_indel.py``, greedy
(the argmax, MASK included, and its softmax probability):

* **original masks** are the block's masks before its first step; edits move their flags with the tokens. The
  post-edit budget counts every step that starts without one (it never resets); the step is the *clean-up*
  once ``max_post_steps`` such steps ran (0: the step that commits the last original mask), or after
  ``block_length + max_post_steps`` steps.
* **mask to token**: while original masks remain, a MASK argmax at one becomes the best other token; the masks
  above ``threshold`` commit if they are at least ``1 +`` the masks edits introduced, else that many of the
  most confident; with no original mask left, or at the clean-up, every mask commits.
* **token to token**: a non-mask, non-prompt position whose argmax differs and is above ``editing_threshold``
  is rewritten, possibly with MASK, DELETE or SPLIT.
* **anti-loop**: a step that starts from a block seen before rewrites its least confident changing position
  with its best token not yet written there (nor MASK at an original mask).
* **clean-up**: writes no MASK, DELETE or SPLIT (each becomes the next-best token); the block is final, as it
  is after a step that writes nothing.
* **insert / delete**: a DELETE drops its position (the rest shift left, a mask pads the end); a SPLIT puts a
  new mask before the position's old token (the rest shift right, the last token falls off).

Mask counts are not monotone. A final block's keys and values are stored by the next window from its final
tokens (SGLang's persisting forward). DELETE / SPLIT ids come from the checkpoint (LLaDA2.2's config.json) or
``EngineConfig``; ``editing_threshold`` and ``max_post_steps`` may vary per request.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from engine.rules.base import BlockRule, BlockUpdate, BlockView, RowState, RowStep, Setting
from engine.rules.joint_threshold import DEFAULT_MAX_POST_STEPS, EDITING_SETTINGS
from engine.rules.unmasking import rank_by_confidence, unit_threshold_problems
from engine.runner.batch import to_device

DEFAULT_THRESHOLD, DEFAULT_EDITING_THRESHOLD = 0.5, 0.0  # SGLang's defaults, the model card's S mode
TOKEN_IDS = ("delete_token_id", "split_token_id")
INDEL_SETTINGS = EDITING_SETTINGS | {name: Setting(
    None, lambda value: value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0),
    "a token id (int >= 0); unset: the checkpoint's config.json") for name in TOKEN_IDS}
COLUMNS = 4  # host copy, per position: the new block, its original-mask flags, the input block, the writes


@dataclass
class IndelRowState(RowState):
    original_masks: list[bool] | None = None  # per position, after the last step (None: the block's first)
    block: tuple[int, ...] = ()  # the block as the last step left it
    update_steps: int = 0
    post_edit_steps: int = 0
    seen: set[tuple[int, ...]] = field(default_factory=set)  # blocks steps started from
    written: dict[int, set[int]] = field(default_factory=dict)  # position -> tokens steps wrote there


@dataclass(frozen=True)
class IndelRowStep(RowStep):
    original_masks: list[bool] = field(default_factory=list)
    input_block: tuple[int, ...] = ()
    writes: dict[int, int] = field(default_factory=dict)  # position -> token written (before insert / delete)
    post_edit_steps: int = 0


@dataclass(frozen=True)
class IndelInputs:
    """Each row's state and settings, ``[rows]`` unless said."""

    original_masks: torch.Tensor  # [rows, block] bool
    first_step: torch.Tensor  # bool: the block's first step (its masks are the original ones)
    update_steps: torch.Tensor  # long, before this step
    post_edit_steps: torch.Tensor  # long, before this step
    repeated: torch.Tensor  # bool: the step starts from a block seen before
    editing_threshold: torch.Tensor  # the probabilities' dtype
    max_post_steps: torch.Tensor  # long
    banned: torch.Tensor | None  # [rows, block, n] tokens written at each position (-1 pads); None: no repeat


@dataclass(frozen=True)
class JointThresholdIndel(BlockRule):
    threshold: float = DEFAULT_THRESHOLD
    editing_threshold: float | None = DEFAULT_EDITING_THRESHOLD
    max_post_steps: int = DEFAULT_MAX_POST_STEPS
    delete_token_id: int | None = None
    split_token_id: int | None = None
    mask_id: int | None = None
    name: ClassVar[str] = "joint_threshold_indel"
    settings: ClassVar[tuple[str, ...]] = ("threshold",)
    own_settings: ClassVar[dict[str, Setting]] = INDEL_SETTINGS
    counters: ClassVar[dict[str, str]] = {"edits": "generated tokens rewritten by token editing",
                                          "deletes": "positions dropped by a DELETE",
                                          "splits": "masks inserted by a SPLIT"}
    row_kinds: ClassVar[tuple[str, ...]] = ("block_causal",)
    reads_unmasked: ClassVar[bool] = True
    reads_logits: ClassVar[bool] = True

    def __post_init__(self) -> None:
        missing = [name for name in TOKEN_IDS if getattr(self, name) is None]
        if missing:
            raise ValueError(f"decoding 'joint_threshold_indel' needs {' and '.join(missing)}: the checkpoint's config"
                             ".json names none (LLaDA2.2's does); set them in EngineConfig only for a checkpoint "
                             "trained for insert / delete editing")
        ids = {"mask_id": self.mask_id, "delete_token_id": self.delete_token_id, "split_token_id": self.split_token_id}
        known = [value for value in ids.values() if value is not None]
        if len(set(known)) != len(known):
            raise ValueError(f"decoding 'joint_threshold_indel' needs distinct MASK, DELETE and SPLIT ids, got {ids}")
        if self.editing_threshold is None:
            object.__setattr__(self, "editing_threshold", DEFAULT_EDITING_THRESHOLD)

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        return unit_threshold_problems(config)

    @classmethod
    def settle(cls, config: Any, checkpoint_settings: dict) -> Any:
        """Unset thresholds: SGLang's defaults (the checkpoint's threshold first); DELETE / SPLIT: the checkpoint's."""
        given = dict(config.rule_settings)
        settled = {name: checkpoint_settings[name] for name in TOKEN_IDS
                   if given.get(name) is None and checkpoint_settings.get(name) is not None}
        if given.get("editing_threshold") is None:
            settled["editing_threshold"] = DEFAULT_EDITING_THRESHOLD
        if config.threshold is None:
            settled["threshold"] = checkpoint_settings.get("threshold", DEFAULT_THRESHOLD)
        return dataclasses.replace(config, **settled)

    def request_problem(self, params: Any) -> str | None:
        if params.temperature != 0.0:
            return ("temperature is not offered for decoding 'joint_threshold_indel': SGLang's JointThresholdInDel "
                    "is greedy (argmax); leave it unset")
        if params.logprobs is not None:
            return ("logprobs is not offered for decoding 'joint_threshold_indel': a DELETE or SPLIT moves tokens "
                    "after their logits were read, so a position's log-probability has no token; leave it unset")
        return super().request_problem(params)

    def logit_offsets(self, block: Sequence[int], lead: int) -> list[int]:
        """Every offset past the prompt: any of them may be committed, edited, deleted or split."""
        return list(range(lead, len(block)))

    def new_row_state(self) -> IndelRowState:
        return IndelRowState()

    def row_inputs(self, states: Sequence[IndelRowState], params: Sequence[Any], like: torch.Tensor) -> IndelInputs:
        width = like.shape[1]
        thresholds = [p.editing_threshold if p.editing_threshold is not None else self.editing_threshold
                      for p in params]
        budgets = [p.max_post_steps if p.max_post_steps is not None else self.max_post_steps for p in params]
        repeated = [s.original_masks is not None and s.block in s.seen for s in states]
        flags, first, steps, post, repeats, budget = to_device(
            like, [f for s in states for f in (s.original_masks or [False] * width)],
            [s.original_masks is None for s in states], [s.update_steps for s in states],
            [s.post_edit_steps for s in states], repeated, budgets)
        (threshold,) = to_device(like, thresholds, dtype=torch.float64)  # compared in the probabilities' dtype
        return IndelInputs(flags.view(-1, width).bool(), first.bool(), steps, post, repeats.bool(), threshold, budget,
                           _banned(states, repeated, width, like) if any(repeated) else None)

    def after_step(self, state: IndelRowState, row: IndelRowStep, lead: int) -> None:
        super().after_step(state, row, lead)
        if row.final:  # the next step starts a new block, from a new row's state
            return vars(state).update(vars(self.new_row_state()))
        state.seen.add(row.input_block)
        for position, token in row.writes.items():
            state.written.setdefault(position, set()).add(token)
        state.original_masks, state.block = row.original_masks, tuple(row.tokens)
        state.update_steps += 1
        state.post_edit_steps = row.post_edit_steps

    def step(self, view: BlockView) -> IndelUpdate:
        inputs: IndelInputs = view.row_inputs
        best, best_probability, no_mask, no_mask_probability, clean, index = self._predictions(view)
        masked = view.computed & (view.tokens == self.mask_id)
        flags = torch.where(inputs.first_step[:, None], masked, inputs.original_masks)
        original = flags & masked
        originals = original.sum(-1)
        post_edit = inputs.post_edit_steps + (originals == 0).long()
        budget = inputs.max_post_steps
        cleanup = (((budget > 0) & (post_edit >= budget)) | ((budget == 0) & (originals == 0))
                   | (inputs.update_steps + 1 > view.tokens.shape[1] + budget))
        fallback = ~cleanup[:, None] & original & (best == self.mask_id)
        token = torch.where(fallback, no_mask, best)
        probability = torch.where(fallback, no_mask_probability, best_probability)
        commit = self._commits(masked, original, probability, cleanup, masked.sum(-1) - originals)
        last_originals = (budget == 0) & (originals > 0) & ~(original & ~commit).any(-1)
        cleanup = cleanup | last_originals
        commit = torch.where(last_originals[:, None], masked, commit)
        editing_threshold = inputs.editing_threshold.to(probability.dtype)[:, None]
        edit = view.computed & ~masked & (probability > editing_threshold) & (view.tokens != token)
        write = commit | edit
        special = (token == self.mask_id) | (token == self.delete_token_id) | (token == self.split_token_id)
        token = torch.where(cleanup[:, None] & write & special, clean, token)
        if inputs.banned is not None:
            token = self._break_loop(view, inputs, index, token, probability, write & ~cleanup[:, None], original)
        written = torch.where(write, token, view.tokens)
        tokens, flags_after = self._insert_delete(written, view.tokens, flags, ~view.computed)
        final = cleanup | ~write.any(-1)
        counts = torch.stack([final.long(), edit.sum(-1), (write & (token == self.delete_token_id)).sum(-1),
                              (write & (token == self.split_token_id)).sum(-1), post_edit], dim=1)
        return IndelUpdate(tokens, write, final, edit.sum(-1), original_masks=flags_after, input_tokens=view.tokens,
                           writes=torch.where(write, token, -1), counts=counts)

    def _predictions(self, view: BlockView) -> tuple[torch.Tensor, ...]:
        """``[rows, block]``: the argmax (MASK included) and its probability, the best token but MASK and its
        probability, the best but MASK, DELETE and SPLIT; and each position's row of the step's logits (-1: none)."""
        logits, at = view.logits
        logits = logits.view(logits.shape[0], -1)
        compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
        probabilities = torch.softmax(logits, dim=-1, dtype=compute)
        token = logits.argmax(-1)
        excluded = logits.clone()
        excluded[:, self.mask_id] = float("-inf")
        no_mask = excluded.argmax(-1)
        excluded[:, [self.delete_token_id, self.split_token_id]] = float("-inf")
        clean = excluded.argmax(-1)

        def block(values: torch.Tensor, fill: float | int) -> torch.Tensor:
            return values.new_full(view.tokens.shape, fill).index_put_(at, values)
        index = block(torch.arange(logits.shape[0], device=logits.device), -1)
        return (block(token, self.mask_id), block(probabilities.gather(1, token[:, None]).squeeze(1), 0.0),
                block(no_mask, self.mask_id), block(probabilities.gather(1, no_mask[:, None]).squeeze(1), 0.0),
                block(clean, self.mask_id), index)

    def _commits(self, masked: torch.Tensor, original: torch.Tensor, probability: torch.Tensor,
                 cleanup: torch.Tensor, introduced: torch.Tensor) -> torch.Tensor:
        """The masks a step commits: all at the clean-up or once no original mask is left, else those above the
        threshold if they are at least ``1 + introduced``, else that many of the most confident."""
        above = masked & (probability > torch.tensor(self.threshold, dtype=probability.dtype))
        ranks, _ = rank_by_confidence(probability, masked)
        enough = above.sum(-1) >= 1 + introduced
        some = torch.where(enough[:, None], above, masked & (ranks < (1 + introduced)[:, None]))
        every = cleanup | ~original.any(-1)
        return torch.where(every[:, None], masked, some)

    def _break_loop(self, view: BlockView, inputs: IndelInputs, index: torch.Tensor, token: torch.Tensor,
                    probability: torch.Tensor, candidates: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
        """Rows that start from a block seen before: the least confident position about to change (the leftmost of
        equals) takes its best token not written there before (nor MASK at an original mask)."""
        changing = candidates & (token != view.tokens) & inputs.repeated[:, None]
        rows = changing.any(-1).nonzero().squeeze(1)
        position = torch.where(changing, probability, float("inf")).argmin(-1)[rows]
        logits = view.logits[0].view(view.logits[0].shape[0], -1)[index[rows, position]]
        vocab = logits.shape[1]
        logits = torch.cat([logits, logits.new_zeros(logits.shape[0], 1)], dim=1)  # a column for the -1 pads
        banned = inputs.banned[rows, position]
        logits.scatter_(1, torch.where(banned >= 0, banned, vocab), float("-inf"))
        logits[:, self.mask_id] = torch.where(original[rows, position], float("-inf"), logits[:, self.mask_id])
        return token.index_put((rows, position), logits[:, :vocab].argmax(-1))

    def _insert_delete(self, written: torch.Tensor, old: torch.Tensor, original: torch.Tensor,
                       prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The block after its writes' DELETEs and SPLITs, and its original-mask flags moved alike::

            old      a  b  c  d        written  a  DEL  SPLIT  d   ->   a  MASK  c  d
        """
        rows, width = written.shape
        delete = ~prompt & (written == self.delete_token_id)
        split = ~prompt & (written == self.split_token_id)
        sizes = 1 - delete.long() + split.long()
        first = sizes.cumsum(-1) - sizes
        spill = 2 * width  # a dump column past every kept place
        first_place = torch.where(delete | (first >= width), spill, first)
        second_place = torch.where(split & (first + 1 < width), first + 1, spill)
        tokens = written.new_full((rows, spill + 1), self.mask_id)
        flags = torch.zeros((rows, spill + 1), dtype=torch.bool, device=written.device)
        tokens.scatter_(1, first_place, torch.where(split, self.mask_id, written))
        flags.scatter_(1, first_place, original & ~split)
        tokens.scatter_(1, second_place, old)
        flags.scatter_(1, second_place, original)
        return tokens[:, :width], flags[:, :width]

    def host_columns(self, update: IndelUpdate) -> torch.Tensor:
        """``[rows, 4 block + 5]``: the new block, its original-mask flags, the input block, the token written at
        each position (-1: none), then final, edits, deletes, splits and post-edit steps."""
        return torch.cat([update.tokens, update.original_masks.long(), update.input_tokens, update.writes,
                          update.counts], dim=1)

    def read_row(self, values: list[int]) -> IndelRowStep:
        width = (len(values) - 5) // COLUMNS
        tokens, flags, block, writes = (values[i * width:(i + 1) * width] for i in range(COLUMNS))
        final, edits, deletes, splits, post_edit = values[COLUMNS * width:]
        return IndelRowStep(tokens, bool(final), {"edits": edits, "deletes": deletes, "splits": splits},
                            [bool(flag) for flag in flags], tuple(block),
                            {position: token for position, token in enumerate(writes) if token >= 0}, post_edit)


@dataclass(frozen=True)
class IndelUpdate(BlockUpdate):
    original_masks: torch.Tensor | None = None  # [rows, block] bool, after the step
    input_tokens: torch.Tensor | None = None  # [rows, block] the block the step started from
    writes: torch.Tensor | None = None  # [rows, block] the token written at each position (-1: none)
    counts: torch.Tensor | None = None  # [rows, 5] final, edits, deletes, splits, post-edit steps


def _banned(states: Sequence[IndelRowState], repeated: Sequence[bool], width: int, like: torch.Tensor) -> torch.Tensor:
    """``[rows, width, n]`` the tokens written before at each position of the repeating rows, -1 padded."""
    lists = [[sorted(state.written.get(position, ())) if again else [] for position in range(width)]
             for state, again in zip(states, repeated)]
    most = max(1, *(len(tokens) for row in lists for tokens in row))
    (banned,) = to_device(like, [t for row in lists for tokens in row for t in tokens + [-1] * (most - len(tokens))])
    return banned.view(len(states), width, most)
