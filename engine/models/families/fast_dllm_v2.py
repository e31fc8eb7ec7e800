"""The Fast-dLLM v2 checkpoint family (``Efficient-Large-Model/Fast_dLLM_v2_{1.5B,7B}``, NVlabs): Qwen2.5-Instruct
fine-tuned for block diffusion.

Where the mapping comes from (the checkpoint's remote ``configuration.py`` and ``modeling.py``):
* config.json has Qwen2's keys plus ``bd_size``, the trained block (32); ``model_type: "Fast_dLLM_Qwen"``,
  ``architectures: ["Fast_dLLM_QwenForCausalLM"]``. The release names ``eos_token_id`` (``<|im_end|>``, 151645)
  and no mask id: MASK is ``|<MASK>|`` (151665), a token of Qwen's vocabulary.
* Weight names are Qwen2's (``model.layers.N.self_attn.{q,k,v,o}_proj``, q/k/v with bias, grouped key/value
  heads, ``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``, ``model.norm``,
  ``lm_head``).
* Attention is block-causal over blocks of ``bd_size`` positions from the prompt's first token, and
  **logits are shifted by one**: the prediction for position i is the hidden state at i - 1 (``generate``
  reads ``cat([logits[:, :1], logits[:, :-1]])`` over each block). So a block's first position is predicted by
  the last column of the block before it: ``generate`` takes its argmax from the forward that stores that block
  (the stored prompt's, for a prompt of whole blocks), before it decodes the block's other positions. The
  rule commits it alone while it is a mask (``engine.rules.unmasking``); the runner reads hidden states one
  column to the left and takes that position's argmax even when the row samples
  (``engine.runner.parts_shifted_block_causal``).
* ``generate`` decodes each block in sub-blocks (``small_block_size``): the ``sub_block_length`` setting of the
  ``threshold`` and ``low_confidence`` rules. Its comparison is strict (``> threshold``), as ``low_confidence``'s.
* Keys whose computation this engine does not reproduce are refused by name (``check_supported``).
"""
from __future__ import annotations

from engine.models.checkpoint import QWEN_LAYER_NAMES, QWEN_TOP_NAMES, WeightNames
from engine.models.config import TransformerConfig, qwen_transformer_config
from engine.models.family import CheckpointIds, Family
from engine.models.layout import RowLayout

NAME = "fast_dllm_v2"
MODEL_TYPE = "Fast_dLLM_Qwen"
ARCHITECTURE = "Fast_dLLM_QwenForCausalLM"
LOGIT_SHIFT = 1
DEFAULT_BLOCK_LENGTH = 32  # the release's bd_size, and its configuration.py's default
MASK_TOKEN_ID = 151665  # |<MASK>| in Qwen2.5's vocabulary
SUB_BLOCK_LENGTH = 8  # the card's small_block_size

WEIGHT_NAMES = WeightNames(layer_prefix="model.layers.", dropped=("rotary_emb",), top=QWEN_TOP_NAMES, layer={
    **QWEN_LAYER_NAMES, **{f"self_attn.{p}_proj.bias": f"attention.{p}_proj.bias" for p in ("q", "k", "v")}})


def is_family(config: dict) -> bool:
    return config.get("model_type") == MODEL_TYPE or ARCHITECTURE in config.get("architectures", [])


def block_length(config: dict) -> int:
    return int(config.get("bd_size") or DEFAULT_BLOCK_LENGTH)


def layout(config: dict) -> RowLayout:
    return RowLayout(NAME, "block_causal", LOGIT_SHIFT, trained_block=block_length(config), caches=("dual",),
                     refused_rules=("dream", "joint_threshold"))


def check_supported(config: dict) -> None:
    """Refuse a config whose computation this engine would not reproduce, naming the key."""
    refused = {
        "use_sliding_window": (config.get("use_sliding_window", False), "sliding-window attention"),
        "rope_scaling": (config.get("rope_scaling"), "scaled RoPE"),
    }
    for key, (value, what) in refused.items():
        if value:
            raise ValueError(f"Fast-dLLM v2 config key {key!r} = {value!r} ({what}) is not supported; refusing "
                             "to load a model that would decode differently")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Fast-dLLM v2 config key 'hidden_act' = {config['hidden_act']!r} is not supported "
                         "(silu only)")


def transformer_config(config: dict) -> TransformerConfig:
    check_supported(config)
    return qwen_transformer_config(config, qkv_bias=True, attention="block_causal")


def config_json(config: TransformerConfig, ids: CheckpointIds, trained_block: int | None = None) -> dict:
    """The release's config.json keys for a model of this shape; ``mask_token_id`` is written only where it is
    not the release's (a small vocabulary's)."""
    layers = config.num_layers
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
                     "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
        "attention_dropout": 0.0, "bd_size": trained_block or DEFAULT_BLOCK_LENGTH, "bos_token_id": ids.bos_id,
        "eos_token_id": ids.eos_id, "hidden_act": "silu", "hidden_size": config.hidden_size,
        "initializer_range": 0.02, "intermediate_size": config.intermediate_size,
        "layer_types": ["full_attention"] * layers, "max_position_embeddings": config.max_position_embeddings,
        "max_window_layers": layers, "num_attention_heads": config.num_heads, "num_hidden_layers": layers,
        "num_key_value_heads": config.num_kv_heads, "pad_token_id": ids.pad_id, "rms_norm_eps": config.rms_norm_eps,
        "rope_scaling": None, "rope_theta": config.rope_theta, "sliding_window": None,
        "tie_word_embeddings": config.tie_word_embeddings, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": config.vocab_size,
        **({} if ids.mask_id == MASK_TOKEN_ID else {"mask_token_id": ids.mask_id}),
    }


FAMILY = Family(
    name=NAME, title="Fast-dLLM v2", recognises=is_family, transformer_config=transformer_config, layout=layout,
    weight_names=WEIGHT_NAMES, end_of_turn_token="<|im_end|>", mask_token="|<MASK>|", config_json=config_json,
    mask_token_id=MASK_TOKEN_ID,
    decoding={"block_length": DEFAULT_BLOCK_LENGTH, "decoding": "low_confidence", "threshold": 0.9,
              "sub_block_length": SUB_BLOCK_LENGTH})
