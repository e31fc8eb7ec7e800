"""DiffusionGemma's decoding rule (``decoding="entropy_bound"``): one denoising step of many canvases.

Per row, as transformers' ``DiffusionGemmaGenerationMixin`` does at batch 1 (``generation_diffusion_gemma``):
the logits are divided by a temperature falling linearly from ``t_max`` to ``t_min`` over
``max_denoising_steps``; a candidate canvas is sampled from them; the lowest-entropy positions whose
entropies sum, less their largest, to at most ``entropy_bound`` take the candidate's tokens and the
others are renoised with uniform random tokens; the row stops early once its argmax canvas has not
changed for ``stability_threshold`` steps and its mean entropy is below ``confidence_threshold``. The
committed canvas is the argmax canvas.

Each row draws from its own generator, in the reference's order (the canvas, then per step the sample
and the renoise), so a seeded row gives the reference's tokens after ``torch.manual_seed(seed)`` at
batch 1, and the same tokens in any batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributions import Categorical

from engine.config import CANVAS_SETTINGS, EngineConfig


@dataclass(frozen=True)
class CanvasRule:
    max_denoising_steps: int
    entropy_bound: float
    t_min: float
    t_max: float
    stability_threshold: int
    confidence_threshold: float

    @classmethod
    def from_config(cls, config: EngineConfig) -> CanvasRule:
        """The rule of a config settled for a canvas model (``engine.scheduling.model_fit``)."""
        return cls(**{name: getattr(config, name) for name in CANVAS_SETTINGS})


@dataclass
class CanvasStepResult:
    canvas: torch.Tensor  # [rows, canvas] the next step's input (accepted and renoised)
    argmax: torch.Tensor  # [rows, canvas] the argmax canvas: what a stopping row commits
    processed_logits: torch.Tensor  # [rows, canvas, vocab] temperature-scaled: the next self-conditioning
    stopped: torch.Tensor  # [rows] stable and confident
    history: torch.Tensor  # [rows, stability_threshold, canvas] argmax canvases of the last steps


def initial_canvas(generator: torch.Generator, length: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """A canvas of uniform random tokens ``[1, length]``, drawn as the reference's ``initialize_canvas``."""
    return torch.randint(0, vocab_size, (1, length), generator=generator, device=device)


def empty_history(rows: int, rule: CanvasRule, length: int, device: torch.device) -> torch.Tensor:
    """No argmax canvas seen yet: -1 everywhere, so a canvas never stops at its first step (the reference's)."""
    return torch.full((rows, rule.stability_threshold, length), -1, dtype=torch.long, device=device)


def temperatures(rule: CanvasRule, steps_left: torch.Tensor) -> torch.Tensor:
    """The temperature of each row's step (``steps_left`` counts this one), in the reference's float32 ops."""
    return rule.t_min + (rule.t_max - rule.t_min) * (steps_left.to(torch.int32) / rule.max_denoising_steps)


def denoise(rule: CanvasRule, logits: torch.Tensor, canvas: torch.Tensor, history: torch.Tensor,
            steps_left: torch.Tensor, generators: list[torch.Generator]) -> CanvasStepResult:
    """One step of every row: ``logits [rows, canvas, vocab]`` float32 of the canvases ``canvas``."""
    processed = logits / temperatures(rule, steps_left)[:, None, None]
    probabilities = torch.softmax(processed, dim=-1, dtype=torch.float32)
    candidates = torch.cat([torch.multinomial(row, num_samples=1, generator=generator).view(1, -1)
                            for row, generator in zip(probabilities, generators)])
    argmax = processed.argmax(dim=-1)
    entropy = Categorical(logits=processed, validate_args=False).entropy()  # [rows, canvas]
    sorted_entropy, order = torch.sort(entropy, dim=-1)
    accepted_sorted = torch.cumsum(sorted_entropy, dim=-1) - sorted_entropy <= rule.entropy_bound
    accepted = torch.scatter(torch.zeros_like(accepted_sorted), -1, order, accepted_sorted)
    kept = torch.where(accepted, candidates, canvas)
    noise = torch.cat([initial_canvas(generator, canvas.shape[1], logits.shape[-1], canvas.device)
                       for generator in generators])
    renoised = torch.where(~accepted, noise, kept)
    if rule.stability_threshold == 0:
        stable = torch.ones(canvas.shape[0], dtype=torch.bool, device=canvas.device)
    else:
        stable = (history == argmax[:, None, :]).all(dim=-1).all(dim=-1)
        history = torch.cat([history[:, 1:], argmax[:, None, :]], dim=1)
    confident = entropy.mean(dim=-1) < rule.confidence_threshold
    return CanvasStepResult(renoised, argmax, processed, stable & confident, history)
