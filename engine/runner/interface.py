"""What the engine asks of a runner, and the runners a layout may name (``RowLayout.runner``).

A runner owns the device state of its rows and runs one step of them: the block runner
(``engine.runner.block_runner``) decodes blocks with a block rule, the span runner (``engine.runner.span_runner``)
runs each row's spans as its rule plans them (Nemotron-Labs-Diffusion's anchored rows, DiffusionGemma's
canvases). Both take the scheduler's decisions and return results keyed by request id; neither decides who runs.
"""
from __future__ import annotations

from typing import Protocol

from engine.config import EngineConfig
from engine.models.loader import DiffusionLM
from engine.rules.base import DecodingRule
from engine.scheduling.outputs import RunnerOutput, SchedulerOutput
from engine.scheduling.prefix_index import PrefixIndex
from engine.scheduling.request import Request


class KeepsPrefixes(Protocol):
    """A runner's prefix cache, as the engine and the scheduler read it."""

    index: PrefixIndex  # which prompt blocks (or pages) it holds


class Runner(Protocol):
    rule: DecodingRule  # the rule its rows decode with
    prefix_cache: KeepsPrefixes | None  # the prompts' keys and values it keeps (None: none)

    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int, rule: DecodingRule) -> None: ...

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        """Apply ``scheduled`` to its rows and run them for one step."""

    def release(self, finished: list[Request]) -> None:
        """The rows that left give their slots back."""


def runner_class(name: str) -> type[Runner]:
    """The runner a layout names: "blocks" or "spans"."""
    from engine.runner.block_runner import BlockRunner
    from engine.runner.span_runner import SpanRunner

    runners: dict[str, type[Runner]] = {"blocks": BlockRunner, "spans": SpanRunner}
    if name not in runners:
        raise ValueError(f"unknown runner {name!r}; known: {sorted(runners)}")
    return runners[name]
