"""Loading a checkpoint: the family and its logit shift, the config read from LLaDA's and Qwen2's keys,
special tokens from config and tokenizer, the weights as the checkpoint's tensors in float32 and
bfloat16, every shard of a sharded LLaDA checkpoint; an unknown path or model type is refused.

Fixtures are the tiny random checkpoints in ``tests/fixtures`` in the real LLaDA (sharded) and Dream
(QKV bias, grouped-query attention) on-disk formats (``tests/model_helpers.py``).
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from engine.models import BidirectionalTransformer, load_model
from tests.model_helpers import DREAM_DIR, FAMILY_DIRS, LLADA_DIR, raw_checkpoint, read_config


@pytest.mark.parametrize("family, logit_shift", [("llada", 0), ("dream", 1)])
def test_load_model_detects_family_and_logit_shift(loaded, family, logit_shift):
    lm = loaded[family]
    assert lm.family == family
    assert lm.logit_shift == logit_shift
    assert isinstance(lm.model, BidirectionalTransformer)
    assert not any(p.requires_grad for p in lm.model.parameters())
    assert not lm.model.training


def test_llada_config_is_read_from_llada_keys(loaded):
    config, ours = read_config(LLADA_DIR), loaded["llada"].model.config
    assert (ours.vocab_size, ours.hidden_size, ours.num_layers) == (
        config["embedding_size"], config["d_model"], config["n_layers"])
    assert (ours.num_heads, ours.num_kv_heads, ours.intermediate_size) == (
        config["n_heads"], config["n_kv_heads"], config["mlp_hidden_size"])
    assert (ours.rope_theta, ours.rms_norm_eps) == (config["rope_theta"], config["rms_norm_eps"])
    assert not ours.qkv_bias and not ours.tie_word_embeddings
    assert loaded["llada"].max_length == config["max_sequence_length"]
    # untied head: the output projection is its own tensor
    assert loaded["llada"].model.lm_head.weight is not loaded["llada"].model.embed_tokens.weight


def test_dream_config_is_read_from_qwen2_keys(loaded):
    config, ours = read_config(DREAM_DIR), loaded["dream"].model.config
    assert (ours.vocab_size, ours.hidden_size, ours.num_layers) == (
        config["vocab_size"], config["hidden_size"], config["num_hidden_layers"])
    assert (ours.num_heads, ours.num_kv_heads, ours.intermediate_size) == (
        config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"])
    assert ours.num_kv_heads < ours.num_heads  # grouped-query attention
    assert (ours.rope_theta, ours.rms_norm_eps) == (config["rope_theta"], config["rms_norm_eps"])
    assert ours.qkv_bias and not ours.tie_word_embeddings
    assert loaded["dream"].max_length == config["max_position_embeddings"]


@pytest.mark.parametrize("family, mask, eos, end_of_turn", [
    ("llada", "<|mdm_mask|>", "<|endoftext|>", "<|eot_id|>"),
    ("dream", "<|mask|>", "<|endoftext|>", "<|im_end|>"),
])
def test_special_token_ids_come_from_config_and_tokenizer(loaded, family, mask, eos, end_of_turn):
    lm = loaded[family]
    config = read_config(FAMILY_DIRS[family])
    ids = {token: lm.tokenizer.convert_tokens_to_ids(token) for token in (mask, eos, end_of_turn)}
    assert len(set(ids.values())) == 3 and lm.tokenizer.unk_token_id not in ids.values()
    assert lm.special_ids.mask_id == ids[mask] == config["mask_token_id"]
    assert lm.special_ids.eos_id == ids[eos] == config["eos_token_id"]
    assert lm.special_ids.pad_id == ids[eos] == config["pad_token_id"]
    # a committed EOS or end-of-turn token ends a request
    assert set(lm.special_ids.stop_ids) == {ids[eos], ids[end_of_turn]}
    assert lm.tokenizer.mask_token == mask


def test_dream_tokenizer_uses_chatml(loaded):
    tokenizer = loaded["dream"].tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_weights_are_the_checkpoint_tensors_in_float32_and_bfloat16(loaded, family):
    lm32 = loaded[family]
    lm16 = load_model(FAMILY_DIRS[family], dtype="bfloat16")
    assert lm32.dtype == torch.float32 and lm16.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in lm16.model.parameters())
    raw = raw_checkpoint(FAMILY_DIRS[family])
    # every checkpoint tensor is used exactly once: the parameter counts match
    assert sum(t.numel() for t in raw.values()) == sum(p.numel() for p in lm32.model.parameters())
    for (name, p32), p16 in zip(lm32.model.named_parameters(), lm16.model.parameters()):
        assert torch.equal(p16, p32.to(torch.bfloat16)), name
    embed_name = {"llada": "model.transformer.wte.weight", "dream": "model.embed_tokens.weight"}[family]
    assert torch.equal(lm32.model.embed_tokens.weight, raw[embed_name])


def test_sharded_llada_checkpoint_loads_every_shard(loaded):
    index = json.loads((LLADA_DIR / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 2 and not (LLADA_DIR / "model.safetensors").exists()
    model = loaded["llada"].model
    # one tensor from each shard lands where LLaDA's names say
    first = load_file(str(LLADA_DIR / index["weight_map"]["model.transformer.wte.weight"]))
    last = load_file(str(LLADA_DIR / index["weight_map"]["model.transformer.ff_out.weight"]))
    assert index["weight_map"]["model.transformer.wte.weight"] != index["weight_map"][
        "model.transformer.ff_out.weight"]
    assert torch.equal(model.embed_tokens.weight, first["model.transformer.wte.weight"])
    assert torch.equal(model.lm_head.weight, last["model.transformer.ff_out.weight"])
    # SwiGLU naming: ff_proj is the gate, up_proj the up projection, ff_out (in a block) the down one
    block = {n: t for n, t in raw_checkpoint(LLADA_DIR).items() if ".blocks.1." in n}
    ours = model.checkpoint_tensors()  # gate and up live in one fused GEMM, loaded as two
    assert torch.equal(ours["layers.1.mlp.gate_proj.weight"], block["model.transformer.blocks.1.ff_proj.weight"])
    assert torch.equal(ours["layers.1.mlp.up_proj.weight"], block["model.transformer.blocks.1.up_proj.weight"])
    assert torch.equal(ours["layers.1.mlp.down_proj.weight"], block["model.transformer.blocks.1.ff_out.weight"])
    fused_gate_up = model.layers[1].mlp.gate_up_proj.weight
    assert torch.equal(fused_gate_up, torch.cat([block["model.transformer.blocks.1.ff_proj.weight"],
                                                 block["model.transformer.blocks.1.up_proj.weight"]]))


def test_unknown_model_path_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="/nonexistent/model"):
        load_model("/nonexistent/model")


def test_unknown_model_type_raises_value_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="gpt2"):
        load_model(tmp_path)
