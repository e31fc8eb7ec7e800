"""What the runner asks of a step kind, and the step kinds a layout may name (``RowLayout.step_kind``).

The one runner (``engine.runner.runner``) keeps what every row needs: its slot, the prefix cache and the
sampler. A step kind's module keeps the rest of its rows' state on the device and runs one step of them, in
one forward of its model, with each row's rule planning its span and reading the step back:

* **blocks** (``engine.runner.block_rows``): a row's span is its active block in a persistent batch, refreshed
  with its row or decoded over its cached context (LLaDA, Dream, SDAR, LLaDA2.x, Fast-dLLM v2);
* **anchored** (``engine.runner.anchored_rows``): one span a row after its stored context: a causal store, a
  denoised or drafted block, or a verified draft (Nemotron-Labs-Diffusion);
* **canvas** (``engine.runner.canvas_rows``): a store of a row's pending context, then its canvas, in the same
  forward (DiffusionGemma).
"""
from __future__ import annotations

from typing import Protocol

from engine.config import EngineConfig
from engine.models.kv_cache import KVCache
from engine.models.loader import DiffusionLM
from engine.rules.base import DecodingRule
from engine.runner.memory_model import MemoryModel
from engine.runner.prefix_cache import PrefixCache
from engine.runner.sampler import Sampler
from engine.runner.slots import SlotAllocator
from engine.scheduling.outputs import RunnerOutput, SchedulerOutput
from engine.scheduling.request import Request


class StepRows(Protocol):
    """One step kind's side of the runner's step: its device state, its forward and its rule's reading."""

    rule: DecodingRule  # the rule that plans its rows' spans and reads them back
    cache: KVCache | None  # every layer's keys and values of every slot (None: the rows keep none)
    page_length: int  # positions of a prefix-cache page
    rows_per_chunk: int | None  # rows whose vocabulary-sized temporaries a step holds at once (None: every row's)

    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int, rule: DecodingRule,
                 slots: SlotAllocator[Request], sampler: Sampler) -> None: ...

    @staticmethod
    def memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
        """What its rows take: the arena allocated once, and what a step adds (checked before allocating)."""

    def reusable_pages(self, request: Request) -> int:
        """The most prompt pages a joining row may take from the prefix cache."""

    def admit(self, request: Request, cached: int) -> None:
        """A joining row, in the slot it was given with its first ``cached`` prompt positions already there."""

    def claim_prompts(self, prefix_cache: PrefixCache, admitted: list[Request]) -> None:
        """Claim the joining rows' whole prompt pages for the prefix cache to keep, once every one has reused
        its run."""

    def run(self, scheduled: SchedulerOutput, prefix_cache: PrefixCache | None) -> RunnerOutput:
        """One forward of every scheduled row's span, then each row's result as its rule reads it."""

    def release(self, finished: list[Request], prefix_cache: PrefixCache | None) -> None:
        """The leaving rows' state goes (a block row's answer blocks enter the prefix cache first)."""


def step_rows_class(step_kind: str) -> type[StepRows]:
    """The step kind a layout names: "blocks", "anchored" or "canvas"."""
    from engine.runner.anchored_rows import AnchoredRows
    from engine.runner.block_rows import BlockRows
    from engine.runner.canvas_rows import CanvasRows

    kinds: dict[str, type[StepRows]] = {"blocks": BlockRows, "anchored": AnchoredRows, "canvas": CanvasRows}
    if step_kind not in kinds:
        raise ValueError(f"unknown step kind {step_kind!r}; known: {sorted(kinds)}")
    return kinds[step_kind]
