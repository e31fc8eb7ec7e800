"""SDAR (``tests/fixtures/tiny-sdar``, written by ``scripts/make_fixtures.py`` in SDAR's on-disk format):
its config read from Qwen3's keys with an explicit head_dim, its special ids, and its logits equal to
transformers' own ``Qwen3ForCausalLM`` (SDAR's blocks are Qwen3's: per-head q/k RMSNorm before RoPE)
loaded from the fixture's safetensors and run with an explicit 4D block-causal mask.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from engine.models import load_model
from tests.model_helpers import left_padded, raw_checkpoint, read_config

SDAR_DIR = Path(__file__).resolve().parent / "fixtures" / "tiny-sdar"
BLOCK = 4


@pytest.fixture(scope="module")
def sdar():
    return load_model(SDAR_DIR)


@pytest.fixture(scope="module")
def reference():
    """transformers' Qwen3, built from the fixture's config.json, with the checkpoint's tensors as they are."""
    config = read_config(SDAR_DIR)
    hf_config = Qwen3Config(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"], num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"], num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"], rms_norm_eps=config["rms_norm_eps"],
        max_position_embeddings=config["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": config["rope_theta"]},
        attention_bias=False, use_sliding_window=False, tie_word_embeddings=False, attn_implementation="eager")
    model = Qwen3ForCausalLM(hf_config)
    model.load_state_dict(raw_checkpoint(SDAR_DIR), strict=True)  # SDAR's names are Qwen3's
    assert model.config._attn_implementation == "eager"
    return model.eval().float()


def block_causal_mask(key_mask: torch.Tensor, position_ids: torch.Tensor, block: int) -> torch.Tensor:
    """Additive [B, 1, T, T]: a query sees the real keys of its own block and of earlier blocks (blocks of
    ``block`` positions from each row's first token), as SDAR's ``block_diff_mask`` and generate do."""
    blocks = position_ids // block
    allowed = key_mask[:, None, :] & (blocks[:, None, :] <= blocks[:, :, None])
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]


def reference_forward(reference, input_ids, position_ids, key_mask, block=BLOCK):
    """The final (normed) hidden states and the logits."""
    with torch.no_grad():
        out = reference(input_ids, attention_mask=block_causal_mask(key_mask, position_ids, block),
                        position_ids=position_ids, output_hidden_states=True)
    return out.hidden_states[-1], out.logits


def reference_logits(reference, input_ids, position_ids, key_mask, block=BLOCK):
    return reference_forward(reference, input_ids, position_ids, key_mask, block)[1]


def our_forward(lm, input_ids, position_ids, key_mask, block=BLOCK):
    with torch.no_grad():
        hidden = lm.model.forward_full(input_ids, position_ids, key_mask, block_size=block)
        return lm.model.norm(hidden), lm.model.logits(hidden)


def our_logits(lm, input_ids, position_ids, key_mask, block=BLOCK):
    return our_forward(lm, input_ids, position_ids, key_mask, block)[1]


def test_sdar_config_is_read_from_qwen3_keys_with_its_explicit_head_dim(sdar):
    config, ours = read_config(SDAR_DIR), sdar.model.config
    assert (sdar.family, sdar.logit_shift, sdar.row_kind, sdar.block_length) == ("sdar", 0, "block_causal", 4)
    assert ours.head_dim == config["head_dim"] == 16 != ours.hidden_size // ours.num_heads
    assert ours.rotary_dim == ours.head_dim and ours.qk_norm and ours.moe is None
    assert (ours.num_heads, ours.num_kv_heads) == (4, 2)
    assert sdar.model.layers[0].attention.o_proj.weight.shape == (ours.hidden_size, ours.num_heads * ours.head_dim)
    assert sdar.model.lm_head.weight is not sdar.model.embed_tokens.weight
    raw = raw_checkpoint(SDAR_DIR)
    assert torch.equal(sdar.model.layers[1].attention.k_norm.weight, raw["model.layers.1.self_attn.k_norm.weight"])
    assert not torch.equal(raw["model.layers.1.self_attn.k_norm.weight"], torch.ones(16))  # random, not ones


