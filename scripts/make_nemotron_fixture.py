"""Write the tiny Nemotron-Labs-Diffusion fixture in the release's on-disk layout.

``scripts.make_fixtures`` calls :func:`make_nemotron_labs_diffusion` for ``tiny-nemotron_labs_diffusion``:
the release's config.json keys (``NemotronLabsDiffusionModel``, YaRN ``rope_parameters`` with
``llama_4_scaling_beta``, ``block_size``, ``mask_token_id``, ``dlm_paradigm``) and tensor names (``encoder.``,
``diffusion_head``), two layers of four query heads over two key/value heads of 16 dims (hidden 32), and
blocks of 8. Its ``original_max_position_embeddings`` is 48, so YaRN's ramp and the Llama-4 query scale act
within a test's rows (the release's 16,384 would leave the scale at 1.0 in every test). The head is
sharpened and MASK's head row and embedding zeroed, as the other fixtures' are. The tokenizer is the
fixtures' character tokenizer with ``</s>`` (EOS) and ``[MASK]`` among its special tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.models.anchored.config import AnchoredConfig
from engine.models.families import CheckpointIds, family_named

EOS, UNK, MASK, INST, END_INST = "</s>", "<unk>", "[MASK]", "[INST]", "[/INST]"
SPECIAL_TOKENS = (EOS, INST, END_INST, MASK, UNK)
CHAT_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'user' %}[INST]{{ message['content'] }}"
                 "[/INST]{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}")
BLOCK = 8
ROPE = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 48,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
SHARPEN = 20.0


def tiny_config(vocab_size: int) -> AnchoredConfig:
    return AnchoredConfig(vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          head_dim=16, intermediate_size=48, rms_norm_eps=1e-5, max_position_embeddings=768,
                          rope_parameters=ROPE)


def random_weights(config: AnchoredConfig, generator: torch.Generator, mask_id: int) -> dict[str, torch.Tensor]:
    """Release names -> float32 tensors: linear weights ~ U(+-1/sqrt(fan_in)), embeddings ~ N(0, 1), norm
    weights ~ 1 + 0.2 N(0, 1); the head sharpened, MASK's head row and embedding zero."""
    hidden, heads, kv, d, inner = (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                                   config.intermediate_size)

    def linear(out: int, fan_in: int) -> torch.Tensor:
        return (torch.rand((out, fan_in), generator=generator) * 2 - 1) * fan_in ** -0.5

    def norm() -> torch.Tensor:
        return 1 + 0.2 * torch.randn(hidden, generator=generator)

    weights = {"encoder.embed_tokens.weight": torch.randn((config.vocab_size, hidden), generator=generator)}
    for index in range(config.num_layers):
        prefix = f"encoder.layers.{index}."
        weights |= {prefix + "self_attn.q_proj.weight": linear(heads * d, hidden),
                    prefix + "self_attn.k_proj.weight": linear(kv * d, hidden),
                    prefix + "self_attn.v_proj.weight": linear(kv * d, hidden),
                    prefix + "self_attn.o_proj.weight": linear(hidden, heads * d),
                    prefix + "mlp.gate_proj.weight": linear(inner, hidden),
                    prefix + "mlp.up_proj.weight": linear(inner, hidden),
                    prefix + "mlp.down_proj.weight": linear(hidden, inner),
                    prefix + "input_layernorm.weight": norm(), prefix + "post_attention_layernorm.weight": norm()}
    weights["encoder.norm.weight"] = norm()
    weights["diffusion_head.weight"] = linear(config.vocab_size, hidden) * SHARPEN
    weights["diffusion_head.weight"][mask_id] = 0
    weights["encoder.embed_tokens.weight"][mask_id] = 0
    return weights


def make_nemotron_labs_diffusion(directory: Path, generator: torch.Generator, tokenizer) -> None:
    """Write the fixture with ``tokenizer`` (the fixtures' character tokenizer with :data:`SPECIAL_TOKENS`)."""
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config = tiny_config(len(tokenizer))
    save_file(random_weights(config, generator, ids[MASK]), str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    config_json = family_named("nemotron_labs_diffusion").config_json(
        config, CheckpointIds(ids[MASK], ids[EOS], ids[EOS], bos_id=ids[INST]), BLOCK)
    (directory / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    tokenizer.save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids[INST], "eos_token_id": ids[EOS], "pad_token_id": ids[EOS]}, indent=2) + "\n")
