"""DiffusionGemma's config.json read as transformers reads it, and its settings named in its own words."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from engine import BlockServeEngine, EngineConfig
from engine.models.loader import load_model

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-diffusion_gemma"


@pytest.mark.parametrize("per_layer_config", [{}, None, "absent"])
def test_global_layer_shapes_follow_transformers_whatever_per_layer_config_says(per_layer_config):
    """``per_layer_config: {}`` (what transformers writes when the global head equals the sliding one) gives
    the global layers the base head size; only a config without the key falls back to ``global_head_dim``."""
    from transformers import DiffusionGemmaConfig

    from engine.models.diffusion_gemma.config import gemma_text_config

    config = json.loads((FIXTURE / "config.json").read_text())
    if per_layer_config == "absent":
        del config["text_config"]["per_layer_config"]
    else:
        config["text_config"]["per_layer_config"] = per_layer_config
    theirs = DiffusionGemmaConfig(**config).text_config
    expected = [(theirs.per_layer_config[index].head_dim, theirs.per_layer_config[index].num_key_value_heads)
                for index in range(len(theirs.layer_types))]
    assert [(layer.head_dim, layer.num_kv_heads) for layer in gemma_text_config(config).layers] == expected


def test_a_canvas_of_another_length_is_warned_of_as_a_canvas_not_a_block_causal_mask(caplog):
    lm = load_model(FIXTURE)
    with caplog.at_level(logging.WARNING, logger="engine.scheduling.model_fit"):
        BlockServeEngine(lm, EngineConfig(block_length=16, max_denoising_steps=2, max_batch_size=1))
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "canvas_length" in warning and "canvases are 8 tokens" in warning and "block-causal" not in warning
