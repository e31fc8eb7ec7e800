"""What a decoding rule defines, and the data one step passes it.

A rule is one object. It owns its settings (``EngineConfig``'s flat keys, validated here), the layouts and
request settings it refuses, and its per-row state. A block rule (:class:`BlockRule`) also owns which
positions of a row's active block need logits, and, from one step's proposals, what the step writes and
whether the block is final. The runner calls it in this order, once per step::

    host:    rule.logit_offsets(block, lead) for each row    -> the positions whose logits run
    device:  proposals (candidates, confidences) -> BlockView -> rule.step(view) -> BlockUpdate
    host:    one copy of rule.host_columns(update)            -> rule.read_block(...), rule.after_step(...)

The runner never compares tokens with the mask id: what is "done" is the rule's ``final``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from engine.rules import DEFAULT_THRESHOLD
from engine.rules.spans import PlansSpans, SpanPlan, SpanReading


@dataclass(frozen=True)
class Setting:
    """A setting one rule or one family owns, by the flat name users give it (EngineConfig, a YAML, engine_kwargs)."""

    default: Any
    valid: Callable[[Any], bool]
    expected: str  # what a valid value is, for the message
    per_request: bool = False  # a request may carry its own (SamplingParams; None there: the engine's)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a valid value, as a message that follows the setting's name (None: it is)."""
        return None if self.valid(value) else f"must be {self.expected}, got {value!r}"


class DecodingRule(PlansSpans):
    """The settings side of every rule: names, validation, refusals."""

    name: ClassVar[str]  # its key in engine.rules.RULES (EngineConfig.decoding)
    settings: ClassVar[tuple[str, ...]] = ()  # the EngineConfig fields it reads, shared with other rules
    own_settings: ClassVar[dict[str, Setting]] = {}  # the settings it alone reads, declared here
    counters: ClassVar[dict[str, str]] = {}  # what it counts per row step (RowStep.counters): name -> meaning,
    # summed by name in engine stats, Serve metrics and the job's summary
    row_kinds: ClassVar[tuple[str, ...]] = ("bidirectional", "block_causal")  # the RowLayout.row_kind values
    # it runs on
    vocab_copies: ClassVar[int] = 1  # float32 copies of a position's logits its step holds at once (memory check)
    excludes_mask: ClassVar[bool] = True  # MASK is never proposed, and outside its log-probabilities' distribution

    @property
    def measure(self) -> str:
        """The per-position score :func:`engine.rules.proposals.propose_tokens` gives it."""
        return "probability"

    @classmethod
    def settings_problems(cls, config: Any) -> list[tuple[str, str]]:
        """Its own settings that ``config`` sets to invalid values, as (field, why)."""
        return []

    @classmethod
    def requirement_problems(cls, config: Any) -> list[tuple[str, str]]:
        """What it needs of ``config`` when it is the chosen rule, as (field, why)."""
        return []

    @classmethod
    def from_config(cls, config: Any, *, mask_id: int | None = None, logit_shift: int = 0) -> DecodingRule:
        settings = {name: getattr(config, name) for name in (*cls.settings, *cls.own_settings)}
        if "threshold" in settings and settings["threshold"] is None:  # a config not settled against a model
            settings["threshold"] = DEFAULT_THRESHOLD
        return cls(**settings, **cls._model_settings(mask_id=mask_id, logit_shift=logit_shift, config=config))

    @classmethod
    def _model_settings(cls, *, mask_id: int | None, logit_shift: int, config: Any) -> dict[str, Any]:
        """What the rule takes from the model rather than the config."""
        return {}

    @classmethod
    def refusal(cls, layout: Any) -> str | None:
        """Why a model of this layout cannot run the rule (naming the setting), or None."""
        if layout.row_kind not in cls.row_kinds:
            return (f"EngineConfig.decoding: {cls.name!r} runs on {' or '.join(cls.row_kinds)} rows; "
                    f"{layout.family}'s rows are {layout.row_kind}" + cls._alternatives(layout))
        if cls.name in layout.refused_rules:
            return (f"EngineConfig.decoding: {cls.name!r} is not offered for {layout.family}"
                    + cls._alternatives(layout))
        return None

    @staticmethod
    def _alternatives(layout: Any) -> str:
        return f": use {layout.own_rule} (or leave decoding unset)" if layout.own_rule else \
            ": use low_confidence_dynamic, low_confidence, threshold or quota"

    @classmethod
    def settle(cls, config: Any, checkpoint_settings: dict) -> Any:
        """``config`` with its unset settings taken from the checkpoint (most rules read none)."""
        return config

    def scheduled_block(self, block_length: int) -> int:
        """The tokens one of the scheduler's blocks spans: a block of ``block_length`` (1 for a rule that
        commits runs of tokens, each run one of the scheduler's blocks)."""
        return block_length

    def request_problem(self, params: Any) -> str | None:
        """Why a request's settings cannot run under this rule, as a message that starts with the field."""
        from engine.rules import owned_settings

        for name, value in params.rule_settings:
            declared = self.own_settings.get(name)
            owner, owned = owned_settings()[name]
            if not owned.per_request:
                return f"{name} is an engine setting of decoding={owner!r}, not a request's: set it in EngineConfig"
            if declared is None:
                return (f"{name} is a setting of decoding={owner!r}; this engine decodes with {self.name!r}: "
                        "leave it unset")
            if value is not None and (problem := declared.problem(value)) is not None:
                return f"{name} {problem}"
        return None


