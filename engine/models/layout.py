"""How a model's rows are laid out and attended: one description, read by every part of the engine.

A family's layout is one of two kinds:

* **Full attention** (LLaDA, Dream): every position attends to the whole row. A row sits right-aligned
  in its slot, its answer starts on a block boundary, and the first step of each block rebuilds the
  row's keys and values from its current tokens (finished blocks are *refreshed*).
* **Canvas** (DiffusionGemma): a causal encoder writes the context once (prompt, then each committed
  canvas); the answer's canvas starts from random tokens and attends to itself and to that context. A
  row sits left-aligned, its answer starts right after the prompt, and it decodes with the rule its
  family names (``RowLayout.own_rule``), as canvas rows (``engine.runner.canvas_rows``).
* **Anchored** (Nemotron-Labs-Diffusion): a causal context (the prompt, then each finished block) is stored
  once; the active block starts right after it, seeded by the context's next token, and is denoised
  bidirectionally over it. A row sits left-aligned and runs as an anchored row (``engine.runner.anchored_rows``),
  which may also run autoregressively or by linear speculation.
* **Block-causal** (SDAR, LLaDA2, Fast-dLLM v2): a position attends to its own block and every block before
  it, over blocks of the size the model was trained with, counted from the prompt's first token. A row sits
  left-aligned (column = position), the first answer block holds the prompt's last ``lead`` tokens,
  and a finished block's keys and values are written once (finished blocks are *stored*). A family whose
  logits are shifted (Fast-dLLM v2) reads each position's logits one column left
  (``engine.runner.parts_shifted_block_causal``).

Nothing outside this module compares row kinds: it asks a :class:`RowLayout` what it needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

DEFAULT_BLOCK_LENGTH = 32  # a full-attention family's block when the config names none (Fast-dLLM's)


def blocks_needed(num_tokens: int, block_length: int) -> int:
    """Whole blocks that hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_length)


class LayoutSettings(Protocol):
    """The EngineConfig settings a layout checks (``engine.config.EngineConfig`` has them all)."""

    block_length: int | None
    cache: str
    shifted_decoding: str
    enable_prefix_caching: bool | None


RowKind = Literal["bidirectional", "block_causal", "canvas", "anchored"]
ROW_KINDS: tuple[RowKind, ...] = ("bidirectional", "block_causal", "canvas", "anchored")


