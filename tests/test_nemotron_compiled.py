"""Nemotron-Labs-Diffusion with ``compile=True``: the layers run as one graph whose sizes are symbols, and every
mode still answers as the remote code does, batched with rows joining (the prompts and answers of
``tests/fixtures/nemotron_remote_code.json``)."""
from __future__ import annotations

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from tests.test_nemotron_labs_diffusion import MODES, NEMOTRON_DIR, REMOTE_CODE


@pytest.fixture(scope="module")
def compiled():
    return load_model(NEMOTRON_DIR, dtype="float32", compile=True)


@pytest.mark.parametrize("mode", ["dlm_threshold_0.9", "linear_spec_0.5"])
def test_compiled_modes_answer_as_the_remote_code(compiled, mode):
    engine = BlockServeEngine(compiled, EngineConfig(max_batch_size=5, **MODES[mode]))
    outputs = engine.generate(REMOTE_CODE["prompts"], SamplingParams(max_new_tokens=REMOTE_CODE["max_new_tokens"]))
    eos = compiled.special_ids.eos_id
    ours = [output.token_ids + ([eos] if output.finish_reason == "eos" else []) for output in outputs]
    assert ours == REMOTE_CODE["modes"][mode]["answers"]


def test_compile_and_batch_invariant_cannot_be_combined():
    with pytest.raises(ValueError, match="batch_invariant"):
        load_model(NEMOTRON_DIR, compile=True, batch_invariant=True)
