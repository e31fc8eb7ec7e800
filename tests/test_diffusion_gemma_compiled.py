"""DiffusionGemma's compiled step: its canvases run through one graph per bucket of rows and context columns,
and a seeded request gets the tokens of the eager step, which equal transformers' (``test_diffusion_gemma.py``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DiffusionGemmaForBlockDiffusion

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.diffusion_gemma.compiled import max_buckets
from engine.models.loader import load_model

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-diffusion_gemma"
PROMPTS = ("Hello there, how are you?", "2+2=", "Write a poem", "a")  # contexts within 64 columns
SETTINGS = {"max_denoising_steps": 6, "stability_threshold": 0, "confidence_threshold": 0.3}


@pytest.fixture(scope="module")
def compiled():
    return load_model(FIXTURE, compile=True)


def generate(lm, max_batch_size: int = 2) -> list[list[int]]:
    params = [SamplingParams(max_new_tokens=16, seed=seed) for seed in range(len(PROMPTS))]
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=max_batch_size, **SETTINGS))
    return [output.token_ids for output in engine.generate(list(PROMPTS), params)]


def test_compiled_canvases_give_the_eager_tokens_through_one_graph_per_bucket(compiled):
    assert generate(compiled) == generate(load_model(FIXTURE))
    graphs = compiled.model.compiled
    assert graphs.failures == {}
    buckets = {(kind, rows, keys) for kind in ("decode", "store") for rows in (1, 2) for keys in (32, 64)}
    assert graphs.graphs <= buckets  # rows and context columns bucketed
    assert {("decode", 2, 32), ("store", 1, 32)} <= graphs.graphs  # committed canvases stored by a graph


def test_a_compiled_row_alone_gives_transformers_tokens(compiled):
    reference = DiffusionGemmaForBlockDiffusion.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    ids = compiled.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    torch.manual_seed(0)
    expected = reference.generate(ids, max_new_tokens=16, **SETTINGS).sequences[0, ids.shape[1]:].tolist()
    stop = next((i for i, token in enumerate(expected) if token in compiled.special_ids.stop_ids), len(expected))
    engine = BlockServeEngine(compiled, EngineConfig(max_batch_size=2, **SETTINGS))
    assert engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=16, seed=0))[0].token_ids == expected[:stop]


def test_dynamo_keeps_a_graph_for_every_bucket_the_release_config_meets():
    """32 slots of 4,096 columns: rows in 6 powers of two, context columns in 14 width buckets."""
    assert max_buckets(32, 4096) == 6 * 14
