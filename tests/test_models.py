"""Specification of the model layer: checkpoint loading and the bidirectional transformer.

Fixtures are the tiny random checkpoints in ``tests/fixtures`` written by ``scripts/make_fixtures.py``
in the real LLaDA (sharded) and Dream (QKV bias, grouped-query attention) on-disk formats.

The numerical reference is Hugging Face transformers' own Llama / Qwen2 implementation, loaded with the
fixture's weights straight from its safetensors files and run with a full bidirectional 4D attention
mask, so neither our weight renaming nor our transformer is checked against itself.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.models import BidirectionalTransformer, DiffusionLM, load_model
from engine.models.kv_arena import KVArena
from engine.models.step_inputs import RefreshPart, WindowPart

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LLADA_DIR = FIXTURES / "tiny-llada"
DREAM_DIR = FIXTURES / "tiny-dream"
FAMILY_DIRS = {"llada": LLADA_DIR, "dream": DREAM_DIR}


def read_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def raw_checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, read with safetensors directly (all shards)."""
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


@pytest.fixture(scope="module")
def loaded() -> dict[str, DiffusionLM]:
    return {family: load_model(directory, dtype="float32") for family, directory in FAMILY_DIRS.items()}


@pytest.fixture(scope="module")
def loaded64() -> dict[str, DiffusionLM]:
    return {family: load_model(directory, dtype="float64") for family, directory in FAMILY_DIRS.items()}


# --------------------------------------------------------------------------------------------------
# Loading: family, logit shift, special tokens, dtypes, shards
# --------------------------------------------------------------------------------------------------

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
    assert lm.tokens.mask_id == ids[mask] == config["mask_token_id"]
    assert lm.tokens.eos_id == ids[eos] == config["eos_token_id"]
    assert lm.tokens.pad_id == ids[eos] == config["pad_token_id"]
    # a committed EOS or end-of-turn token ends a request
    assert set(lm.tokens.stop_ids) == {ids[eos], ids[end_of_turn]}
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


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------

def test_unknown_model_path_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="/nonexistent/model"):
        load_model("/nonexistent/model")


def test_unknown_model_type_raises_value_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="gpt2"):
        load_model(tmp_path)


# --------------------------------------------------------------------------------------------------
# Numerical reference: transformers' Llama (LLaDA-shaped) and Qwen2 (Dream-shaped)
# --------------------------------------------------------------------------------------------------

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


def left_padded(lengths: list[int], vocab: int, pad_id: int, seed: int):
    """Random token rows, left-padded to the longest; positions count from each row's first token."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(lengths), width), dtype=torch.long)
    key_mask = torch.zeros((len(lengths), width), dtype=torch.bool)
    for row, length in enumerate(lengths):
        input_ids[row, width - length:] = torch.randint(0, vocab, (length,), generator=generator)
        position_ids[row, width - length:] = torch.arange(length)
        key_mask[row, width - length:] = True
    return input_ids, position_ids, key_mask


def our_logits(lm: DiffusionLM, input_ids, position_ids, key_mask) -> torch.Tensor:
    hidden = lm.model.forward_full(input_ids, position_ids, key_mask)
    return lm.model.logits(hidden)


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
    input_ids, position_ids, key_mask = left_padded([9, 9], lm.vocab_size, lm.tokens.pad_id, seed=2)
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
    input_ids, position_ids, key_mask = left_padded(lengths, lm.vocab_size, lm.tokens.pad_id, seed=3)
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


# --------------------------------------------------------------------------------------------------
# Windowed forwards against a KV cache
# --------------------------------------------------------------------------------------------------

def _window_check(lm: DiffusionLM, input_ids, position_ids, key_mask, columns, valid):
    """A window forward over ``columns`` (``valid`` marks real entries) against an arena filled by a
    refresh of the same tokens reproduces the full forward's logits there and leaves the cache as it was."""
    model = lm.model
    rows, width = input_ids.shape
    arena = KVArena(model.config, rows, width, lm.dtype, input_ids.device)
    arena.key_mask[:, :width] = key_mask
    slots = torch.arange(rows)
    all_columns = torch.arange(width).expand(rows, -1)
    with torch.no_grad():
        hidden_full = model.forward_step(RefreshPart(input_ids, position_ids, key_mask, all_columns, slots),
                                         None, arena)
        keys_before = [k[:, :, :-1].clone() for k in arena.keys]
        values_before = [v[:, :, :-1].clone() for v in arena.values]
        safe = columns.clamp(max=width - 1)
        window_ids = torch.where(valid, input_ids.gather(1, safe), lm.tokens.pad_id)
        window_positions = torch.where(valid, position_ids.gather(1, safe), 0)
        for slot_range in ((0, rows), None):  # one view of the arena, or a gather
            window = WindowPart(window_ids, window_positions, columns, slots, context_start=0,
                                num_read=columns.shape[1], slot_range=slot_range)
            got = model.logits(model.forward_step(None, window, arena))
            expected = model.logits(hidden_full.gather(1, safe[..., None].expand(-1, -1, hidden_full.shape[-1])))
            torch.testing.assert_close(got[valid], expected[valid], atol=1e-10, rtol=1e-10)
    for before, after in zip(keys_before + values_before, arena.keys + arena.values):
        torch.testing.assert_close(after[:, :, :-1], before, atol=1e-10, rtol=1e-10)
    assert not arena.key_mask[:, arena.scratch_column].any()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_dual_cache_window_equals_full_forward(loaded64, family):
    """Dual cache: the window is one block per row, at a different column in each row."""
    lm = loaded64[family]
    assert lm.dtype == torch.float64
    input_ids, position_ids, key_mask = left_padded([12, 9, 6], lm.vocab_size, lm.tokens.pad_id, seed=4)
    columns = torch.tensor([[4, 5, 6], [8, 9, 10], [9, 10, 11]])
    _window_check(lm, input_ids, position_ids, key_mask, columns, torch.ones_like(columns, dtype=torch.bool))


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_window_rows_with_other_slots_between_them_compute_as_alone(loaded64, family):
    """One attention call over the slot range [0, 3) serves window rows in slots 0 and 2 only (slot 1
    starts its block elsewhere): the row between them gets zero queries whose outputs are dropped."""
    lm = loaded64[family]
    input_ids, position_ids, key_mask = left_padded([12, 9, 6], lm.vocab_size, lm.tokens.pad_id, seed=7)
    model, rows, width = lm.model, 3, input_ids.shape[1]
    arena = KVArena(model.config, rows, width, lm.dtype, input_ids.device)
    arena.key_mask[:, :width] = key_mask
    all_columns = torch.arange(width).expand(rows, -1)
    with torch.no_grad():
        full = model.forward_step(RefreshPart(input_ids, position_ids, key_mask, all_columns, torch.arange(rows)),
                                  None, arena)
        picked, columns = torch.tensor([0, 2]), torch.tensor([[6, 7, 8], [9, 10, 11]])
        window = WindowPart(input_ids[picked[:, None], columns], position_ids[picked[:, None], columns], columns,
                            picked, context_start=0, num_read=3, slot_range=(0, 3))
        got = model.logits(model.forward_step(None, window, arena))
        expected = model.logits(full[picked[:, None], columns])
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


