"""An engine settles its config against the model it runs: a block-causal model decodes in the block it
was trained with unless told otherwise, and a family layout that would decode wrongly is refused at load."""
from __future__ import annotations

import logging

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.families import sdar
from engine.models.loader import load_model
from engine.runner.batch_inputs import step_parts
from engine.runner.parts_shifted_block_causal import ShiftedBlockCausalParts
from tests.conftest import FIXTURES


def test_a_block_causal_model_decodes_in_its_trained_block_unless_told_otherwise():
    engine = BlockServeEngine.from_pretrained(FIXTURES / "tiny-sdar")  # config.json: block_size 4
    assert engine.config.block_length == engine.runner.rows.batch.block_length == 4
    output = engine.generate([[5, 6, 7, 8, 9, 10]], SamplingParams(max_new_tokens=9, stop_at_eos=False))[0]
    assert output.num_blocks == 3  # the first block holds 2 prompt tokens: 2 + 9 columns span 3 blocks of 4
    assert len(output.token_ids) == 9


def test_llada2_decodes_in_blocks_of_32_by_default():
    engine = BlockServeEngine.from_pretrained(FIXTURES / "tiny-llada2")
    assert engine.config.block_length == 32


def test_a_full_attention_model_keeps_blocks_of_32_by_default():
    engine = BlockServeEngine.from_pretrained(FIXTURES / "tiny-llada")  # its generation_config names no block
    assert engine.config.block_length == 32


def test_a_model_whose_generation_config_names_a_block_decodes_with_it():
    assert BlockServeEngine.from_pretrained("tiny").config.block_length == 8


def test_another_block_on_a_block_causal_model_runs_with_one_warning_naming_the_trained_size(caplog):
    lm = load_model(FIXTURES / "tiny-sdar")
    with caplog.at_level(logging.WARNING, logger="engine.scheduling.model_fit"):
        engine = BlockServeEngine(lm, EngineConfig(block_length=8))
        engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=8))
        BlockServeEngine(lm, EngineConfig(block_length=8, max_batch_size=2))  # a second engine on that model
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert engine.config.block_length == 8
    assert len(warnings) == 1 and "trained with blocks of 4" in warnings[0], warnings


def test_the_trained_block_given_explicitly_runs_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="engine.scheduling.model_fit"):
        BlockServeEngine(load_model(FIXTURES / "tiny-sdar"), EngineConfig(block_length=4))
    assert not caplog.records


def test_a_block_causal_family_with_a_logit_shift_reads_its_logits_one_column_left(monkeypatch):
    monkeypatch.setattr(sdar, "LOGIT_SHIFT", 1)  # as Fast-dLLM v2's: a block's first position is read one column left
    lm = load_model(FIXTURES / "tiny-sdar")
    assert lm.layout.step_kind == "blocks" and isinstance(step_parts(lm.layout), ShiftedBlockCausalParts)
    with pytest.raises(ValueError, match="shifted_decoding: 'lookback'"):
        BlockServeEngine(lm, EngineConfig(shifted_decoding="lookback"))
