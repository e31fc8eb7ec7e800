"""Write tiny random checkpoints in the real LLaDA, Dream, SDAR and LLaDA2 on-disk formats (test fixtures).

``python -m scripts.make_fixtures [out_dir]`` (default ``tests/fixtures``) writes

* ``tiny-llada/``: LLaDA's config.json keys, LLaDA weight names (``model.transformer.blocks.N...``),
  multi-head attention, untied output head (``model.transformer.ff_out``), weights **sharded** into two
  files with a ``model.safetensors.index.json`` weight map, the character tokenizer with LLaDA's
  special tokens (``<|mdm_mask|>``, ``<|eot_id|>``), generation_config.json.
* ``tiny-dream/``: Qwen2/Dream config.json keys, Qwen2 weight names, QKV bias, grouped-query attention
  (4 query heads over 2 key/value heads), untied ``lm_head``, one ``model.safetensors``, a character
  tokenizer with Dream/Qwen special tokens (``<|mask|>``, ``<|im_end|>``, ``<|endoftext|>`` as EOS and
  pad, special tokens at the end of the vocab like Qwen's, ``tokenizer_class: "DreamTokenizer"`` as
  in the released tokenizer_config.json) and a ChatML chat template.
* ``tiny-sdar/``: SDAR's config.json (Qwen3 keys, ``block_size``, ``mask_token_id``,
  ``fuse_cross_entropy: false``), Qwen3 weight names with q/k norms, head_dim 16 != hidden/heads 8,
  grouped-query attention, untied head; generation_config.json stops on ``<|im_end|>`` and
  ``<|endoftext|>``; a character tokenizer with ``<|MASK|>`` and ChatML.
* ``tiny-diffusion_gemma/``: DiffusionGemma by transformers' own classes (``scripts.make_gemma_fixture``).
* ``tiny-llada2/``: LLaDA2's config.json (no mask_token_id), fused ``query_key_value``, q/k norms,
  partial RoPE (factor 0.5), one dense layer then MoE layers (8 experts in 4 groups, 2 groups and 2
  experts per token, one shared expert, routed scaling 2.5, a random nonzero ``expert_bias``); a
  character tokenizer with ``<|mask|>``, ``<|endoftext|>``, ``<|role_end|>``.

The SDAR and LLaDA2 output heads are sharpened (x20) and their MASK row zeroed, so confidence
thresholds fire on a random model and MASK is never the argmax. Their MASK embedding is zeroed, so
masked positions predict from their context and the decoding rules commit differently.

Weights are random (fixed seed) and stored in float32 so the files are deterministic and numerical
tests can compare against them exactly; norm weights and biases are random too, so a mis-mapped norm
or bias cannot go unnoticed. Each directory is about 100-200 KB.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.models.config import MoEConfig, TransformerConfig
from engine.models.families import FAMILIES, CheckpointIds, family_named
from engine.models.moe import Router
from scripts import make_fast_dllm_fixture as fast_dllm, make_nemotron_fixture as nemotron
from scripts.fixture_parts import CHARACTERS, build_chat_tokenizer, random_model, sharpened
from scripts.make_gemma_fixture import make_diffusion_gemma
from tinylm import tokenizer as llada_tokenizer
from tinylm.export import save_checkpoint

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SEED = 1234

DREAM_EOS, DREAM_IM_START, DREAM_IM_END, DREAM_MASK, DREAM_UNK = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<|unk|>")
DREAM_SPECIAL_TOKENS = (DREAM_EOS, DREAM_IM_START, DREAM_IM_END, DREAM_MASK, DREAM_UNK)
DREAM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

SDAR_SPECIAL_TOKENS = (DREAM_EOS, DREAM_IM_START, DREAM_IM_END, "<|MASK|>", DREAM_UNK)
LLADA2_ROLE_END, LLADA2_MASK = "<|role_end|>", "<|mask|>"
LLADA2_SPECIAL_TOKENS = (DREAM_EOS, LLADA2_MASK, LLADA2_ROLE_END, "<role>", "</role>", DREAM_UNK)
LLADA2_CHAT_TEMPLATE = (
    "{% for message in messages %}<role>{{ 'HUMAN' if message['role'] == 'user' else message['role'] | upper }}"
    "</role>{{ message['content'] }}<|role_end|>{% endfor %}"
    "{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}")

LLADA_SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def llada_transformer_config(vocab_size: int) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=4,
        intermediate_size=64, rope_theta=500000.0, rms_norm_eps=1e-5, qkv_bias=False,
        max_position_embeddings=4096, tie_word_embeddings=False)


def dream_transformer_config(vocab_size: int) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
        intermediate_size=48, rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=True,
        max_position_embeddings=32768, tie_word_embeddings=False)


def sdar_transformer_config(vocab_size: int) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
        intermediate_size=48, rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
        head_dim=16, qk_norm=True, attention="block_causal")


def llada2_transformer_config(vocab_size: int) -> TransformerConfig:
    moe = MoEConfig(num_experts=8, experts_per_token=2, moe_intermediate_size=16, n_group=4, topk_group=2,
                    num_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1)
    return TransformerConfig(
        vocab_size=vocab_size, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
        intermediate_size=48, rope_theta=600000.0, rms_norm_eps=1e-6, max_position_embeddings=16384,
        head_dim=16, qk_norm=True, rotary_dim=8, attention="block_causal", moe=moe)


def build_llada_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, LLaDA's special tokens first (as the tiny model's tokenizer names them)."""
    vocab = {token: index for index, token in enumerate(llada_tokenizer.SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=llada_tokenizer.UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return llada_tokenizer.with_llada_specials(core)


def build_dream_tokenizer() -> PreTrainedTokenizerFast:
    return build_chat_tokenizer(DREAM_SPECIAL_TOKENS, DREAM_MASK, DREAM_CHAT_TEMPLATE)


def shard_checkpoint(directory: Path) -> None:
    """Split ``model.safetensors`` into two shards (embedding + first block | the rest) plus the index."""
    single = directory / "model.safetensors"
    state = load_file(str(single))
    first = {name: tensor for name, tensor in state.items()
             if name == "model.transformer.wte.weight" or name.startswith("model.transformer.blocks.0.")}
    rest = {name: tensor for name, tensor in state.items() if name not in first}
    weight_map = {}
    for shard_name, shard in zip(LLADA_SHARDS, (first, rest)):
        save_file(shard, str(directory / shard_name), metadata={"format": "pt"})
        weight_map.update({name: shard_name for name in shard})
    total_size = sum(tensor.numel() * tensor.element_size() for tensor in state.values())
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    single.unlink()


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def make_llada(directory: Path, generator: torch.Generator) -> None:
    tokenizer = build_llada_tokenizer()
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("eos", llada_tokenizer.EOS), ("bos", llada_tokenizer.BOS), ("mask", llada_tokenizer.MASK))}
    config = llada_transformer_config(len(tokenizer))
    model = random_model(config, generator)
    config_json = family_named("llada").config_json(config, CheckpointIds(ids["mask"], ids["eos"], ids["eos"]), None)
    config_json["torch_dtype"] = "float32"
    save_checkpoint(model, directory, "llada", config_json, dtype=torch.float32)
    shard_checkpoint(directory)
    tokenizer.save_pretrained(str(directory))
    write_json(directory / "generation_config.json",
               {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["eos"]})