@dataclass(frozen=True)
class RowLayout:
    """How one model's rows are laid out and attended."""

    family: str  # the family's name, for messages
    row_kind: RowKind = "bidirectional"  # how its rows are attended and stored: the kinds above
    logit_shift: int = 0  # the hidden state at column c predicts the token at column c + logit_shift
    trained_block: int | None = None  # the block size a block-causal model was trained with
    caches: tuple[str, ...] = ("dual", "prefix", "none")  # EngineConfig.cache modes it runs
    refused_rules: tuple[str, ...] = ()  # EngineConfig.decoding rules it cannot run
    own_rule: str | None = None  # the one rule its model runs, which an unset EngineConfig.decoding becomes
    # (None: any block rule it does not refuse); its family module names it
    fixed_block: bool = False  # the model computes over its trained blocks (LLaDA2.2's block routing): it
    # decodes no other block_length

    def __post_init__(self) -> None:
        if self.row_kind not in ROW_KINDS:
            raise ValueError(f"row_kind must be one of {ROW_KINDS}, got {self.row_kind!r}")
        if self.row_kind != "bidirectional" and not self.trained_block:
            raise ValueError(f"{self.family}'s rows are {self.row_kind} but it names no trained block size")

    @property
    def block_causal(self) -> bool:
        """Attention over blocks counted from the prompt's start: rows left-aligned, blocks stored once."""
        return self.row_kind == "block_causal"

    @property
    def decodes_canvases(self) -> bool:
        """Canvases of random tokens denoised by the entropy-bound rule, spans after a stored context."""
        return self.row_kind == "canvas"

    @property
    def anchored(self) -> bool:
        """Blocks anchored after a causal context, one span a step."""
        return self.row_kind == "anchored"

    @property
    def step_kind(self) -> str:
        """How the runner steps its rows, and so how the memory check prices them: "blocks" (active blocks in a
        persistent batch), "anchored" or "canvas" (``engine.runner.interface``)."""
        return "canvas" if self.decodes_canvases else "anchored" if self.anchored else "blocks"

    @property
    def caches_prefixes(self) -> bool:
        """A prompt's keys and values up to a position are exact for any request sharing those tokens (prefix
        caching): its blocks attend causally to what came before, or a canvas or anchored model stores it causally."""
        return self.block_causal or self.decodes_canvases or self.anchored

    @property
    def left_aligned(self) -> bool:
        """Rows sit from column 0 of their slot (column = position); else they end at its last column."""
        return self.block_causal or self.decodes_canvases or self.anchored

    @property
    def stores_finished_blocks(self) -> bool:
        """A finished block's keys and values are written once; else each block's first step refreshes them."""
        return self.block_causal

    @property
    def ends_blocks_at_stops(self) -> bool:
        """A block whose answer holds a stop token with no mask before it ends there, for a request that honours
        stops: block-causal rows decode no later block once they stop, so the masks after it reach no answer."""
        return self.block_causal

    @property
    def carries_cache_when_moved(self) -> bool:
        """A row moved to another slot takes its keys and values along; else its next forward rewrites them."""
        return self.stores_finished_blocks

    def row_start(self, slot_width: int, row_width: int) -> int:
        """The column of a row's first token in a slot of ``slot_width`` columns: 0 when left-aligned, else
        the row ends at the slot's last column."""
        return 0 if self.left_aligned else slot_width - row_width

    def prefix_caching(self, config: LayoutSettings, exact: bool = True) -> bool:
        """Whether ``config`` caches prompt blocks: its own ``enable_prefix_caching``, else wherever that is exact
        (this layout caches prefixes, and ``exact``: the family sees no reason against it)."""
        if config.enable_prefix_caching is not None:
            return config.enable_prefix_caching
        return self.caches_prefixes and exact

    def part_block_size(self, block_length: int) -> int | None:
        """The ``block_size`` of its step parts (``engine.models.step_inputs``): attention over blocks of
        ``block_length`` when block-causal, else None, bidirectional."""
        return block_length if self.block_causal else None

    def untrained_block_warning(self, block_length: int) -> str:
        """What running ``block_length`` instead of the trained block changes, in this layout's words."""
        if self.decodes_canvases:
            return (f"EngineConfig.block_length={block_length} on {self.family}, whose canvases are "
                    f"{self.trained_block} tokens (its canvas_length): canvases of another length were never "
                    f"trained (leave block_length unset to run {self.trained_block})")
        return (f"EngineConfig.block_length={block_length} on {self.family}, which was trained with blocks of "
                f"{self.trained_block}: its block-causal mask differs from training (leave block_length unset to "
                f"run {self.trained_block})")

    def default_block(self) -> int:
        """The block a config that names none decodes with."""
        return self.trained_block or DEFAULT_BLOCK_LENGTH

    @property
    def reads_whole_canvas(self) -> bool:
        """Every answer position attends to every other, so the canvas's length changes the answer."""
        return self.row_kind == "bidirectional"

    def canvas_length(self, max_new_tokens: int, gen_length: int | None) -> int:
        """Answer tokens a request's canvas spans: ``gen_length`` where the whole canvas is read and it is set
        (``max_new_tokens`` then caps the answer, a prefix of the gen_length answer), else ``max_new_tokens``
        (blocks decoded in order never see the ones after them)."""
        return gen_length if gen_length is not None and self.reads_whole_canvas else max_new_tokens

    def answer_blocks(self, prompt_length: int, max_new_tokens: int, block_length: int) -> tuple[int, int]:
        """``(lead, blocks)`` of a request: its prompt tokens inside its first answer block, and the blocks
        its answer spans. Block-causal blocks sit at multiples of ``block_length`` from the prompt's start,
        so the first answer block also holds the prompt's last ``prompt_length % block_length`` tokens."""
        lead = prompt_length % block_length if self.block_causal else 0
        return lead, blocks_needed(lead + max_new_tokens, block_length)

    def prompt_room(self, max_model_len: int, max_new_tokens: int, block_length: int) -> int:
        """The most prompt tokens that fit beside an answer of ``max_new_tokens`` in a row of ``max_model_len``."""
        if self.block_causal:  # the row is prompt + max_new_tokens rounded up to whole blocks
            return max(max_model_len // block_length * block_length - max_new_tokens, 0)
        return max(max_model_len - blocks_needed(max_new_tokens, block_length) * block_length, 0)

    def refusal(self, config: LayoutSettings) -> str | None:
        """Why this layout cannot run ``config`` (naming the setting), or None."""
        if self.fixed_block and config.block_length not in (None, self.trained_block):
            return (f"EngineConfig.block_length={config.block_length}: {self.family} routes its experts over blocks "
                    f"of {self.trained_block} positions, which every forward must hold whole: leave block_length "
                    f"unset (or {self.trained_block})")
        if config.cache not in self.caches:
            return (f"EngineConfig.cache: {config.cache!r} is a cache mode of full-attention families; "
                    f"{self.family} attends block-causally and caches each finished block: leave cache at 'dual'")
        if self.block_causal and self.logit_shift and config.shifted_decoding != "fast-dllm":
            return (f"EngineConfig.shifted_decoding: {config.shifted_decoding!r} widens full-attention windows; "
                    f"{self.family} predicts a block's first position from the stored block before it: leave it "
                    "at 'fast-dllm'")
        if config.enable_prefix_caching and not self.caches_prefixes:
            return (f"EngineConfig.enable_prefix_caching: {self.family} attends over the whole row, so a prompt "
                    "block's keys and values depend on the canvas after it and cannot be reused by another "
                    "request; prefix caching is exact for block-causal families only")
        return None
