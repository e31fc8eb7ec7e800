"""Write a :class:`BidirectionalTransformer` as an HF-format checkpoint in LLaDA's or Dream's layout."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.models import dream, llada
from engine.models.config import TransformerConfig
from engine.models.transformer import BidirectionalTransformer


def llada_config_json(config: TransformerConfig, mask_id: int, eos_id: int, pad_id: int) -> dict:
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada",
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM"},
        "d_model": config.hidden_size, "n_heads": config.num_heads, "n_kv_heads": config.num_kv_heads,
        "n_layers": config.num_layers, "mlp_hidden_size": config.intermediate_size,
        "mlp_ratio": config.intermediate_size // config.hidden_size,
        "vocab_size": config.vocab_size, "embedding_size": config.vocab_size,
        "rope": True, "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps,
        "layer_norm_type": "rms", "activation_type": "silu", "block_type": "llama",
        "include_bias": False, "include_qkv_bias": config.qkv_bias, "weight_tying": config.tie_word_embeddings,
        "max_sequence_length": config.max_position_embeddings, "mask_token_id": mask_id,
        "eos_token_id": eos_id, "pad_token_id": pad_id, "torch_dtype": "bfloat16", "use_cache": False,
    }


def dream_config_json(config: TransformerConfig, mask_id: int, eos_id: int, pad_id: int,
                      bos_id: int) -> dict:
    return {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "num_hidden_layers": config.num_layers, "vocab_size": config.vocab_size,
        "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps, "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings, "mask_token_id": mask_id,
        "pad_token_id": pad_id, "bos_token_id": bos_id, "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }


def save_checkpoint(model: BidirectionalTransformer, directory: Path, family: str, config_json: dict,
                    dtype: torch.dtype = torch.bfloat16) -> None:
    """Save weights under the family's own names (``model.safetensors``) plus ``config.json``."""
    module = {"llada": llada, "dream": dream}[family]
    names = module.WEIGHT_NAMES.theirs(model.config.num_layers)
    state = {}
    for ours, tensor in model.state_dict().items():
        if ours == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        state[names[ours]] = tensor.detach().to(dtype).contiguous()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
