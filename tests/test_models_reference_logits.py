"""The bidirectional transformer's logits equal Hugging Face transformers' own Llama (LLaDA-shaped) and
Qwen2 (Dream-shaped) implementations, unpadded and left-padded, a padded row computing what it computes
alone.

The reference is loaded with the fixture's weights straight from its safetensors files and run with a
full bidirectional 4D attention mask, so neither our weight renaming nor our transformer is checked
against itself.
"""
from __future__ import annotations

import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.model_helpers import FAMILY_DIRS, left_padded, our_logits, raw_checkpoint, read_config

# LLaDA checkpoint names -> Llama names, written from LLaDA's modeling_llada.py (LLaDALlamaBlock:
# x + attn_out(attn(attn_norm(x))); x + ff_out(silu(ff_proj(ff_norm(x))) * up_proj(ff_norm(x)))).
_LLADA_TO_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm", "ff_norm": "post_attention_layernorm",
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj", "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
}
_LLADA_TO_LLAMA_TOP = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}


def llada_name_to_llama(name: str) -> str:
    if name in _LLADA_TO_LLAMA_TOP:
        return _LLADA_TO_LLAMA_TOP[name]
    layer, module, kind = re.fullmatch(r"model\.transformer\.blocks\.(\d+)\.(\w+)\.(weight|bias)", name).groups()
    return f"model.layers.{layer}.{_LLADA_TO_LLAMA_BLOCK[module]}.{kind}"


def reference_model(family: str):
    """transformers' own causal LM built from the fixture's config.json, with its weights."""
    config = read_config(FAMILY_DIRS[family])
    raw = raw_checkpoint(FAMILY_DIRS[family])
    if family == "llada":
        hf_config = LlamaConfig(
            vocab_size=config["embedding_size"], hidden_size=config["d_model"],
            intermediate_size=config["mlp_hidden_size"], num_hidden_layers=config["n_layers"],
            num_attention_heads=config["n_heads"], num_key_value_heads=config["n_kv_heads"],
            rms_norm_eps=config["rms_norm_eps"], max_position_embeddings=config["max_sequence_length"],
            rope_parameters={"rope_type": "default", "rope_theta": config["rope_theta"]},
            attention_bias=False, tie_word_embeddings=False, attn_implementation="eager")
        model, state = LlamaForCausalLM(hf_config), {llada_name_to_llama(n): t for n, t in raw.items()}
    else:
        hf_config = Qwen2Config(
            vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"], num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"], rms_norm_eps=config["rms_norm_eps"],
            max_position_embeddings=config["max_position_embeddings"],
            rope_parameters={"rope_type": "default", "rope_theta": config["rope_theta"]},
            tie_word_embeddings=False, attn_implementation="eager")
        model, state = Qwen2ForCausalLM(hf_config), raw  # Dream's names are Qwen2's
    model.load_state_dict(state, strict=True)
    assert model.config._attn_implementation == "eager"
    return model.eval().float()


def bidirectional_mask(key_mask: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Additive [B, 1, T, T] mask: every query sees every real key, no key sees padding."""
    rows, width = key_mask.shape
    allowed = key_mask[:, None, None, :].expand(rows, 1, width, width)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


@pytest.fixture(scope="module")
def references():
    return {family: reference_model(family) for family in FAMILY_DIRS}


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_reference_mask_really_is_bidirectional(references, family):
    """Guard on the reference itself: with our 4D mask a later token changes an earlier position's
    output; with transformers' default (causal) masking it does not."""
    reference = references[family]
    input_ids, position_ids, key_mask = left_padded([6], reference.config.vocab_size, 0, seed=1)
    changed = input_ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % reference.config.vocab_size
    with torch.no_grad():
        outputs = [reference(ids, attention_mask=bidirectional_mask(key_mask), position_ids=position_ids).logits
                   for ids in (input_ids, changed)]
        causal = [reference(ids, position_ids=position_ids).logits for ids in (input_ids, changed)]
    assert (outputs[0][0, 0] - outputs[1][0, 0]).abs().max() > 1e-3
    torch.testing.assert_close(causal[0][0, :-1], causal[1][0, :-1], atol=0, rtol=0)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_logits_match_transformers_reference_unpadded(loaded, references, family):
    lm, reference = loaded[family], references[family]
    input_ids, position_ids, key_mask = left_padded([9, 9], lm.vocab_size, lm.special_ids.pad_id, seed=2)
    with torch.no_grad():
        expected = reference(input_ids, attention_mask=bidirectional_mask(key_mask),
                             position_ids=position_ids).logits
        ours = our_logits(lm, input_ids, position_ids, key_mask)
    assert expected.abs().max() > 0.5  # not a vacuous comparison of near-zero logits
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_logits_match_transformers_reference_left_padded(loaded, references, family):
    lm, reference = loaded[family], references[family]
    lengths = [10, 7, 3, 1]
    input_ids, position_ids, key_mask = left_padded(lengths, lm.vocab_size, lm.special_ids.pad_id, seed=3)
    with torch.no_grad():
        expected = reference(input_ids, attention_mask=bidirectional_mask(key_mask),
                             position_ids=position_ids).logits
        ours = our_logits(lm, input_ids, position_ids, key_mask)
        torch.testing.assert_close(ours[key_mask], expected[key_mask], atol=1e-5, rtol=0)
        # a padded row computes exactly what it computes alone
        for row, length in enumerate(lengths):
            alone = our_logits(lm, input_ids[row:row + 1, -length:], position_ids[row:row + 1, -length:],
                               key_mask[row:row + 1, -length:])
            torch.testing.assert_close(ours[row, -length:], alone[0], atol=1e-5, rtol=0)
