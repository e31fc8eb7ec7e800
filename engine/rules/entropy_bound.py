"""``entropy_bound``: DiffusionGemma's canvas sampler, one denoising step of many canvases.

Per row, as transformers' ``DiffusionGemmaGenerationMixin`` does at batch 1 (``generation_diffusion_gemma``):
the logits, with the request's logit bias (where the reference applies a caller's ``logits_processor``),
are divided by a temperature falling linearly from ``t_max`` to ``t_min`` over
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

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from engine.rules.base import CanvasRule, Setting

# unset: the checkpoint's generation_config.json, else these (transformers' DiffusionGemmaGenerationConfig)
CANVAS_DEFAULTS = {"max_denoising_steps": 48, "entropy_bound": 0.1, "t_min": 0.4, "t_max": 0.8,
                   "stability_threshold": 1, "confidence_threshold": 0.005}
CANVAS_SETTINGS = tuple(CANVAS_DEFAULTS)
# float32 [canvas, vocab] copies a row's step holds at once, at most: the logits (scaled in place), then
# their softmax and one multinomial draw's noise, or their normalized logits and p log p (``entropies``)
VOCAB_COPIES = 3


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _unset_or(valid, what: str) -> Setting:
    """A canvas setting: None (the checkpoint's, else CANVAS_DEFAULTS) or a valid value."""
    return Setting(None, lambda value: value is None or valid(value), f"{what} or None")


CANVAS_SETTING_RULES = {  # transformers' names
    "max_denoising_steps": _unset_or(lambda v: _int(v, 1), "a positive int"),  # denoising steps of a canvas
    "entropy_bound": _unset_or(lambda v: _number(v) and v > 0, "a number > 0"),  # accept while sum - max <= this
    "t_min": _unset_or(lambda v: _number(v) and v > 0, "a temperature > 0"),  # at the last step
    "t_max": _unset_or(lambda v: _number(v) and v > 0, "a temperature > 0"),  # at the first step
    "stability_threshold": _unset_or(lambda v: _int(v, 0), "an int >= 0"),  # steps unchanged to stop early
    "confidence_threshold": _unset_or(lambda v: _number(v) and v >= 0, "a number >= 0"),  # ... mean entropy below
}


@dataclass(frozen=True)
class EntropyBound(CanvasRule):
    """DiffusionGemma's sampler; its rows run as canvas rows (``engine.runner.canvas_rows``)."""

    max_denoising_steps: int
    entropy_bound: float
    t_min: float
    t_max: float
    stability_threshold: int
    confidence_threshold: float
    name: ClassVar[str] = "entropy_bound"
    own_settings: ClassVar[dict[str, Setting]] = CANVAS_SETTING_RULES
    vocab_copies: ClassVar[int] = VOCAB_COPIES

    @classmethod
    def settle(cls, config: Any, checkpoint_settings: dict) -> Any:
        """Every unset canvas setting from the checkpoint's generation_config.json, else transformers' default."""
        settled = {name: checkpoint_settings.get(name, CANVAS_DEFAULTS[name]) for name in CANVAS_SETTINGS
                   if getattr(config, name) is None}
        return dataclasses.replace(config, **settled)

    @classmethod
    def refusal(cls, layout: Any) -> str | None:
        if layout.row_kind != "canvas":
            return (f"EngineConfig.decoding: 'entropy_bound' is DiffusionGemma's canvas sampler; {layout.family} "
                    "unmasks blocks" + cls._alternatives(layout))
        return None

    def request_problem(self, params: Any) -> str | None:
        """What transformers' ``generate`` does not define for this sampler: a request temperature (the
        sampler follows its own schedule) and top-k / top-p (its generation config has no such fields). A
        request's ``logit_bias`` and ``logprobs`` are offered (``engine.runner.canvas_rows``)."""
        if params.temperature != 0.0:
            return ("temperature is not offered for diffusion_gemma: its canvas sampler follows its own "
                    "temperature schedule, from t_max at a canvas's first denoising step to t_min at its last; "
                    "set EngineConfig t_min and t_max instead and leave temperature unset")
        for name, set_ in (("top_k", params.top_k != 0), ("top_p", params.top_p != 1.0)):
            if set_:
                return (f"{name} is not offered for diffusion_gemma: transformers' DiffusionGemma generate "
                        "defines none, and its canvas sampler draws from the whole vocabulary; leave it unset "
                        "(logit_bias -100 keeps a token out)")
        return super().request_problem(params)

    def initial_canvas(self, generator: torch.Generator, length: int, vocab_size: int,
                       device: torch.device) -> torch.Tensor:
        return initial_canvas(generator, length, vocab_size, device)

    def empty_history(self, rows: int, length: int, device: torch.device) -> torch.Tensor:
        return empty_history(rows, self, length, device)

    def scale(self, logits: torch.Tensor, steps_left: torch.Tensor) -> torch.Tensor:
        return scale(self, logits, steps_left)

    def denoise(self, logits: torch.Tensor, canvas: torch.Tensor, history: torch.Tensor, steps_left: torch.Tensor,
                generators: list[torch.Generator]) -> CanvasStepResult:
        return denoise(self, logits, canvas, history, steps_left, generators)


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


def empty_history(rows: int, rule: EntropyBound, length: int, device: torch.device) -> torch.Tensor:
    """No argmax canvas seen yet: -1 everywhere, so a canvas never stops at its first step (the reference's)."""
    return torch.full((rows, rule.stability_threshold, length), -1, dtype=torch.long, device=device)


def temperatures(rule: EntropyBound, steps_left: torch.Tensor) -> torch.Tensor:
    """The temperature of each row's step (``steps_left`` counts this one), in the reference's float32 ops."""
    return rule.t_min + (rule.t_max - rule.t_min) * (steps_left.to(torch.int32) / rule.max_denoising_steps)


def entropies(logits: torch.Tensor) -> torch.Tensor:
    """``Categorical(logits=logits).entropy()`` in its own operations, so the same values, holding two
    float32 copies of ``logits`` at once where it holds four."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    p_log_p = F.softmax(normalized, dim=-1).mul_(normalized.clamp_(min=torch.finfo(logits.dtype).min))
    return -p_log_p.sum(-1)


def scale(rule: EntropyBound, logits: torch.Tensor, steps_left: torch.Tensor) -> torch.Tensor:
    """``logits [rows, canvas, vocab]`` divided in place by each row's temperature: what the sampler reads,
    and whose argmax a canvas commits."""
    return logits.div_(temperatures(rule, steps_left)[:, None, None])


def denoise(rule: EntropyBound, logits: torch.Tensor, canvas: torch.Tensor, history: torch.Tensor,
            steps_left: torch.Tensor, generators: list[torch.Generator]) -> CanvasStepResult:
    """One step of every row: ``logits [rows, canvas, vocab]`` float32 of the canvases ``canvas`` (with
    any logit bias), divided by the temperature in place (they become the result's ``processed_logits``).
    At most three float32 copies of the logits exist at once: ``VOCAB_COPIES``."""
    processed = scale(rule, logits, steps_left)
    probabilities = torch.softmax(processed, dim=-1, dtype=torch.float32)
    candidates = torch.cat([torch.multinomial(row, num_samples=1, generator=generator).view(1, -1)
                            for row, generator in zip(probabilities, generators)])
    del probabilities
    argmax = processed.argmax(dim=-1)
    entropy = entropies(processed)  # [rows, canvas]
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
