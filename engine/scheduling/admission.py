"""What a request must satisfy to ever run: the one check behind ``BlockServeEngine.add_request``, the
OpenAI server's 400s and a Ray Data row's error.

A request's row is its prompt plus its canvas, the whole blocks its answer spans (``RowLayout.answer_blocks``);
the row must fit the model's maximum length, the token budget (a box of one row) and ``max_model_len``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.config import SamplingParams
from engine.models.layout import RowLayout, blocks_needed


class AdmissionError(ValueError):
    """A request the engine can never run. ``param`` names the setting to change: ``"prompt"``,
    ``"params"`` or a SamplingParams field; ``too_long``: the row cannot fit (a context-length error)."""

    def __init__(self, message: str, param: str, too_long: bool = False):
        super().__init__(message)
        self.param, self.too_long = param, too_long


@dataclass(frozen=True)
class AdmissionLimits:
    block_length: int
    vocab_size: int
    model_max_length: int
    token_budget: int
    max_model_len: int  # the engine's widest row (resolved: <= the model's length and the budget)
    layout: RowLayout = RowLayout("a full-attention model")
    rule_problem: Callable[[SamplingParams], str | None] | None = None  # the decoding rule's objection to a
    # request's settings (DecodingRule.request_problem), as a message that starts with the field
    gen_length: int | None = None  # the engine's canvas for whole-sequence rows (EngineConfig.gen_length)

    def row_width(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Prompt plus canvas: the columns a request of these sizes occupies."""
        lead, blocks = self.layout.answer_blocks(prompt_tokens, max_new_tokens, self.block_length)
        return prompt_tokens - lead + blocks * self.block_length

    def check_params(self, params: object) -> None:
        if not isinstance(params, SamplingParams):
            raise AdmissionError(f"params must be SamplingParams, got {type(params).__name__}", "params")
        problem = params.validation_error()
        if problem:
            raise AdmissionError(problem, problem.split(" ", 1)[0])  # each message starts with its field
        if self.rule_problem is not None and (problem := self.rule_problem(params)):
            raise AdmissionError(problem, problem.split(" ", 1)[0])
        if params.logit_bias and max(params.logit_bias) >= self.vocab_size:
            raise AdmissionError(f"logit_bias: token id {max(params.logit_bias)} is outside the vocabulary "
                                 f"[0, {self.vocab_size})", "logit_bias")

    def canvas_length(self, params: SamplingParams) -> int:
        """The answer tokens a request's canvas spans (``RowLayout.canvas_length``): its own gen_length, else the
        engine's, where the layout reads the whole canvas; else max_new_tokens."""
        gen_length = params.gen_length if params.gen_length is not None else self.gen_length
        return self.layout.canvas_length(params.max_new_tokens, gen_length)

    def canvas_setting(self, params: SamplingParams) -> str:
        """The setting that sized a request's canvas, for messages that tell the user what to change."""
        if params.max_new_tokens == self.canvas_length(params):
            return "max_new_tokens"
        return "gen_length" if params.gen_length is not None else "EngineConfig.gen_length"

    def canvas_tokens(self, params: SamplingParams) -> int:
        return blocks_needed(self.canvas_length(params), self.block_length) * self.block_length

    def prompt_room(self, params: SamplingParams) -> int:
        """The most prompt tokens that fit beside the canvas in the widest row."""
        return self.layout.prompt_room(self.max_model_len, self.canvas_length(params), self.block_length)

    def check_canvas(self, params: SamplingParams) -> None:
        """The canvas alone must leave room for a prompt in the widest row, else its setting is at fault."""
        if self.prompt_room(params) < 1:
            setting, canvas = self.canvas_setting(params), self.canvas_length(params)
            raise AdmissionError(
                f"{setting} ({canvas}, rounded up to {self.canvas_tokens(params)} tokens of whole blocks of "
                f"{self.block_length}) leaves no room for a prompt in a row of at most {self.max_model_len} "
                f"tokens: lower {setting}", setting.split(".")[-1], too_long=True)

    def check_width(self, prompt_tokens: int, params: SamplingParams) -> None:
        """The row (prompt + canvas) must fit every limit; the prompt is at fault when even one block
        beside it does not."""
        canvas, setting = self.canvas_length(params), self.canvas_setting(params)
        blocks = blocks_needed(canvas, self.block_length)
        width = self.row_width(prompt_tokens, canvas)
        narrowest = self.row_width(prompt_tokens, 1)
        for limit, what in ((self.model_max_length, "the model's maximum length"),
                            (self.token_budget, "the engine's token budget"),
                            (self.max_model_len, "the engine's max_model_len")):
            if narrowest > limit:
                raise AdmissionError(
                    f"the prompt ({prompt_tokens} tokens) + one block of {self.block_length} exceeds {what} "
                    f"({limit})", "prompt", too_long=True)
            if width > limit:
                raise AdmissionError(
                    f"prompt ({prompt_tokens} tokens) + {setting} ({canvas}, rounded up "
                    f"to {blocks} blocks of {self.block_length}) = {width} tokens exceeds {what} ({limit})",
                    setting.split(".")[-1], too_long=True)
