"""LLaDA2 (``tests/fixtures/tiny-llada2``, LLaDA2's on-disk format): config, special ids, and logits equal
to an independent plain-torch reference. transformers has no LLaDA2 class, so the reference below is
written from the checkpoint's modeling code (``modeling_llada2_moe.py``): it reads the checkpoint's
own tensor names, splits the fused ``query_key_value`` per head, normalises q and k per head before a
partial rotate-half RoPE, runs a dense MLP in the first layers and then a mixture of experts whose
routing is a brute-force loop over tokens, groups and experts, with each expert its own three GEMMs.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.models import load_model
from engine.models.families.llada2 import FAMILY as llada2_family, moe_config
from engine.models.loader import mask_token_id
from engine.models.step_inputs import RefreshPart
from tests.model_helpers import left_padded, raw_checkpoint, read_config
from tests.test_models_sdar import block_causal_mask
from tests.test_moe import brute_force_route

LLADA2_DIR = Path(__file__).resolve().parent / "fixtures" / "tiny-llada2"
BLOCK = 4  # small blocks, so a short row spans several


@pytest.fixture(scope="module")
def llada2():
    return load_model(LLADA2_DIR)


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def swiglu(x, w, prefix):
    gate, up, down = (w[f"{prefix}.{name}_proj.weight"] for name in ("gate", "up", "down"))
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def partial_rope(x, positions, rotary_dim, theta):
    """``x [rows, heads, tokens, d]``: rotate-half on the first rotary_dim dims, exponent over rotary_dim."""
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    freqs = positions[:, None, :, None].float() * inv_freq
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = rotated * cos + torch.cat([-rotated[..., half:], rotated[..., :half]], -1) * sin
    return torch.cat([rotated, passed], -1)


def attention(x, w, prefix, config, positions, mask):
    rows, tokens, _ = x.shape
    heads, kv_heads, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    qkv = F.linear(x, w[f"{prefix}.query_key_value.weight"]).view(rows, tokens, heads + 2 * kv_heads, d)
    q, k, v = (t.transpose(1, 2) for t in qkv.split([heads, kv_heads, kv_heads], dim=2))
    q = rms_norm(q, w[f"{prefix}.query_layernorm.weight"], config["rms_norm_eps"])
    k = rms_norm(k, w[f"{prefix}.key_layernorm.weight"], config["rms_norm_eps"])
    rotary_dim = int(d * config["partial_rotary_factor"])
    q, k = (partial_rope(t, positions, rotary_dim, config["rope_theta"]) for t in (q, k))
    k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
    scores = (q @ k.transpose(2, 3)) * d ** -0.5 + mask
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(rows, tokens, heads * d)
    return F.linear(out, w[f"{prefix}.dense.weight"])


def mixture_of_experts(x, w, prefix, config):
    """Per token: route by brute force, run each chosen expert alone, weight in float32, add the shared one."""
    flat = x.reshape(-1, x.shape[-1])
    scores = torch.sigmoid(F.linear(flat.float(), w[f"{prefix}.gate.weight"].float()))
    chosen, weights = brute_force_route(scores, w[f"{prefix}.gate.expert_bias"], moe_config(config))
    out = torch.zeros_like(flat)
    for token, (experts, token_weights) in enumerate(zip(chosen, weights)):
        for expert, weight in zip(experts, token_weights):
            out[token] += weight * swiglu(flat[token], w, f"{prefix}.experts.{expert}").float()
    return (out + swiglu(flat, w, f"{prefix}.shared_experts")).view_as(x)


def reference_forward(input_ids, position_ids, key_mask, block=BLOCK):
    """The last layer's hidden states (before the final norm) and the logits."""
    config, w = read_config(LLADA2_DIR), raw_checkpoint(LLADA2_DIR)
    mask = block_causal_mask(key_mask, position_ids, block)
    x = F.embedding(input_ids, w["model.word_embeddings.weight"])
    eps = config["rms_norm_eps"]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        x = x + attention(rms_norm(x, w[f"{prefix}.input_layernorm.weight"], eps), w, f"{prefix}.attention",
                          config, position_ids, mask)
        h = rms_norm(x, w[f"{prefix}.post_attention_layernorm.weight"], eps)
        moe = layer >= config["first_k_dense_replace"]
        x = x + (mixture_of_experts(h, w, f"{prefix}.mlp", config) if moe else swiglu(h, w, f"{prefix}.mlp"))
    return x, F.linear(rms_norm(x, w["model.norm.weight"], eps), w["lm_head.weight"])


