"""LLaDA's computation keys in its config.json: the ones we implement (full-precision rotation, input
embedding norm, scaled logits) follow its modeling code, and one we would compute differently is refused
at load, naming it."""
from __future__ import annotations

import json

import pytest
import torch

from engine.models import DiffusionLM, load_model
from tests.model_helpers import FAMILY_DIRS, left_padded, our_logits


def _llada_variant(tmp_path, dtype: str = "float32", **keys) -> DiffusionLM:
    import shutil

    directory = tmp_path / "llada-variant"
    shutil.copytree(FAMILY_DIRS["llada"], directory, dirs_exist_ok=True)
    config = json.loads((directory / "config.json").read_text()) | keys
    (directory / "config.json").write_text(json.dumps(config))
    return load_model(directory, dtype=dtype)


@pytest.mark.parametrize("key,value", [("layer_norm_type", "default"), ("activation_type", "gelu"),
                                       ("alibi", True), ("attention_layer_norm", True), ("clip_qkv", 8.0)])
def test_a_llada_key_we_would_compute_differently_is_refused_at_load_naming_it(tmp_path, key, value):
    with pytest.raises(ValueError, match=key):
        _llada_variant(tmp_path, **{key: value})


def test_llada_rotates_q_and_k_in_float32_in_bf16_unless_its_config_says_otherwise(tmp_path):
    input_ids, position_ids, key_mask = left_padded([40, 25], 104, 0, seed=11)
    position_ids = position_ids + 300  # large positions: where a bf16 rotation loses the most
    full = our_logits(_llada_variant(tmp_path, "bfloat16"), input_ids, position_ids, key_mask)
    low = our_logits(_llada_variant(tmp_path, "bfloat16", rope_full_precision=False),
                     input_ids, position_ids, key_mask)
    assert (full - low).abs().max() > 0  # the rotation's precision changes the answer in bf16
    in_float32 = [our_logits(_llada_variant(tmp_path, "float32", rope_full_precision=flag), input_ids,
                             position_ids, key_mask) for flag in (True, False)]
    torch.testing.assert_close(in_float32[0], in_float32[1], atol=0, rtol=0)


def test_llada_rotation_in_full_precision_is_the_float32_rotation_cast_back():
    from engine.models.layers import rotary_tables, rotate_

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(5, 2, 8, generator=generator).to(torch.bfloat16)  # [tokens, heads, head_dim]
    positions = torch.arange(1000, 1005)
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    angles = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)[:, None]
    first, second = x.float().chunk(2, dim=-1)  # LLaDA's rotate_half, in float32, cast back
    expected = (x.float() * angles.cos() + torch.cat([-second, first], dim=-1) * angles.sin()).to(torch.bfloat16)
    assert torch.equal(rotate_(x.clone(), *rotary_tables(positions, 8, 500000.0, torch.float32)), expected)
    low = rotate_(x.clone(), *rotary_tables(positions, 8, 500000.0, torch.bfloat16))
    assert not torch.equal(low, expected)


def test_llada_input_emb_norm_and_scale_logits_follow_its_modeling_code(tmp_path):
    input_ids, position_ids, key_mask = left_padded([9], 104, 0, seed=12)
    plain = our_logits(_llada_variant(tmp_path), input_ids, position_ids, key_mask)
    scaled = our_logits(_llada_variant(tmp_path, scale_logits=True), input_ids, position_ids, key_mask)
    torch.testing.assert_close(scaled, plain / 32**0.5)  # d_model 32
    normed = our_logits(_llada_variant(tmp_path, input_emb_norm=True), input_ids, position_ids, key_mask)
    assert (normed - plain).abs().max() > 1e-3
