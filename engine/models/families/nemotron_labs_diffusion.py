"""The Nemotron-Labs-Diffusion checkpoint family (``nvidia/Nemotron-Labs-Diffusion-{3B,8B,14B}``).

Where the mapping comes from (the checkpoint's remote code, ``modeling_nemotron_labs_diffusion.py`` and
``configuration_nemotron_labs_diffusion.py``):
* config.json: ``model_type: "nemotron_labs_diffusion"``, ``architectures: ["NemotronLabsDiffusionModel"]``,
  Ministral-3 keys, ``rope_parameters`` (YaRN, and ``llama_4_scaling_beta`` for the query scale),
  ``block_size`` (the trained block), ``mask_token_id``, ``dlm_paradigm``.
* Weights: the stack under ``encoder.`` (``Ministral3Model``), one untied ``diffusion_head`` for every mode.
* Decoding (``generate``): blocks anchored right after the causal context, seeded by the context's next
  token, denoised with ``threshold``; also ``autoregressive`` (``ar_generate``) and ``linear_spec``
  (``linear_spec_generate``). Rows run as anchored rows (``engine.runner.anchored_rows``).
"""
from __future__ import annotations

from typing import Any

from engine.models.anchored.config import AnchoredConfig
from engine.models.anchored.model import AnchoredTransformer
from engine.models.checkpoint import WeightNames
from engine.models.family import CheckpointIds, Family
from engine.models.layout import RowLayout
from engine.rules.base import Setting

NAME = "nemotron_labs_diffusion"
MODEL_TYPE = "nemotron_labs_diffusion"
ARCHITECTURE = "NemotronLabsDiffusionModel"
LAYER_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")
WEIGHT_NAMES = WeightNames(
    top={"encoder.embed_tokens.weight": "embed_tokens.weight", "encoder.norm.weight": "norm.weight",
         "diffusion_head.weight": "head.weight"},
    layer={f"{part}{name}.weight": f"{part}{name}.weight" for part, names in (
        ("self_attn.", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp.", ("gate_proj", "up_proj", "down_proj")))
           for name in names} | {"input_layernorm.weight": "input_layernorm.weight",
                                 "post_attention_layernorm.weight": "post_attention_layernorm.weight"},
    layer_prefix="encoder.layers.")
# keys whose computation the anchored model does not reproduce -> (the value it runs, why)
REFUSED = {
    "dlm_paradigm": ("bidirectional", "'block_diff' is the training-time FlexAttention layout and "
                                      "'autoregressive' a checkpoint without a diffusion mode"),
    "sliding_window": (None, "sliding-window attention is not implemented for this family"),
    "attention_bias": (False, "projection biases are not loaded"),
    "mlp_bias": (False, "MLP biases are not loaded"),
    "hidden_act": ("silu", "the MLP is SwiGLU"),
    "tie_word_embeddings": (False, "the release's diffusion_head is its own tensor"),
}


def is_family(config: dict) -> bool:
    return config.get("model_type") == MODEL_TYPE or ARCHITECTURE in config.get("architectures", [])


def transformer_config(config: dict) -> AnchoredConfig:
    for key, (served, why) in REFUSED.items():
        if config.get(key, served) != served:
            raise ValueError(f"config.json {key}={config[key]!r}: this engine serves {served!r} only ({why})")
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope.setdefault("rope_theta", float(config.get("rope_theta", 1000000.0)))
    rope.setdefault("rope_type", "default")
    if rope["rope_type"] not in ("yarn", "default"):
        raise ValueError(f"config.json rope_parameters.rope_type={rope['rope_type']!r}: this engine serves 'yarn' "
                         "(the release's) and 'default'")
    heads = config["num_attention_heads"]
    return AnchoredConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], num_layers=config["num_hidden_layers"],
        num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        intermediate_size=config["intermediate_size"], rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        max_position_embeddings=config.get("max_position_embeddings", 262144), rope_parameters=rope)


# the remote code's name and default: the prompt and each finished block are stored causally and each block is
# seeded by the context's next token; False: all bidirectional, no seed (the anchored rules read it)
OWN_SETTINGS = {"causal_context": Setting(default=True, valid=lambda value: isinstance(value, bool),
                                          expected="True or False")}


def prefix_cache_refusal(config: Any) -> str | None:
    """Why a prompt's keys and values could not be reused under ``config`` (an EngineConfig), or None."""
    if not config.causal_context:
        return (f"with causal_context=False {NAME} stores a prompt bidirectionally, so a prompt position's keys and "
                "values depend on the tokens after it and cannot be reused by another request")
    return None


def layout(config: dict) -> RowLayout:
    return RowLayout(NAME, "anchored", trained_block=config.get("block_size", 32), caches=("dual",))


def config_json(config: AnchoredConfig, ids: CheckpointIds, trained_block: int | None = None) -> dict:
    """The release's config.json keys for a model of this shape."""
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                     "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "hidden_act": "silu", "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings, "rope_parameters": config.rope_parameters,
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "sliding_window": None,
        "tie_word_embeddings": False, "attn_implementation": "sdpa", "block_size": trained_block or 32,
        "mask_token_id": ids.mask_id, "bos_token_id": ids.bos_id, "eos_token_id": ids.eos_id,
        "pad_token_id": ids.pad_id, "dlm_paradigm": "bidirectional", "dlm_loss_weight": None,
        "ar_loss_weight": 1.0, "dp_varying_mask_ratio": False, "use_cache": False, "torch_dtype": "float32"}


FAMILY = Family(
    name=NAME, title="Nemotron-Labs-Diffusion", recognises=is_family, transformer_config=transformer_config,
    layout=layout, weight_names=WEIGHT_NAMES, end_of_turn_token="</s>", mask_token="[MASK]",
    config_json=config_json, mask_token_id=100, model_class=AnchoredTransformer,
    decoding={"decoding": "threshold", "threshold": 0.9}, own_settings=OWN_SETTINGS,
    prefix_cache_refusal=prefix_cache_refusal)