def make_dream(directory: Path, generator: torch.Generator) -> None:
    tokenizer = build_dream_tokenizer()
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("eos", DREAM_EOS), ("mask", DREAM_MASK), ("im_end", DREAM_IM_END))}
    config = dream_transformer_config(len(tokenizer))
    model = random_model(config, generator)
    config_json = family_named("dream").config_json(
        config, CheckpointIds(ids["mask"], ids["eos"], ids["eos"], bos_id=ids["eos"]), None)
    config_json["torch_dtype"] = "float32"
    save_checkpoint(model, directory, "dream", config_json, dtype=torch.float32)
    tokenizer.save_pretrained(str(directory))
    # Dream's tokenizer_config.json names a remote-code class; its tokenizer.json is a plain fast one.
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "DreamTokenizer"
    tokenizer_config["auto_map"] = {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]}
    write_json(directory / "tokenizer_config.json", tokenizer_config)
    write_json(directory / "generation_config.json", {
        "bos_token_id": ids["eos"], "eos_token_id": ids["eos"], "pad_token_id": ids["eos"],
        "mask_token_id": ids["mask"]})


def make_sdar(directory: Path, generator: torch.Generator) -> None:
    tokenizer = build_chat_tokenizer(SDAR_SPECIAL_TOKENS, "<|MASK|>", DREAM_CHAT_TEMPLATE)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SDAR_SPECIAL_TOKENS}
    config = sdar_transformer_config(len(tokenizer))
    model = sharpened(random_model(config, generator), ids["<|MASK|>"])
    config_json = family_named("sdar").config_json(
        config, CheckpointIds(ids["<|MASK|>"], ids[DREAM_EOS], ids[DREAM_EOS]), 4)
    config_json["torch_dtype"] = "float32"
    save_checkpoint(model, directory, "sdar", config_json, dtype=torch.float32)
    tokenizer.save_pretrained(str(directory))
    write_json(directory / "generation_config.json", {
        "bos_token_id": ids[DREAM_EOS], "eos_token_id": [ids[DREAM_IM_END], ids[DREAM_EOS]],
        "pad_token_id": ids[DREAM_EOS]})