def our_forward(lm, input_ids, position_ids, key_mask, block=BLOCK):
    with torch.no_grad():
        hidden = lm.model.forward_full(input_ids, position_ids, key_mask, block_size=block)
        return hidden, lm.model.logits(hidden)


def our_logits(lm, input_ids, position_ids, key_mask, block=BLOCK):
    return our_forward(lm, input_ids, position_ids, key_mask, block)[1]


def test_llada2_config_is_read_from_its_keys(llada2):
    config, ours = read_config(LLADA2_DIR), llada2.model.config
    assert (llada2.family, llada2.logit_shift, llada2.row_kind, llada2.block_length) == (
        "llada2", 0, "block_causal", 32)
    assert (ours.head_dim, ours.rotary_dim, ours.qk_norm) == (16, 8, True)
    moe = ours.moe
    assert (moe.num_experts, moe.experts_per_token, moe.n_group, moe.topk_group) == (8, 2, 4, 2)
    assert (moe.moe_intermediate_size, moe.num_shared_experts, moe.first_k_dense_replace) == (16, 1, 1)
    assert moe.routed_scaling_factor == config["routed_scaling_factor"] == 2.5
    layers = llada2.model.layers
    assert type(layers[0].mlp).__name__ == "MLP" and all(type(layer.mlp).__name__ == "MoE" for layer in layers[1:])
    raw = raw_checkpoint(LLADA2_DIR)
    assert torch.equal(layers[2].mlp.gate.expert_bias, raw["model.layers.2.mlp.gate.expert_bias"])
    assert raw["model.layers.2.mlp.gate.expert_bias"].abs().min() > 0
    assert torch.equal(layers[1].attention.qkv_proj.weight, raw["model.layers.1.attention.query_key_value.weight"])
    assert torch.equal(layers[1].mlp.experts.down_proj[5], raw["model.layers.1.mlp.experts.5.down_proj.weight"])


def test_llada2_special_ids_come_from_the_tokenizer(llada2):
    tokenizer, ids = llada2.tokenizer, llada2.special_ids
    assert "mask_token_id" not in read_config(LLADA2_DIR)
    token = tokenizer.convert_tokens_to_ids
    assert ids.mask_id == token("<|mask|>") and ids.eos_id == token("<|endoftext|>")
    assert set(ids.stop_ids) == {token("<|endoftext|>"), token("<|role_end|>")}
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>"


def test_the_release_mask_id_is_the_fallback_only_when_the_tokenizer_lacks_the_mask():
    big_vocab = {"vocab_size": 157184}
    has_mask = {"<|mask|>": 98}.get
    assert mask_token_id(big_vocab, {}, has_mask, llada2_family) == 98
    assert mask_token_id(big_vocab, {}, {}.get, llada2_family) == 156895
    assert mask_token_id({"vocab_size": 103}, {}, {}.get, llada2_family) is None  # not in this vocab
    assert mask_token_id(big_vocab | {"mask_token_id": 5}, {}, has_mask, llada2_family) == 5  # config first
    assert mask_token_id(big_vocab, {"mask_token": {"content": "<x>"}}, {"<x>": 7}.get, llada2_family) == 7


