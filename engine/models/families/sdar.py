"""The SDAR checkpoint family (``JetLM/SDAR-{1.7B,4B,8B}-Chat``): Qwen3 blocks, attention block-causal.

Where the mapping comes from (JetAstra/SDAR ``training/model/SDAR-*-Chat``):
* config.json has Qwen3's keys plus ``block_size`` and ``mask_token_id`` (``architectures:
  ["SDARForCausalLM"]``, ``model_type: "sdar"``). ``head_dim`` is explicit and need not be
  hidden/heads (SDAR-4B: 2560 / 32 = 80, head_dim 128); SDARConfig's default is 128.
* Weight names are Qwen3's: ``model.layers.N.self_attn.{q,k,v,o}_proj`` (no bias), per-head RMSNorm
  ``self_attn.{q,k}_norm`` [head_dim] applied to q and k **before** RoPE, ``mlp.{gate,up,down}_proj``,
  ``input_layernorm``, ``post_attention_layernorm``, ``model.embed_tokens``, ``model.norm``, ``lm_head``.
* Attention is block-causal over blocks of ``block_size`` positions from the prompt start (a query sees
  its own block and every earlier one); no logit shift (position i predicts token i).
* The mask id is ``config.mask_token_id``, else the ``mask_token`` of tokenizer_config.json
  (``<|MASK|>``): the release's added_tokens.json and special_tokens_map.json spell it ``<MASK>``.
  Generation stops on generation_config's ``eos_token_id`` list (``<|im_end|>``, ``<|endoftext|>``).
* Keys whose computation this engine does not reproduce are refused by name (``check_supported``).
"""
from __future__ import annotations

from engine.models.checkpoint import QWEN_LAYER_NAMES, QWEN_TOP_NAMES, WeightNames
from engine.models.config import TransformerConfig, qwen_transformer_config
from engine.models.family import CheckpointIds, Family
from engine.models.layout import RowLayout

NAME = "sdar"
LOGIT_SHIFT = 0
ATTENTION = "block_causal"
DEFAULT_BLOCK_LENGTH = 4

WEIGHT_NAMES = WeightNames(layer_prefix="model.layers.", dropped=("rotary_emb",), top=QWEN_TOP_NAMES, layer={
    **QWEN_LAYER_NAMES, **{f"self_attn.{p}_norm.weight": f"attention.{p}_norm.weight" for p in ("q", "k")}})


def is_family(config: dict) -> bool:
    return config.get("model_type") == "sdar" or "SDARForCausalLM" in config.get("architectures", [])


def block_length(config: dict) -> int:
    """The block size the checkpoint was trained with (a committed 8B config copy lacks the key)."""
    return int(config.get("block_size") or DEFAULT_BLOCK_LENGTH)


def layout(config: dict) -> RowLayout:
    return RowLayout(NAME, ATTENTION, LOGIT_SHIFT, trained_block=block_length(config), caches=("dual",),
                     refused_rules=("dream",))


def check_supported(config: dict) -> None:
    """Refuse a config whose computation this engine would not reproduce, naming the key."""
    refused = {
        "use_sliding_window": (config.get("use_sliding_window", False), "sliding-window attention"),
        "attention_bias": (config.get("attention_bias", False), "biases on q/k/v/o projections"),
        "rope_scaling": (config.get("rope_scaling"), "scaled RoPE"),
    }
    for key, (value, what) in refused.items():
        if value:
            raise ValueError(f"SDAR config key {key!r} = {value!r} ({what}) is not supported; refusing "
                             "to load a model that would decode differently")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"SDAR config key 'hidden_act' = {config['hidden_act']!r} is not supported (silu only)")


def transformer_config(config: dict) -> TransformerConfig:
    check_supported(config)
    return qwen_transformer_config(config, head_dim=config.get("head_dim") or 128, qk_norm=True, attention=ATTENTION)


def config_json(config: TransformerConfig, ids: CheckpointIds, trained_block: int | None = None) -> dict:
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
        "tie_word_embeddings": config.tie_word_embeddings, "block_size": trained_block or DEFAULT_BLOCK_LENGTH,
        "mask_token_id": ids.mask_id, "bos_token_id": ids.eos_id, "eos_token_id": ids.eos_id,
        "pad_token_id": ids.pad_id, "fuse_cross_entropy": False, "torch_dtype": "bfloat16",
    }


FAMILY = Family(
    name=NAME, title="SDAR", recognises=is_family, transformer_config=transformer_config, layout=layout,
    weight_names=WEIGHT_NAMES, end_of_turn_token="<|im_end|>", mask_token="<|MASK|>", config_json=config_json,
    checkpoint_views=True,
    decoding={"block_length": DEFAULT_BLOCK_LENGTH, "decoding": "low_confidence_dynamic", "steps_per_block": 4,
              "threshold": 0.9})
