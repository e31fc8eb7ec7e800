"""Write a :class:`BidirectionalTransformer` as an HF-format checkpoint in LLaDA's, Dream's, SDAR's or
LLaDA2's layout."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.models import dream, llada, llada2, sdar
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


def sdar_config_json(config: TransformerConfig, mask_id: int, eos_id: int, pad_id: int,
                     block_size: int) -> dict:
    """SDAR's config.json keys (Qwen3's plus ``block_size``, ``mask_token_id``); ``fuse_cross_entropy``
    is read by SDAR's own forward but not defined by its config class, so a config must carry it."""
    return {
        "architectures": ["SDARForCausalLM"], "model_type": "sdar",
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "num_hidden_layers": config.num_layers, "vocab_size": config.vocab_size,
        "rope_theta": config.rope_theta, "rope_scaling": None, "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings, "block_size": block_size, "mask_token_id": mask_id,
        "bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": pad_id, "fuse_cross_entropy": False,
        "torch_dtype": "bfloat16",
    }


def llada2_config_json(config: TransformerConfig, pad_id: int) -> dict:
    """LLaDA2's config.json keys (``LLaDA2MoeConfig``); like the release, no mask_token_id and no block size."""
    moe = config.moe
    return {
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
        "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                     "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                     "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "partial_rotary_factor": config.rotary_dim / config.head_dim,
        "rotary_dim": config.rotary_dim, "num_hidden_layers": config.num_layers, "vocab_size": config.vocab_size,
        "rope_theta": config.rope_theta, "rope_scaling": None, "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": "silu", "use_qkv_bias": False, "use_bias": False, "use_qk_norm": config.qk_norm,
        "norm_head": False, "norm_softmax": False, "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings, "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.experts_per_token, "n_group": moe.n_group, "topk_group": moe.topk_group,
        "moe_intermediate_size": moe.moe_intermediate_size, "num_shared_experts": moe.num_shared_experts,
        "routed_scaling_factor": moe.routed_scaling_factor, "first_k_dense_replace": moe.first_k_dense_replace,
        "score_function": "sigmoid", "moe_router_enable_expert_bias": True, "router_dtype": "fp32",
        "norm_topk_prob": True, "pad_token_id": pad_id, "torch_dtype": "bfloat16",
    }


def save_checkpoint(model: BidirectionalTransformer, directory: Path, family: str, config_json: dict,
                    dtype: torch.dtype = torch.bfloat16) -> None:
    """Save weights under the family's own names (``model.safetensors``) plus ``config.json``; a
    router's weight and expert bias are saved in float32 whatever ``dtype`` is."""
    module = {"llada": llada, "dream": dream, "sdar": sdar, "llada2": llada2}[family]
    if family in ("llada", "dream"):
        names = module.WEIGHT_NAMES.theirs(model.config.num_layers)
        tensors = {names[ours]: tensor for ours, tensor in model.state_dict().items()}
    else:  # by the checkpoint-level views: per-expert tensors, LLaDA2's fused query_key_value
        tensors = {module.WEIGHT_NAMES.theirs_of(ours): tensor for ours, tensor in model.checkpoint_tensors().items()}
        tensors.pop(None, None)
    state = {}
    for name, tensor in tensors.items():
        if name == module.WEIGHT_NAMES.theirs_of("lm_head.weight") and model.config.tie_word_embeddings:
            continue
        keep = tensor.dtype == torch.float32 and ".mlp.gate." in name
        state[name] = tensor.detach().to(torch.float32 if keep else dtype).contiguous()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