def test_logits_match_an_independent_reference_with_a_block_causal_mask(llada2):
    input_ids, position_ids, key_mask = left_padded([11, 11], llada2.vocab_size, llada2.special_ids.pad_id, seed=2)
    expected_hidden, expected = reference_forward(input_ids, position_ids, key_mask)
    hidden, ours = our_forward(llada2, input_ids, position_ids, key_mask)
    assert expected.abs().max() > 0.5
    assert (hidden - expected_hidden).abs().max() <= 1e-5
    # the fixture's head is sharpened x20: logits reach +-40, where a float32 ulp is 3.8e-6
    assert (ours - expected).abs().max() <= 3e-5
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))
    assert not (ours.argmax(-1) == llada2.special_ids.mask_id).any()


def test_logits_match_left_padded(llada2):
    lengths = [10, 7, 3, 1]
    input_ids, position_ids, key_mask = left_padded(lengths, llada2.vocab_size, llada2.special_ids.pad_id, seed=3)
    expected_hidden, expected = reference_forward(input_ids, position_ids, key_mask)
    hidden, ours = our_forward(llada2, input_ids, position_ids, key_mask)
    assert (hidden[key_mask] - expected_hidden[key_mask]).abs().max() <= 1e-5
    assert (ours[key_mask] - expected[key_mask]).abs().max() <= 3e-5


def test_batch_invariant_rows_compute_exactly_what_they_compute_alone():
    """Batch-invariant mode runs the MoE per row (routing and expert GEMMs see the row's own tokens):
    a row of a ragged batch (block-causal rows sit left-aligned, ``row_widths`` real tokens each) gets
    the hidden states it gets alone, bit for bit."""
    invariant = load_model(LLADA2_DIR, batch_invariant=True)
    lengths = [10, 7, 3, 1]
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.full((4, 10), invariant.special_ids.pad_id)
    key_mask = torch.zeros(4, 10, dtype=torch.bool)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(0, invariant.vocab_size, (length,), generator=generator)
        key_mask[row, :length] = True
    position_ids = torch.arange(10).expand(4, -1)
    part = RefreshPart(input_ids, position_ids, key_mask, position_ids, row_widths=tuple(lengths), block_size=BLOCK)
    with torch.no_grad():
        batched = invariant.model.forward_step(part, None, None)
    for row, length in enumerate(lengths):
        alone, _ = our_forward(invariant, input_ids[row:row + 1, :length], position_ids[row:row + 1, :length],
                               key_mask[row:row + 1, :length])
        assert torch.equal(batched[row, :length], alone[0])


def test_the_expert_bias_matters_and_touched_experts_are_counted(llada2):
    """Guard on the fixture: its bias changes some token's experts (so a dropped bias would fail the
    logits tests); every MoE layer reports how many distinct experts its last forward used."""
    input_ids, position_ids, key_mask = left_padded([12], llada2.vocab_size, llada2.special_ids.pad_id, seed=4)
    our_logits(llada2, input_ids, position_ids, key_mask)
    moe = llada2.model.layers[1].mlp
    h = torch.randn(64, llada2.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    biased, _ = moe.gate(h, moe.config)
    scores = torch.sigmoid(F.linear(h, moe.gate.weight))
    unbiased, _ = brute_force_route(scores, torch.zeros(8), moe.config)
    assert biased.tolist() != unbiased
    touched = [layer.mlp.experts_touched.item() for layer in llada2.model.layers[1:]]
    assert all(2 <= count <= 8 for count in touched)
    assert llada2.model.experts_touched().tolist() == touched  # one tensor over the MoE layers


def test_bfloat16_llada2_keeps_its_router_in_float32():
    lm16 = load_model(LLADA2_DIR, dtype="bfloat16")
    router = lm16.model.layers[1].mlp.gate
    assert router.weight.dtype == router.expert_bias.dtype == torch.float32
    assert lm16.model.layers[1].mlp.experts.gate_up_proj.dtype == torch.bfloat16
    raw = raw_checkpoint(LLADA2_DIR)
    assert torch.equal(router.weight, raw["model.layers.1.mlp.gate.weight"])  # not rounded through bf16
