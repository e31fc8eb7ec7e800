"""The Dream checkpoint family (``Dream-org/Dream-v0-Instruct-7B`` layout).

Where the mapping comes from:
* config.json follows Qwen2's keys (``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
  ``num_key_value_heads``, ``num_hidden_layers``, ``rope_theta``, ``rms_norm_eps``, ``vocab_size``,
  ``tie_word_embeddings``, ``max_position_embeddings``) plus Dream's ``mask_token_id`` and
  ``pad_token_id``; ``model_type: "Dream"``, ``architectures: ["DreamModel"]``.
* Weight names are Qwen2's (``model.layers.N.self_attn.{q,k,v,o}_proj``, QKV with bias,
  ``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``, ``model.norm``,
  ``lm_head``); attention is grouped-query (28 query heads over 4 key/value heads for the 7B).
* **Logit shift**: Dream keeps its autoregressive initialisation's alignment, so the prediction for
  position i comes from hidden state i-1 (``generation_utils.py``:
  ``logits = cat([logits[:, :1], logits[:, :-1]])``). ``LOGIT_SHIFT = 1`` tells the batch layer to read
  hidden states one column to the left of the block, and to include that column in the window.
"""
from __future__ import annotations

from engine.models.checkpoint import QWEN_LAYER_NAMES, QWEN_TOP_NAMES, WeightNames
from engine.models.config import TransformerConfig, qwen_transformer_config
from engine.models.family import CheckpointIds, Family
from engine.models.layout import RowLayout

NAME = "dream"
LOGIT_SHIFT = 1

WEIGHT_NAMES = WeightNames(layer_prefix="model.layers.", dropped=("rotary_emb",), top=QWEN_TOP_NAMES, layer={
    **QWEN_LAYER_NAMES, **{f"self_attn.{p}_proj.bias": f"attention.{p}_proj.bias" for p in ("q", "k", "v")}})


def is_family(config: dict) -> bool:
    return str(config.get("model_type", "")).lower() == "dream" or "DreamModel" in config.get(
        "architectures", [])


def transformer_config(config: dict) -> TransformerConfig:
    return qwen_transformer_config(config, qkv_bias=True)


def layout(config: dict) -> RowLayout:
    return RowLayout(NAME, logit_shift=LOGIT_SHIFT)


def config_json(config: TransformerConfig, ids: CheckpointIds, trained_block: int | None = None) -> dict:
    return {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "num_hidden_layers": config.num_layers, "vocab_size": config.vocab_size,
        "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps, "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings, "mask_token_id": ids.mask_id,
        "pad_token_id": ids.pad_id, "bos_token_id": ids.bos_id, "eos_token_id": ids.eos_id,
        "torch_dtype": "bfloat16",
    }


FAMILY = Family(
    name=NAME, title="Dream", recognises=is_family, transformer_config=transformer_config, layout=layout,
    weight_names=WEIGHT_NAMES, end_of_turn_token="<|im_end|>", mask_token="<|mask|>", config_json=config_json,
    decoding={"block_length": 32, "decoding": "threshold", "threshold": 0.9})
