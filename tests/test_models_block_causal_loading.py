"""Loading the block-causal families (SDAR, LLaDA2) beside LLaDA and Dream: detection by architecture or
model type, refusals that name what is refused (an unknown model, a known diffusion LM that is not
served, a config key whose computation is not reproduced), the config defaults of each family's own
config class, the weight-name mapping (LLaDA2's fused q/k/v and per-expert tensors into stacked ones),
a checkpoint missing a tensor, and the partial RoPE the transformer applies.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.models import TransformerConfig, load_model
from engine.models.families import detect_family, llada2, sdar
from engine.models.layers import rotary_tables, rotate_
from tests.model_helpers import DREAM_DIR, LLADA_DIR

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SDAR_DIR, LLADA2_DIR = FIXTURES / "tiny-sdar", FIXTURES / "tiny-llada2"


def sdar_config(**changes) -> dict:
    return json.loads((SDAR_DIR / "config.json").read_text()) | changes


def llada2_config(**changes) -> dict:
    return json.loads((LLADA2_DIR / "config.json").read_text()) | changes


@pytest.mark.parametrize("config, family", [
    ({"architectures": ["SDARForCausalLM"]}, sdar.FAMILY), ({"model_type": "sdar"}, sdar.FAMILY),
    ({"architectures": ["LLaDA2MoeModelLM"]}, llada2.FAMILY), ({"model_type": "llada2_moe"}, llada2.FAMILY),
])
def test_block_causal_families_are_detected_by_architecture_or_model_type(config, family):
    assert detect_family(config, Path("x")) is family


@pytest.mark.parametrize("config, named", [
    ({"architectures": ["SDARMoeForCausalLM"], "model_type": "sdar_moe"}, "SDAR-MoE"),
    ({"architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe_veomni"}, "llada2_moe_veomni"),
    ({"architectures": ["NemotronLabsDiffusionVLModel"], "model_type": "nemotron_labs_diffusion_vlm"},
     "only the text model NemotronLabsDiffusionModel"),
])
def test_known_unserved_diffusion_models_are_refused_by_name(config, named):
    with pytest.raises(ValueError, match=named) as refusal:
        detect_family(config, Path("x"))
    assert "does not serve" in str(refusal.value) and "LLaDA, Dream, SDAR, LLaDA2, DiffusionGemma" in str(refusal.value)


def test_an_unknown_model_is_refused_naming_the_served_families():
    with pytest.raises(ValueError, match="LLaDA, Dream, SDAR, LLaDA2, DiffusionGemma") as refusal:
        detect_family({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, Path("x"))
    assert "gpt2" in str(refusal.value)


@pytest.mark.parametrize("key, value", [
    ("use_sliding_window", True), ("attention_bias", True), ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
    ("hidden_act", "gelu"),
])
def test_sdar_keys_we_do_not_compute_are_refused_by_name(key, value):
    with pytest.raises(ValueError, match=key):
        sdar.transformer_config(sdar_config(**{key: value}))


@pytest.mark.parametrize("key, value", [
    ("score_function", "softmax"), ("use_qkv_bias", True), ("use_bias", True), ("norm_head", True),
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}), ("model_type", "llada2_moe_veomni"),
])
def test_llada2_keys_we_do_not_compute_are_refused_by_name(key, value):
    with pytest.raises(ValueError, match=key):
        llada2.transformer_config(llada2_config(**{key: value}))


def test_llada2_defaults_are_its_config_class_defaults():
    config = llada2_config()
    for key in ("use_bias", "partial_rotary_factor", "rms_norm_eps", "head_dim", "rotary_dim"):
        config.pop(key)
    with pytest.raises(ValueError, match="use_bias"):  # LLaDA2MoeConfig defaults use_bias to True
        llada2.transformer_config(config)
    ours = llada2.transformer_config(config | {"use_bias": False, "num_key_value_heads": 0,
                                               "norm_topk_prob": False})
    assert ours.head_dim == 32 // 4 and ours.rotary_dim == 4  # partial_rotary_factor 0.5 by default
    assert ours.rms_norm_eps == 1e-5 and ours.num_kv_heads == ours.num_heads  # 0 kv heads: as many as q heads
    # norm_topk_prob is never read by the reference: top-k > 1 weights are renormalised anyway
    assert ours.moe.experts_per_token == 2


def test_sdar_head_dim_defaults_to_its_config_class_default_not_hidden_over_heads():
    config = sdar_config()
    config.pop("head_dim")
    assert sdar.transformer_config(config).head_dim == 128


def test_a_transformer_config_without_head_dim_uses_hidden_over_heads():
    config = TransformerConfig(vocab_size=10, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=4,
                               intermediate_size=8)
    assert (config.head_dim, config.rotary_dim, config.attention, config.moe) == (8, 8, "bidirectional", None)
    with pytest.raises(ValueError, match="rotary_dim"):
        TransformerConfig(vocab_size=10, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=4,
                          intermediate_size=8, rotary_dim=10)


def test_bidirectional_families_keep_their_attention_and_have_no_block_length():
    for directory in (LLADA_DIR, DREAM_DIR):
        lm = load_model(directory)
        assert (lm.row_kind, lm.block_length) == ("bidirectional", None)


def test_llada2_weight_names_map_fused_qkv_and_per_expert_tensors():
    names = llada2.WEIGHT_NAMES
    assert names.ours("model.layers.3.attention.query_key_value.weight") == "layers.3.attention.query_key_value.weight"
    assert names.ours("model.layers.3.attention.dense.weight") == "layers.3.attention.o_proj.weight"
    assert names.ours("model.layers.3.mlp.experts.17.up_proj.weight") == "layers.3.mlp.experts.17.up_proj.weight"
    assert names.ours("model.layers.3.mlp.gate.expert_bias") == "layers.3.mlp.gate.expert_bias"
    assert names.ours("model.rotary_emb.inv_freq") is None
    assert names.theirs_of("layers.3.attention.q_proj.weight") is None  # LLaDA2 stores q/k/v fused
    assert names.theirs_of("embed_tokens.weight") == "model.word_embeddings.weight"


def test_checkpoint_tensors_offer_fused_and_per_expert_views_of_our_parameters():
    model = load_model(LLADA2_DIR).model
    tensors = model.checkpoint_tensors()
    moe = model.layers[1].mlp
    intermediate = moe.config.moe_intermediate_size
    up = tensors["layers.1.mlp.experts.3.up_proj.weight"]
    assert up.data_ptr() == moe.experts.gate_up_proj[3, intermediate:].data_ptr()
    assert up.shape == (intermediate, model.config.hidden_size)
    assert tensors["layers.1.attention.query_key_value.weight"] is model.layers[1].attention.qkv_proj.weight
    assert "layers.1.mlp.gate.expert_bias" in tensors and "layers.1.mlp.experts_touched" not in tensors


def test_a_checkpoint_missing_an_expert_tensor_is_refused_naming_it(tmp_path):
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "llada2"
    shutil.copytree(LLADA2_DIR, directory)
    state = load_file(str(directory / "model.safetensors"))
    del state["model.layers.2.mlp.experts.6.down_proj.weight"]
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(ValueError, match=r"layers\.2\.mlp\.experts\.6\.down_proj\.weight"):
        load_model(directory)


def test_an_sdar_checkpoint_with_a_tied_head_loads_without_lm_head(tmp_path):
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "sdar"
    shutil.copytree(SDAR_DIR, directory)
    state = load_file(str(directory / "model.safetensors"))
    del state["lm_head.weight"]
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(sdar_config(tie_word_embeddings=True)))
    model = load_model(directory).model
    assert model.lm_head.weight is model.embed_tokens.weight


def test_partial_rope_rotates_the_first_rotary_dims_and_passes_the_rest():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 16, generator=generator)  # [tokens, heads, head_dim]
    positions = torch.arange(5) * 7
    cos, signed_sin = rotary_tables(positions, 8, 600000.0, torch.float32)
    rotated = rotate_(x.clone(), cos, signed_sin)
    assert torch.equal(rotated[..., 8:], x[..., 8:])
    # rotate-half within the first 8 dims, frequencies theta^(-2i/8) (the rotary dim is the denominator)
    inv_freq = 600000.0 ** -(torch.arange(0, 8, 2).float() / 8)
    angles = positions[:, None, None].float() * inv_freq
    x1, x2 = x[..., :4], x[..., 4:8]
    expected = torch.cat([x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()], -1)
    torch.testing.assert_close(rotated[..., :8], expected, rtol=0, atol=1e-6)