def test_grouped_query_attention_never_takes_the_math_backend(loaded):
    """Dream (4 query heads over 2 key heads): a refresh and a window forward run with SDPA's math
    backend disabled, and folding the query groups into the query length (the CUDA route) gives the
    numbers of the fused enable_gqa kernel exactly."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from engine.models.layers import attend

    lm = loaded["dream"]
    assert lm.model.config.num_kv_heads < lm.model.config.num_heads
    input_ids, position_ids, key_mask = left_padded([10, 7], lm.vocab_size, lm.tokens.pad_id, seed=8)
    fused_only = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with torch.no_grad(), sdpa_kernel(fused_only):
        arena = KVArena(lm.model.config, 2, 10, lm.dtype, input_ids.device)
        arena.key_mask[:, :10] = key_mask
        lm.model.forward_step(RefreshPart(input_ids, position_ids, key_mask, torch.arange(10).expand(2, -1),
                                          torch.arange(2)), None, arena)
        columns = torch.tensor([[4, 5], [6, 7]])
        lm.model.forward_step(None, WindowPart(input_ids.gather(1, columns), position_ids.gather(1, columns),
                                               columns, torch.arange(2), 0, 2, slot_range=(0, 2)), arena)
        generator = torch.Generator().manual_seed(9)
        q = torch.randn(2, 5, 4, 8, generator=generator)
        keys, values = torch.randn(2, 2, 2, 7, 8, generator=generator).unbind(0)
        mask = torch.zeros(2, 1, 1, 7).masked_fill(torch.arange(7) < 2, float("-inf"))
        assert torch.equal(attend(q, keys, values, mask, fold_groups=True),
                           attend(q, keys, values, mask, fold_groups=False))


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_prefix_cache_ragged_window_equals_full_forward(loaded64, family):
    """Prefix cache: each row's window is its block through the end of the row, so windows are ragged;
    the missing entries point at the cache's scratch column."""
    lm = loaded64[family]
    width = 12
    input_ids, position_ids, key_mask = left_padded([12, 9, 6], lm.vocab_size, lm.tokens.pad_id, seed=5)
    starts = [4, 8, 10]
    window = width - min(starts)
    scratch = width  # the arena has one scratch column after the last real one
    columns = torch.full((len(starts), window), scratch, dtype=torch.long)
    valid = torch.zeros((len(starts), window), dtype=torch.bool)
    for row, start in enumerate(starts):
        columns[row, :width - start] = torch.arange(start, width)
        valid[row, :width - start] = True
    assert (~valid).sum(dim=1).tolist() == [0, 4, 6]
    _window_check(lm, input_ids, position_ids, key_mask, columns, valid)


# --------------------------------------------------------------------------------------------------
# LLaDA's computation keys: implemented, or refused at load
# --------------------------------------------------------------------------------------------------

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
