"""``dream``: Dream's ``diffusion_generate`` with ``alg`` maskgit_plus, topk_margin or entropy.

S steps per block; with t_k > s_k consecutive points of ``linspace(1, eps, S + 1)``, step k commits
``int(m * (1 - s_k / t_k))`` of the m positions still masked (float32, truncated, so a step may commit
nothing), highest score first, and the last step commits the rest. The score is Dream's measure: the
candidate's probability (maskgit_plus), top-1 minus top-2 probability (topk_margin) or the negative
entropy ``sum p log(p + 1e-10)`` (entropy), all over the full softmax, MASK included. Dream runs this over
its whole canvas at once: one block of ``max_new_tokens``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.rules.base import Setting
from engine.rules.unmasking import UnmaskingRule, rank_by_confidence

DREAM_ALGS = ("maskgit_plus", "topk_margin", "entropy")  # Dream's diffusion_generate algs, less "origin"
DREAM_MEASURES = dict(zip(DREAM_ALGS, ("probability", "margin", "neg_entropy")))  # alg -> its score


def dream_alg_problem(alg: object) -> str | None:
    """Why ``alg`` is not one of Dream's algs offered here (None if it is)."""
    if alg in DREAM_ALGS:
        return None
    return (f"must be one of {DREAM_ALGS}, got {alg!r}"
            + (" (Dream's random 'origin' transfer is not offered)" if alg == "origin" else ""))


def dream_transfer_count(num_masked: torch.Tensor, step: torch.Tensor, steps: int, eps: float) -> torch.Tensor:
    """[rows] positions Dream's schedule commits at ``step`` (0-based) of ``steps``, m masks left.

    With t = ts[step], s = ts[step + 1] of ``ts = linspace(1, eps, steps + 1)`` (float32, as Dream):
    ``int(m * (1 - s / t))``, truncated, so early steps of a long schedule may commit nothing; the last
    step commits all m.
    """
    timesteps = torch.linspace(1, eps, steps + 1, device=num_masked.device, dtype=torch.float32)
    index = step.clamp(max=steps - 1)
    ratio = 1 - timesteps[index + 1] / timesteps[index]
    count = (num_masked.to(torch.float32) * ratio).long()
    return torch.where(step + 1 >= steps, num_masked, count)


DREAM_SETTINGS = {
    "dream_alg": Setting("maskgit_plus", lambda value: dream_alg_problem(value) is None,
                             f"one of {DREAM_ALGS} (Dream's random 'origin' transfer is not offered)"),
    "dream_eps": Setting(1e-3, lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
                             and 0.0 < value < 1.0, "in (0, 1)"),  # the schedule's last timestep
}


@dataclass(frozen=True)
class Dream(UnmaskingRule):
    dream_alg: str = "maskgit_plus"
    dream_eps: float = 1e-3  # the schedule's last timestep
    name: ClassVar[str] = "dream"
    settings: ClassVar[tuple[str, ...]] = ("steps_per_block",)
    own_settings: ClassVar[dict[str, Setting]] = DREAM_SETTINGS

    def __post_init__(self) -> None:
        if (problem := dream_alg_problem(self.dream_alg)) is not None:
            raise ValueError(f"dream_alg {problem}")
        if self.steps_per_block is None:
            raise ValueError("decoding 'dream' needs steps_per_block (Dream's steps)")

    @classmethod
    def requirement_problems(cls, config: Any) -> list[tuple[str, str]]:
        if config.steps_per_block is None:
            return [("steps_per_block", "dream decoding needs Dream's number of steps per block")]
        return []

    @classmethod
    def refusal(cls, layout: Any) -> str | None:
        if cls.name in layout.refused_rules:
            return (f"EngineConfig.decoding: 'dream' is Dream's sampler over a whole canvas; {layout.family} "
                    "decodes block by block: use low_confidence_dynamic, low_confidence, threshold or quota")
        return super().refusal(layout)

    @property
    def measure(self) -> str:
        return DREAM_MEASURES[self.dream_alg]

    def choose(self, confidence: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        ranks, _ = rank_by_confidence(confidence, masked)
        count = dream_transfer_count(masked.sum(-1), step, self.steps_per_block, self.dream_eps)
        return masked & (ranks < count[:, None])
