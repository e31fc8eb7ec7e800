"""DiffusionGemma's vocabulary-sized temporaries: a step holds one chunk of rows' at a time, whatever its
batch, with the tokens unchanged; the memory model prices one chunk; and the 26B-A4B job config's batch
fits an 80 GB GPU by the engine's own check, its FP8 config's a 48 GB GPU."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.layers.fp8_modules import to_fp8
from engine.layers.quantization import fp8_scheme
from engine.models.diffusion_gemma.config import gemma_text_config
from engine.models.diffusion_gemma.model import DiffusionGemmaTransformer
from engine.models.families import diffusion_gemma
from engine.models.loader import DiffusionLM, load_model
from engine.runner import canvas_rows, memory
from engine.scheduling.model_fit import config_for_model
from pipeline.config import load_config

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-diffusion_gemma"
PROMPTS = ("Hello there, how are you?", "2+2=", "The quick brown fox", "a", "Write a poem", "xyz 123", "Tell me",
           "Why is the sky blue?")
SETTINGS = {"max_denoising_steps": 6, "stability_threshold": 0, "confidence_threshold": 0.3}
GPU_BYTES = 80 * 10**9  # an 80 GB GPU, CUDA's own context aside (an H100 80GB offers about 79 GiB)
GEMMA_26B = {"model_type": "diffusion_gemma", "canvas_length": 256, "text_config": {  # the model card's text stack
    "vocab_size": 262_144, "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": 30,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512,
    "num_global_key_value_heads": 2, "sliding_window": 1024, "num_experts": 128, "top_k_experts": 8,
    "moe_intermediate_size": 704, "max_position_embeddings": 262_144,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5}}


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
            patch.setattr(canvas_rows, "VOCAB_CHUNK_ELEMENTS", chunk_rows * canvas * lm.vocab_size)
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
    monkeypatch.setattr(canvas_rows, "VOCAB_CHUNK_ELEMENTS", 2 * canvas * lm.vocab_size)
    model = memory.memory_model(lm, config_for_model(EngineConfig(max_batch_size=8), lm))
    assert model.logit_rows == BlockServeEngine(lm, EngineConfig(max_batch_size=8)).runner.rows_per_chunk == 2
    assert model.step_bytes(0, 1) == model.logit_bytes_per_row
    assert model.step_bytes(0, 2) == model.step_bytes(0, 8) == 2 * model.logit_bytes_per_row


def gemma_26b() -> DiffusionLM:
    """The 26B-A4B text stack in bf16 on the meta device: shapes and byte counts, no weights."""
    config = gemma_text_config(GEMMA_26B)
    with torch.device("meta"):
        model = DiffusionGemmaTransformer(config).to(torch.bfloat16)
    return DiffusionLM("google/diffusiongemma-26B-A4B-it", diffusion_gemma.NAME, model, tokenizer=None,
                       special_ids=None, layout=diffusion_gemma.layout(GEMMA_26B),
                       max_length=config.max_position_embeddings)


def test_the_26b_config_fits_an_80_gb_gpu_by_the_engines_own_check(monkeypatch, caplog):
    lm = gemma_26b()
    config = config_for_model(load_config(ROOT / "configs" / "diffusiongemma-26b-a4b.yaml").engine, lm)
    weights = memory.memory_model(lm, config).weight_bytes
    monkeypatch.setattr(memory, "available_bytes", lambda device: GPU_BYTES - weights)  # the weights are in
    with caplog.at_level(logging.WARNING, logger="engine.runner.memory"):
        model = memory.check_arena_fits(lm, config)
    assert caplog.records == []  # neither the arena nor a full-budget step is over
    assert config.max_batch_size == 32 and model.logit_rows == 2  # two rows' logits of 32
    budget = config.resolved_token_budget(lm.max_length)
    every_row = dataclasses.replace(model, logit_rows=None)  # each of the 32 rows' logits at once
    assert weights + model.arena_bytes + every_row.step_bytes(budget, 32) > GPU_BYTES


def test_the_26b_fp8_config_fits_a_48_gb_gpu_by_the_engines_own_check(monkeypatch, caplog):
    lm = gemma_26b()
    bf16_weights = sum(tensor.nbytes for tensor in lm.model.parameters())
    to_fp8(lm.model, fp8_scheme({}, "fp8", "the 26B-A4B shape"), diffusion_gemma.WEIGHT_NAMES.theirs_of)
    config = config_for_model(load_config(ROOT / "configs" / "diffusiongemma-26b-a4b-fp8.yaml").engine, lm)
    weights = memory.memory_model(lm, config).weight_bytes
    assert config.quantization == "fp8" and weights < 0.52 * bf16_weights < 48 * 10**9 < bf16_weights
    monkeypatch.setattr(memory, "available_bytes", lambda device: 48 * 10**9 - weights)
    with caplog.at_level(logging.WARNING, logger="engine.runner.memory"):
        model = memory.check_arena_fits(lm, config)
    assert caplog.records == []  # neither the arena nor a full-budget step is over
    budget = config.resolved_token_budget(lm.max_length)
    assert weights + model.arena_bytes + model.step_bytes(budget, config.max_batch_size) < 0.9 * 48 * 10**9
