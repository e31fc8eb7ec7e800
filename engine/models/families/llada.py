"""The LLaDA checkpoint family (``GSAI-ML/LLaDA-8B-Instruct`` layout).

Where the mapping comes from:
* config.json keys (``d_model``, ``n_heads``, ``n_kv_heads``, ``n_layers``, ``mlp_hidden_size``,
  ``embedding_size``/``vocab_size``, ``rope_theta``, ``rms_norm_eps``, ``include_qkv_bias``,
  ``weight_tying``, ``max_sequence_length``, ``mask_token_id``, ``eos_token_id``, ``pad_token_id``,
  ``model_type: "llada"``) are those of the released config.json (OLMo-derived ``LLaDAConfig``).
* Weight names follow the checkpoint's own ``modeling_llada.py`` (``LLaDALlamaBlock``): attention
  ``q_proj``/``k_proj``/``v_proj``/``attn_out``; SwiGLU is ``ff_out(act(ff_proj(x)) * up_proj(x))``, so
  ``ff_proj`` is the gate and ``up_proj`` the up projection; norms ``attn_norm``/``ff_norm``; embedding
  ``wte``; final norm ``ln_f``; output head ``ff_out`` at the transformer level (absent when tied).
* No logit shift: the hidden state at position i predicts token i.
* Computation keys of the modeling code: ``rope_full_precision`` (default true: q and k are rotated in
  float32, then cast back), ``input_emb_norm`` (embeddings x sqrt(d_model)) and ``scale_logits``
  (logits x 1/sqrt(d_model)) are implemented; the others must have LLaDA-8B's value (see
  ``_FIXED_KEYS``) or the load fails naming the key.
"""
from __future__ import annotations

from engine.models.checkpoint import WeightNames
from engine.models.config import TransformerConfig
from engine.models.family import CheckpointIds, Family
from engine.models.layout import RowLayout

NAME = "llada"
LOGIT_SHIFT = 0

WEIGHT_NAMES = WeightNames(layer_prefix="model.transformer.blocks.", layer={
    "attn_norm.weight": "input_norm.weight",
    "ff_norm.weight": "post_attention_norm.weight",
    "q_proj.weight": "attention.q_proj.weight",
    "k_proj.weight": "attention.k_proj.weight",
    "v_proj.weight": "attention.v_proj.weight",
    "q_proj.bias": "attention.q_proj.bias",
    "k_proj.bias": "attention.k_proj.bias",
    "v_proj.bias": "attention.v_proj.bias",
    "attn_out.weight": "attention.o_proj.weight",
    "ff_proj.weight": "mlp.gate_proj.weight",
    "up_proj.weight": "mlp.up_proj.weight",
    "ff_out.weight": "mlp.down_proj.weight",
}, top={
    "model.transformer.wte.weight": "embed_tokens.weight",
    "model.transformer.ln_f.weight": "norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
})


def is_family(config: dict) -> bool:
    return config.get("model_type") == "llada" or "LLaDAModelLM" in config.get("architectures", [])


# Keys of LLaDA's modeling code (OLMo-derived) that change the computation, with the value we compute
# as the checkpoint does; any other value is refused at load rather than silently computed differently.
_FIXED_KEYS = {
    "rope": True, "alibi": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
    "bias_for_layer_norm": False, "attention_layer_norm": False, "activation_type": "silu",
    "block_type": "llama", "include_bias": False, "clip_qkv": None, "multi_query_attention": None,
}


def check_supported(config: dict) -> None:
    """Refuse a config whose computation this engine would not reproduce, naming the key."""
    for key, supported in _FIXED_KEYS.items():
        value = config.get(key, supported)
        if key == "multi_query_attention" and value is False:
            continue
        if value != supported:
            raise ValueError(f"LLaDA config key {key!r} = {value!r} is not supported (this engine computes "
                             f"{key}={supported!r}, as LLaDA-8B does); refusing to load a model that would "
                             "decode differently")


def transformer_config(config: dict) -> TransformerConfig:
    check_supported(config)
    num_heads = config["n_heads"]
    hidden = config["d_model"]
    return TransformerConfig(
        vocab_size=config.get("embedding_size") or config["vocab_size"],
        hidden_size=config["d_model"],
        num_layers=config["n_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("n_kv_heads") or num_heads,
        intermediate_size=config.get("mlp_hidden_size") or config["mlp_ratio"] * config["d_model"],
        rope_theta=float(config.get("rope_theta", 10000.0)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        qkv_bias=bool(config.get("include_qkv_bias", False)),
        max_position_embeddings=config.get("max_sequence_length", 4096),
        tie_word_embeddings=bool(config.get("weight_tying", False)),
        rope_full_precision=bool(config.get("rope_full_precision", True)),  # LLaDA's default: true
        embedding_scale=hidden**0.5 if config.get("input_emb_norm", False) else 1.0,
        logit_scale=1 / hidden**0.5 if config.get("scale_logits", False) else 1.0,
    )


def layout(config: dict) -> RowLayout:
    return RowLayout(NAME, logit_shift=LOGIT_SHIFT)


def config_json(config: TransformerConfig, ids: CheckpointIds, trained_block: int | None = None) -> dict:
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
        "max_sequence_length": config.max_position_embeddings, "mask_token_id": ids.mask_id,
        "eos_token_id": ids.eos_id, "pad_token_id": ids.pad_id, "torch_dtype": "bfloat16", "use_cache": False,
    }


FAMILY = Family(
    name=NAME, title="LLaDA", recognises=is_family, transformer_config=transformer_config, layout=layout,
    weight_names=WEIGHT_NAMES, end_of_turn_token="<|eot_id|>", mask_token="<|mdm_mask|>", config_json=config_json,
    decoding={"block_length": 32, "decoding": "threshold", "threshold": 0.9})
