"""DiffusionGemma's vocabulary-sized temporaries: a step holds one chunk of rows' at a time, whatever its
batch, with the tokens unchanged; the memory model prices one chunk."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.loader import load_model
from engine.runner import canvas_runner, memory
from engine.scheduling.model_fit import config_for_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-diffusion_gemma"
PROMPTS = ("Hello there, how are you?", "2+2=", "The quick brown fox", "a", "Write a poem", "xyz 123", "Tell me",
           "Why is the sky blue?")
SETTINGS = {"max_denoising_steps": 6, "stability_threshold": 0, "confidence_threshold": 0.3}

class LargestLogits(TorchDispatchMode):
    """The most rows of canvas logits (``[..., canvas, vocab]``) that any one tensor a torch op makes holds."""

    def __init__(self, canvas: int, vocab: int) -> None:
        super().__init__()
        self.canvas, self.vocab, self.rows = canvas, vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(tensor, torch.Tensor) and tuple(tensor.shape[-2:]) == (self.canvas, self.vocab):
                self.rows = max(self.rows, tensor.numel() // (self.canvas * self.vocab))
        return result


@pytest.fixture(scope="module")
def lm():
    return load_model(FIXTURE)


def generate(lm, rows: int, chunk_rows: int | None = None) -> tuple[list[list[int]], int]:
    """``rows`` prompts at once in chunks of ``chunk_rows`` rows (None: the default): their tokens, and the
    most rows of logits one tensor held."""
    canvas = lm.model.config.canvas_length
    with pytest.MonkeyPatch.context() as patch:
        if chunk_rows is not None:
            patch.setattr(canvas_runner, "VOCAB_CHUNK_ELEMENTS", chunk_rows * canvas * lm.vocab_size)
        engine = BlockServeEngine(lm, EngineConfig(max_batch_size=rows, **SETTINGS))
    params = [SamplingParams(max_new_tokens=16, seed=seed) for seed in range(rows)]
    with LargestLogits(canvas, lm.vocab_size) as largest:
        outputs = engine.generate(list(PROMPTS[:rows]), params)
    return [output.token_ids for output in outputs], largest.rows


def test_a_steps_logits_stay_one_chunk_from_2_to_8_rows_and_the_tokens_are_unchanged(lm):
    whole, whole_rows = generate(lm, 8)  # the fixture's vocabulary is small: every row in one chunk
    assert whole_rows == 8
    chunked = {rows: generate(lm, rows, chunk_rows=2) for rows in (2, 8)}
    assert chunked[2][1] == chunked[8][1] == 2
    assert chunked[8][0] == whole
    assert chunked[2][0] == whole[:2]


def test_the_memory_model_prices_one_chunk_of_logits(lm, monkeypatch):
    canvas = lm.model.config.canvas_length
    monkeypatch.setattr(canvas_runner, "VOCAB_CHUNK_ELEMENTS", 2 * canvas * lm.vocab_size)
    model = memory.memory_model(lm, config_for_model(EngineConfig(max_batch_size=8), lm))
    assert model.logit_rows == BlockServeEngine(lm, EngineConfig(max_batch_size=8)).runner.rows_per_chunk == 2
    assert model.step_bytes(0, 1) == model.logit_bytes_per_row
    assert model.step_bytes(0, 2) == model.step_bytes(0, 8) == 2 * model.logit_bytes_per_row

