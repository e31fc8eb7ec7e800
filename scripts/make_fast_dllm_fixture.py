"""Write the tiny Fast-dLLM v2 fixture in the release's on-disk layout.

``scripts.make_fixtures`` calls :func:`make_fast_dllm_v2` for ``tiny-fast_dllm_v2`` (from its shared random
stream); the tests and the reference harness (``research/peers/fast_dllm_v2_ref.py``) write it with its own seed,
``python -m scripts.make_fast_dllm_fixture DIR [LAYERS]`` (:func:`write_fixture`; LAYERS deepens it for timing,
and a test may ask for other heads). It holds the release's config.json keys (``Fast_dLLM_QwenForCausalLM``,
``bd_size`` 32, ``layer_types``, ``eos_token_id`` ``<|im_end|>``) plus ``mask_token_id`` (the small vocabulary has
no id 151665), Qwen2's tensor names with q/k/v biases, by default two layers of four query heads over two
key/value heads (hidden 32). The head is sharpened and MASK's head row and embedding
zeroed, as the other fixtures' are, so MASK is never an argmax. The tokenizer is the fixtures' character
tokenizer with Qwen's ChatML tokens and ``|<MASK>|``; generation_config.json stops on ``<|im_end|>`` alone, the
one stop the release's ``generate`` knows.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from engine.models.config import TransformerConfig
from engine.models.families import CheckpointIds, family_named
from scripts.fixture_parts import build_chat_tokenizer, random_model, sharpened
from tinylm.export import save_checkpoint

EOS, IM_START, IM_END, MASK, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "|<MASK>|", "<|unk|>"
SPECIAL_TOKENS = (EOS, IM_START, IM_END, MASK, UNK)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BLOCK = 32
SEED = 67


def tiny_config(vocab_size: int, layers: int = 2, heads: tuple[int, int] = (4, 2),
                head_dim: int = 8) -> TransformerConfig:
    """Two layers of four query heads over two key/value heads (hidden 32) unless told otherwise; ``heads`` is
    (query heads, key/value heads), the hidden size ``heads[0] * head_dim``."""
    return TransformerConfig(
        vocab_size=vocab_size, hidden_size=heads[0] * head_dim, num_layers=layers, num_heads=heads[0],
        num_kv_heads=heads[1], intermediate_size=48,
        rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=True, max_position_embeddings=32768,
        tie_word_embeddings=False, attention="block_causal")


def make_fast_dllm_v2(directory: Path, generator: torch.Generator, **shape) -> None:
    """The fixture drawn from ``generator``; ``shape`` is :func:`tiny_config`'s (layers, heads, head_dim)."""
    tokenizer = build_chat_tokenizer(SPECIAL_TOKENS, MASK, CHAT_TEMPLATE)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config = tiny_config(len(tokenizer), **shape)
    model = sharpened(random_model(config, generator), ids[MASK])
    config_json = family_named("fast_dllm_v2").config_json(
        config, CheckpointIds(ids[MASK], ids[IM_END], ids[IM_END], bos_id=ids[EOS]), BLOCK)
    config_json["torch_dtype"] = "float32"
    save_checkpoint(model, directory, "fast_dllm_v2", config_json, dtype=torch.float32)
    tokenizer.save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids[EOS], "eos_token_id": ids[IM_END], "pad_token_id": ids[EOS]}, indent=2) + "\n")


def write_fixture(directory: Path, **shape) -> Path:
    """The fixture written to ``directory`` from :data:`SEED`: the same weights wherever it is written (for one
    ``shape``; the default is the tests' two-layer fixture)."""
    directory.mkdir(parents=True, exist_ok=True)
    make_fast_dllm_v2(directory, torch.Generator().manual_seed(SEED), **shape)
    return directory


if __name__ == "__main__":
    print(write_fixture(Path(sys.argv[1]), **({"layers": int(sys.argv[2])} if len(sys.argv) > 2 else {})))