def test_sdar_special_ids_stop_on_im_end_and_endoftext(sdar):
    tokenizer, ids = sdar.tokenizer, sdar.special_ids
    config = read_config(SDAR_DIR)
    assert ids.mask_id == config["mask_token_id"] == tokenizer.convert_tokens_to_ids("<|MASK|>")
    assert ids.eos_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert set(ids.stop_ids) == {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_sdar_mask_id_falls_back_to_tokenizer_config_not_special_tokens_map(tmp_path):
    """SDAR's release spells the mask <MASK> in special_tokens_map.json / added_tokens.json and <|MASK|>
    in tokenizer_config.json; without config.mask_token_id the loader must take the latter."""
    directory = tmp_path / "sdar"
    shutil.copytree(SDAR_DIR, directory)
    config = json.loads((directory / "config.json").read_text())
    expected = config.pop("mask_token_id")
    config.pop("block_size")  # a committed 8B config copy lacks both keys
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "special_tokens_map.json").write_text(json.dumps({"mask_token": "<MASK>"}))
    (directory / "added_tokens.json").write_text(json.dumps({"<MASK>": expected}))
    lm = load_model(directory)
    assert lm.special_ids.mask_id == expected
    assert lm.block_length == 4


def test_logits_match_transformers_qwen3_with_a_block_causal_mask(sdar, reference):
    input_ids, position_ids, key_mask = left_padded([11, 11], sdar.vocab_size, sdar.special_ids.pad_id, seed=2)
    expected_hidden, expected = reference_forward(reference, input_ids, position_ids, key_mask)
    hidden, ours = our_forward(sdar, input_ids, position_ids, key_mask)
    assert expected.abs().max() > 0.5  # not a vacuous comparison of near-zero logits
    assert (hidden - expected_hidden).abs().max() <= 1e-5
    # the fixture's head is sharpened x20: logits reach +-45, where a float32 ulp is 3.8e-6
    assert (ours - expected).abs().max() <= 3e-5
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))
    assert not (ours.argmax(-1) == sdar.special_ids.mask_id).any()  # the fixture's MASK row is zeroed


def test_logits_match_left_padded_and_a_padded_row_computes_what_it_computes_alone(sdar, reference):
    lengths = [10, 7, 3, 1]
    input_ids, position_ids, key_mask = left_padded(lengths, sdar.vocab_size, sdar.special_ids.pad_id, seed=3)
    expected_hidden, expected = reference_forward(reference, input_ids, position_ids, key_mask)
    hidden, ours = our_forward(sdar, input_ids, position_ids, key_mask)
    assert (hidden[key_mask] - expected_hidden[key_mask]).abs().max() <= 1e-5
    assert (ours[key_mask] - expected[key_mask]).abs().max() <= 3e-5
    for row, length in enumerate(lengths):
        alone = our_logits(sdar, input_ids[row:row + 1, -length:], position_ids[row:row + 1, -length:],
                           key_mask[row:row + 1, -length:])
        assert (ours[row, -length:] - alone[0]).abs().max() <= 3e-5


def test_attention_is_block_causal_in_both_the_reference_and_ours(sdar, reference):
    """A token in block 2 changes nothing in blocks 0-1 and changes every position of its own block."""
    input_ids, position_ids, key_mask = left_padded([12], sdar.vocab_size, sdar.special_ids.pad_id, seed=4)
    changed = input_ids.clone()
    changed[0, 9] = (changed[0, 9] + 1) % sdar.vocab_size
    for logits in (lambda ids: reference_logits(reference, ids, position_ids, key_mask),
                   lambda ids: our_logits(sdar, ids, position_ids, key_mask)):
        before, after = logits(input_ids), logits(changed)
        assert torch.equal(before[0, :8], after[0, :8])
        assert ((before[0, 8:] - after[0, 8:]).abs().amax(-1) > 1e-3).all()


def test_bfloat16_sdar_stays_close_to_float32(sdar):
    lm16 = load_model(SDAR_DIR, dtype="bfloat16")
    input_ids, position_ids, key_mask = left_padded([8], sdar.vocab_size, sdar.special_ids.pad_id, seed=5)
    logits32 = our_logits(sdar, input_ids, position_ids, key_mask)
    logits16 = our_logits(lm16, input_ids, position_ids, key_mask).float()
    assert (logits16.softmax(-1) - logits32.softmax(-1)).abs().max() < 0.1