@dataclass(frozen=True)
class BlockView:
    """One step's rows, as a block rule reads them: ``[rows, block]`` tensors on the device."""

    tokens: torch.Tensor  # the active blocks before this step
    candidates: torch.Tensor  # each computed position's proposed token; its own token elsewhere
    confidence: torch.Tensor  # the rule's score of each candidate; -inf where no logits were computed
    computed: torch.Tensor | None  # bool: the positions whose logits this step computed (the rule's offsets);
    # built only for a rule that reads positions other than masks (BlockRule.reads_unmasked)
    step_in_block: torch.Tensor  # [rows] steps the row has taken in this block before this one
    row_inputs: Any = None  # the rule's per-row tensors (BlockRule.row_inputs)
    logits: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None = None  # a rule that reads them
    # (BlockRule.reads_logits): the computed positions' logits [positions, 1, vocab] and their (rows, offsets)


@dataclass(frozen=True)
class BlockUpdate:
    """What one step did to the rows' active blocks."""

    tokens: torch.Tensor  # [rows, block] the blocks after this step
    written: torch.Tensor  # [rows, block] bool: positions whose token this step set (logprobs are taken there)
    final: torch.Tensor | None = None  # [rows] bool: the block is final (None: the rule reads it on the host)
    edits: torch.Tensor | None = None  # [rows] tokens rewritten that were not masks (None: a mask-only rule)
    post_mask: torch.Tensor | None = None  # [rows] bool: the block held no mask before this step


@dataclass(frozen=True)
class RowStep:
    """One row's part of the host copy of a BlockUpdate."""

    tokens: list[int]
    final: bool
    counters: dict[str, int] = field(default_factory=dict)  # this step's counts, by the rule's counter names



@dataclass
class RowState:
    """A running row's state, as the rule left it at the last step."""

    offsets: list[int] | None = None  # offsets of its active block that need logits (None: untouched)


@dataclass
class CanvasRowState:
    """A canvas row's own draws and where its canvas stands, kept on the host by the canvas rows."""

    generator: torch.Generator  # every draw of the row, seeded by its request
    drawn: bool = False  # its slot holds a canvas being denoised (False: its next step draws one)
    conditioned: bool = False  # its canvas has self-conditioning from a previous step


class CanvasRule(DecodingRule):
    """A rule that denoises a row's whole canvas each step from every position's logits, drawing from the
    row's own generator (DiffusionGemma's sampler). It plans each row's step as spans (a store of its pending
    context, then its canvas) and reads the step back; the canvas rows ask it for each of these."""

    max_denoising_steps: int  # the steps a canvas may take; the request counts those taken (step_in_block)
    row_kinds: ClassVar[tuple[str, ...]] = ("canvas",)
    excludes_mask: ClassVar[bool] = False  # a canvas may hold any token

    def new_canvas_row(self, seed: int, device: torch.device) -> CanvasRowState:
        """The state of a row that has just been admitted: its generator seeded by its request."""
        return CanvasRowState(torch.Generator(device=device).manual_seed(seed))

    def plan_canvas(self, pending: Sequence[int], state: CanvasRowState) -> SpanPlan:
        """A row's step: its pending context stored causally (if any), a new canvas drawn where none is being
        denoised, then the canvas denoised bidirectionally over the cached context."""
        return SpanPlan("canvas", False, (), stores=bool(pending), draws=not state.drawn)

    def read_canvas(self, plan: SpanPlan, state: CanvasRowState, stored: Sequence[int], values: Sequence[int]
                    ) -> SpanReading:
        """What the row does after the step (``values``: its argmax canvas, then whether the canvas completes).
        A completed canvas is reported and stored before the next one, which a later step draws."""
        state.drawn, state.conditioned = not values[-1], True
        kept = len(stored) if plan.stores else 0
        if not values[-1]:
            return SpanReading(kept=kept)
        tokens = list(values[:-1])
        return SpanReading(kept=kept, emitted=tokens, pending=tokens)

    def initial_canvas(self, generator: torch.Generator, length: int, vocab_size: int,
                       device: torch.device) -> torch.Tensor:
        """A new canvas ``[1, length]`` drawn from the row's generator."""
        raise NotImplementedError

    def empty_history(self, rows: int, length: int, device: torch.device) -> torch.Tensor:
        """The per-row record of earlier canvases a new canvas starts from."""
        raise NotImplementedError

    def scale(self, logits: torch.Tensor, steps_left: torch.Tensor) -> torch.Tensor:
        """``logits [rows, canvas, vocab]`` as the sampler reads them (in place), ``steps_left`` counting this one."""
        raise NotImplementedError

    def denoise(self, logits: torch.Tensor, canvas: torch.Tensor, history: torch.Tensor, steps_left: torch.Tensor,
                generators: list[torch.Generator]) -> Any:
        """One step of every row: the next canvases, the argmax canvases a completing row commits, the scaled
        logits, which rows stop, and the new history (``engine.rules.entropy_bound.CanvasStepResult``)."""
        raise NotImplementedError