def make_llada2(directory: Path, generator: torch.Generator) -> None:
    tokenizer = build_chat_tokenizer(LLADA2_SPECIAL_TOKENS, LLADA2_MASK, LLADA2_CHAT_TEMPLATE)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in LLADA2_SPECIAL_TOKENS}
    config = llada2_transformer_config(len(tokenizer))
    model = sharpened(random_model(config, generator), ids[LLADA2_MASK])
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Router):  # nonzero: a mis-applied bias changes which experts run
                module.expert_bias.copy_(0.1 * torch.randn(module.expert_bias.shape, generator=generator))
    config_json = family_named("llada2").config_json(
        config, CheckpointIds(ids[LLADA2_MASK], ids[DREAM_EOS], ids[DREAM_EOS]), None)
    config_json["torch_dtype"] = "float32"
    save_checkpoint(model, directory, "llada2", config_json, dtype=torch.float32)
    tokenizer.save_pretrained(str(directory))
    write_json(directory / "generation_config.json", {"eos_token_id": ids[DREAM_EOS], "pad_token_id": ids[DREAM_EOS]})


def make_gemma(directory: Path, generator: torch.Generator) -> None:
    make_diffusion_gemma(directory, generator, CHARACTERS)


def make_nemotron(directory: Path, generator: torch.Generator) -> None:
    nemotron.make_nemotron_labs_diffusion(directory, generator, build_chat_tokenizer(
        nemotron.SPECIAL_TOKENS, nemotron.MASK, ""))


MAKERS = {"llada": make_llada, "dream": make_dream, "sdar": make_sdar, "llada2": make_llada2,  # by family name:
          "diffusion_gemma": make_gemma, "nemotron_labs_diffusion": make_nemotron,  # every family of the registry
          "fast_dllm_v2": fast_dllm.make_fast_dllm_v2}  # has its fixture, written in the registry's order


def make_fixtures(out_dir: Path | str = DEFAULT_OUT, names: tuple[str, ...] = ()) -> tuple[Path, ...]:
    """Write ``tiny-llada``, ``tiny-dream``, ``tiny-sdar`` and ``tiny-llada2`` under ``out_dir`` (or
    only ``names`` of them); returns the paths written. One random stream, drawn in that order whatever
    is written, so a fixture's weights do not depend on which others are written or appended after it
    (the committed tiny-dream predates the fused q/k/v draw order: rewrite only the new fixtures)."""
    out_dir = Path(out_dir)
    generator = torch.Generator().manual_seed(SEED)
    makers = {f"tiny-{family.name}": MAKERS[family.name] for family in FAMILIES}
    written = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, make in makers.items():
            path = out_dir / name if not names or name in names else Path(scratch) / name
            if path.exists():
                for file in path.iterdir():
                    file.unlink()
            path.mkdir(parents=True, exist_ok=True)
            make(path, generator)
            if path.parent == out_dir:
                written.append(path)
    return tuple(written)


def main() -> None:
    """``python -m scripts.make_fixtures [out_dir] [name ...]``."""
    out_dir = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    for path in make_fixtures(out_dir, tuple(sys.argv[2:])):
        size = sum(file.stat().st_size for file in path.iterdir())
        print(f"{path}: {size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
