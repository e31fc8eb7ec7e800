"""Write two tiny random checkpoints in the real LLaDA and Dream on-disk formats (test fixtures).

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

Weights are random (fixed seed) and stored in float32 so the files are deterministic and numerical
tests can compare against them exactly; norm weights and biases are random too, so a mis-mapped norm
or bias cannot go unnoticed. Each directory is about 100-200 KB.
"""
from __future__ import annotations

import json
import string
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.models.config import TransformerConfig
from engine.models.transformer import BidirectionalTransformer
from tinylm import tokenizer as llada_tokenizer
from tinylm.export import dream_config_json, llada_config_json, save_checkpoint

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SEED = 1234

DREAM_EOS, DREAM_IM_START, DREAM_IM_END, DREAM_MASK, DREAM_UNK = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<|unk|>")
DREAM_SPECIAL_TOKENS = (DREAM_EOS, DREAM_IM_START, DREAM_IM_END, DREAM_MASK, DREAM_UNK)
DREAM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

LLADA_SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
CHARACTERS = tuple(c for c in string.printable if c not in "\x0b\x0c\r")  # the fixtures' character order


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


def build_llada_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, LLaDA's special tokens first (as the tiny model's tokenizer names them)."""
    vocab = {token: index for index, token in enumerate(llada_tokenizer.SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=llada_tokenizer.UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return llada_tokenizer.with_llada_specials(core)


def build_dream_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer with Qwen/Dream special tokens, placed after the ordinary vocab."""
    vocab = {token: index for index, token in enumerate(CHARACTERS + DREAM_SPECIAL_TOKENS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=DREAM_UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=DREAM_EOS, pad_token=DREAM_EOS, unk_token=DREAM_UNK,
        mask_token=DREAM_MASK, additional_special_tokens=[DREAM_IM_START, DREAM_IM_END],
        padding_side="left")
    tokenizer.chat_template = DREAM_CHAT_TEMPLATE
    return tokenizer


def random_model(config: TransformerConfig, generator: torch.Generator) -> BidirectionalTransformer:
    """Every parameter drawn from ``generator``: linear weights ~ U(+-1/sqrt(fan_in)), embeddings ~
    N(0, 1), norm weights ~ 1 + 0.2 N(0, 1), biases ~ 0.1 N(0, 1)."""
    model = BidirectionalTransformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name == "embed_tokens.weight":
                param.copy_(torch.randn(param.shape, generator=generator))
            elif name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=generator))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
            else:
                bound = param.shape[1] ** -0.5
                param.copy_((torch.rand(param.shape, generator=generator) * 2 - 1) * bound)
    return model


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
    config_json = llada_config_json(config, mask_id=ids["mask"], eos_id=ids["eos"], pad_id=ids["eos"])
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
    config_json = dream_config_json(config, mask_id=ids["mask"], eos_id=ids["eos"], pad_id=ids["eos"],
                                    bos_id=ids["eos"])
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


def make_fixtures(out_dir: Path | str = DEFAULT_OUT) -> tuple[Path, Path]:
    """Write ``tiny-llada`` and ``tiny-dream`` under ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    generator = torch.Generator().manual_seed(SEED)
    paths = out_dir / "tiny-llada", out_dir / "tiny-dream"
    for path, make in zip(paths, (make_llada, make_dream)):
        if path.exists():
            for file in path.iterdir():
                file.unlink()
        path.mkdir(parents=True, exist_ok=True)
        make(path, generator)
    return paths


def main() -> None:
    for path in make_fixtures(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT):
        size = sum(file.stat().st_size for file in path.iterdir())
        print(f"{path}: {size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