class BlockRule(DecodingRule):
    """A rule that decodes a row's active block from logits at some of its positions."""

    mask_id: int | None  # the model's MASK (set by from_config; selecting commits does not need it)
    reads_unmasked: ClassVar[bool] = False  # it reads logits at positions that are not masks (BlockView.computed)
    reads_logits: ClassVar[bool] = False  # it reads the logits themselves, not only the proposals (BlockView.logits)
    commits_once: ClassVar[bool] = False  # a written token is never rewritten (no edits): see read_block

    @classmethod
    def _model_settings(cls, *, mask_id: int | None, logit_shift: int, config: Any) -> dict[str, Any]:
        return {"mask_id": mask_id}

    def logit_offsets(self, block: Sequence[int], lead: int) -> list[int]:
        """Offsets of a row's active block (host tokens, ``lead`` prompt tokens first) that need logits."""
        return [offset for offset, token in enumerate(block) if token == self.mask_id]

    def new_row_state(self) -> RowState:
        """The state of a row that has just been admitted."""
        return RowState()

    def row_inputs(self, states: Sequence[RowState], params: Sequence[Any], like: torch.Tensor) -> Any:
        """The per-row tensors :meth:`step` reads, on ``like``'s device (None: it reads none)."""
        return None

    def step(self, view: BlockView) -> BlockUpdate:
        raise NotImplementedError

    def host_columns(self, update: BlockUpdate) -> torch.Tensor:
        """What the step's one host copy carries, ``[rows, ...]``: a mask-only rule's blocks alone (it reads
        their finality on the host, without more device operations)."""
        return update.tokens

    def read_row(self, values: list[int]) -> RowStep:
        """A row's part of the host copy: a mask-only rule's block is final once it holds no mask."""
        return RowStep(values, self.mask_id not in values)

    def read_block(self, values: list[int], lead: int, stop_ids: Sequence[int] | None) -> RowStep:
        """:meth:`read_row`, given the request's stop ids where a stop ends its answer (None: it ignores stops,
        or its layout decodes every block whole). A rule that never rewrites a token also makes the block final
        once its answer, after the ``lead`` prompt tokens, holds a stop token with no mask before it: the answer
        is whole, and the masks after the stop would change nothing in it."""
        row = self.read_row(values)
        if row.final or stop_ids is None or not self.commits_once or not self.ends_at_stop(values[lead:], stop_ids):
            return row
        return dataclasses.replace(row, final=True)

    def ends_at_stop(self, block: Sequence[int], stop_ids: Sequence[int]) -> bool:
        """Whether ``block`` holds a stop token with no mask before it: a family whose loop ends a block
        there (Nemotron-Labs-Diffusion's) takes it as final, since nothing after the stop joins the answer."""
        stop = next((index for index, token in enumerate(block) if token in stop_ids), None)
        return stop is not None and self.mask_id not in block[:stop]

    def after_step(self, state: RowState, row: RowStep, lead: int) -> None:
        """Update a row's state from its part of the step's host copy."""
        state.offsets = None if row.final else self.logit_offsets(row.tokens, lead)

    def _update(self, tokens: torch.Tensor, written: torch.Tensor) -> BlockUpdate:
        """A mask-only step's update (its finality is read on the host, :meth:`read_row`)."""
        return BlockUpdate(tokens, written)
