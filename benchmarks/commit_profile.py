"""How many masked positions a denoising step commits: the replay's commit profile.

A tiny or random model's confidences say nothing about how fast a real model converges, so the replay
decides it: for every (request, block, masked positions left) a count k is drawn once from the profile,
and the steering wrapper (``benchmarks.steering``) lifts that many masked positions above any
threshold and holds the rest below 0.5. The draws are a table fixed by the seed, so every schedule
(and the reference loop) sees the same commits, on any weights.

Default profile, ``llada-threshold-0.9``: LLaDA-8B-Instruct with Fast-dLLM's confidence-aware parallel
decoding (threshold 0.9, block 32) needs roughly 2-3.5 committed tokens per step on GSM8K and HumanEval:
its NFE figures (Wu et al., "Fast-dLLM", arXiv 2505.22618, Tables 1-2: throughput and NFE against the
256-step baseline) and the threshold-0.9 baselines of dParallel (Chen et al., arXiv 2509.26488) give
~9-16 steps per 32-token content block. The distribution below has mean 2.77 (about 11.6 steps per
content block) with a long tail (easy spans commit 6-8 at once). Positions past the answer's end are
EOS, which a real model is certain of: they commit at the first step that sees them, so an all-EOS
block takes one step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CommitProfile:
    name: str
    probabilities: tuple[float, ...]  # P(k) for k = 1, 2, ...: content positions committed by one step
    source: str

    def __post_init__(self) -> None:
        if not self.probabilities or min(self.probabilities) < 0 or abs(sum(self.probabilities) - 1) > 1e-6:
            raise ValueError(f"commit profile {self.name!r}: probabilities must be >= 0 and sum to 1")

    @property
    def mean(self) -> float:
        return sum(k * p for k, p in enumerate(self.probabilities, start=1))

    def draw(self, shape: tuple[int, ...], seed: int) -> torch.Tensor:
        """int64 counts k >= 1 of ``shape``, the same for the same seed on every machine."""
        generator = torch.Generator().manual_seed(seed)
        weights = torch.tensor(self.probabilities, dtype=torch.float64)
        flat = torch.multinomial(weights, math.prod(shape), replacement=True, generator=generator)
        return (flat + 1).reshape(shape)


LLADA_THRESHOLD_09 = CommitProfile(
    "llada-threshold-0.9", (0.30, 0.25, 0.17, 0.11, 0.07, 0.05, 0.03, 0.02),
    "Fast-dLLM (arXiv 2505.22618) NFE and dParallel (arXiv 2509.26488) threshold-0.9 baselines: "
    "2-3.5 tokens per step on GSM8K/HumanEval; this profile's mean is 2.77")
PROFILES: dict[str, CommitProfile | None] = {
    LLADA_THRESHOLD_09.name: LLADA_THRESHOLD_09,
    "none": None,  # the model's own confidences decide (the replay before the commit profile)
}


def profile_named(name: str) -> CommitProfile | None:
    if name not in PROFILES:
        raise ValueError(f"unknown commit profile {name!r}; choose from {sorted(PROFILES)}")
    return PROFILES[name]
