"""The LLaDA2.x checkpoint family (``inclusionAI/LLaDA2.0-mini``, LLaDA2.1-mini, LLaDA2.2-mini: same layout).

Where the mapping comes from (the checkpoint's remote code ``modeling_llada2_moe.py`` /
``configuration_llada2_moe.py``; SGLang's ``models/llada2.py``):
* config.json: ``architectures: ["LLaDA2MoeModelLM"]``, ``model_type: "llada2_moe"``; Qwen-like keys
  plus the MoE keys (``num_experts``, ``num_experts_per_tok``, ``n_group``, ``topk_group``,
  ``moe_intermediate_size``, ``num_shared_experts``, ``routed_scaling_factor``,
  ``first_k_dense_replace``), ``partial_rotary_factor``, ``use_qk_norm``. Defaults are
  LLaDA2MoeConfig's (``use_bias`` True, ``partial_rotary_factor`` 0.5, ``rms_norm_eps`` 1e-5).
  No ``mask_token_id`` and no block size in config.json: the mask is the tokenizer's ``<|mask|>``
  (156895 in the release), the block 32 (SGLang hard-codes both per architecture).
* Attention: fused ``query_key_value`` [(heads + 2 kv_heads) * head_dim, hidden] in [q | k | v] order
  (ours), output ``dense``; per-head RMSNorm ``query_layernorm``/``key_layernorm`` before RoPE; RoPE on
  the first ``int(head_dim * partial_rotary_factor)`` dims of a head, with that rotary dim as the
  exponent's denominator (``rotary_dim`` in config.json is never read by the modeling code).
* MLP: dense ``mlp.{gate,up,down}_proj`` in layers below ``first_k_dense_replace``; above, the MoE of
  ``engine.models.moe`` (``mlp.gate.weight``, the ``mlp.gate.expert_bias`` buffer, ``mlp.experts.E.*``,
  ``mlp.shared_experts.*``). ``norm_topk_prob`` is never read: weights are renormalised whenever
  ``num_experts_per_tok`` > 1, as the reference does.
* LLaDA2.2 adds ``block_size`` (32), ``expert_capacity`` (48), ``delete_token_id`` and ``split_token_id``:
  ``expert_capacity`` switches the gate to block routing (``engine.models.moe``) over blocks of
  ``block_size`` absolute positions, the decode block too (another block_length is refused: a routing
  block must be whole in every forward); ``n_group`` / ``topk_group`` are then unused. Its editing rule,
  ``joint_threshold_indel``, is what an unset ``EngineConfig.decoding`` becomes, and takes the DELETE /
  SPLIT ids from config.json (:func:`rule_settings`). SGLang, which serves it, refuses expert
  parallelism with block routing; tensor parallel here keeps the gate whole on every rank.
* Block-causal attention, no logit shift; EOS ``<|endoftext|>`` (156892); ``<|role_end|>`` also stops a
  request (the reference stops on EOS only; the model ends a turn with role_end, then EOS).
"""
from __future__ import annotations

from engine.models.checkpoint import WeightNames
from engine.models.config import MoEConfig, TransformerConfig
from engine.models.family import CheckpointIds, Family
from engine.models.layout import RowLayout

NAME = "llada2"
LOGIT_SHIFT = 0
ATTENTION = "block_causal"
DEFAULT_BLOCK_LENGTH = 32
MODEL_TYPE = "llada2_moe"

WEIGHT_NAMES = WeightNames(layer_prefix="model.layers.", dropped=("rotary_emb",), layer={
    "input_layernorm.weight": "input_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "attention.query_key_value.weight": "attention.query_key_value.weight",
    "attention.dense.weight": "attention.o_proj.weight",
    "attention.query_layernorm.weight": "attention.q_norm.weight",
    "attention.key_layernorm.weight": "attention.k_norm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
    "mlp.gate.weight": "mlp.gate.weight",
    "mlp.gate.expert_bias": "mlp.gate.expert_bias",
    "mlp.shared_experts.gate_proj.weight": "mlp.shared_experts.gate_proj.weight",
    "mlp.shared_experts.up_proj.weight": "mlp.shared_experts.up_proj.weight",
    "mlp.shared_experts.down_proj.weight": "mlp.shared_experts.down_proj.weight",
}, top={
    "model.word_embeddings.weight": "embed_tokens.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}, same_within_layer=("mlp.experts.",))


def is_family(config: dict) -> bool:
    return config.get("model_type") == MODEL_TYPE or "LLaDA2MoeModelLM" in config.get("architectures", [])


def block_length(config: dict) -> int:
    return config.get("block_size") or DEFAULT_BLOCK_LENGTH


def routes_by_block(config: dict) -> bool:
    """LLaDA2.2's gate: the checkpoint names an ``expert_capacity``."""
    return config.get("expert_capacity") is not None


def layout(config: dict) -> RowLayout:
    return RowLayout(NAME, ATTENTION, LOGIT_SHIFT, trained_block=block_length(config), caches=("dual",),
                     refused_rules=("dream",), own_rule=EDITING_RULE if routes_by_block(config) else None,
                     fixed_block=routes_by_block(config))


EDITING_RULE = "joint_threshold_indel"  # LLaDA2.2's insert/delete editing
RULE_TOKEN_IDS = ("delete_token_id", "split_token_id")  # config.json ids its editing rule writes


def rule_settings(config: dict) -> dict:
    """The settings config.json gives rules (``DecodingRule.settle``): LLaDA2.2's DELETE and SPLIT ids."""
    return {key: config[key] for key in RULE_TOKEN_IDS if config.get(key) is not None}


# (key, LLaDA2MoeConfig's default, the value we compute, what another value would change)
_FIXED_KEYS = (
    ("score_function", "sigmoid", "sigmoid", "the router's scoring function"),
    ("use_qkv_bias", False, False, "a bias on query_key_value"),
    ("use_bias", True, False, "a bias on the attention output (dense)"),
    ("norm_head", False, False, "a normalised output head"),
    ("rope_scaling", None, None, "scaled RoPE"),
    ("hidden_act", "silu", "silu", "the MLP activation"),
)


def check_supported(config: dict) -> None:
    """Refuse a config whose computation this engine would not reproduce, naming the key.

    ``norm_head`` is not read by the reference's modeling code; a true value is refused anyway, as
    the Ling models it comes from normalise the head with it."""
    if config.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ValueError(f"LLaDA2 config key 'model_type' = {config['model_type']!r} is not served (only "
                         f"{MODEL_TYPE!r}: llada2_moe_veomni is dFactory's merged-experts training layout)")
    for key, default, supported, what in _FIXED_KEYS:
        value = config.get(key, default)
        if value != supported:
            raise ValueError(f"LLaDA2 config key {key!r} = {value!r} ({what}) is not supported (this engine "
                             f"computes {key}={supported!r}); refusing to load a model that would decode "
                             "differently")


def moe_config(config: dict) -> MoEConfig | None:
    if not config.get("num_experts"):
        return None
    return MoEConfig(
        num_experts=config["num_experts"],
        experts_per_token=config.get("num_experts_per_tok", 2),
        moe_intermediate_size=config["moe_intermediate_size"],
        n_group=config.get("n_group", 8),
        topk_group=config.get("topk_group", 4),
        num_shared_experts=config.get("num_shared_experts") or 0,
        routed_scaling_factor=float(config.get("routed_scaling_factor", 2.5)),
        first_k_dense_replace=config.get("first_k_dense_replace", 0),
        expert_capacity=config.get("expert_capacity"),
        routing_block=block_length(config) if routes_by_block(config) else None,
    )


def transformer_config(config: dict) -> TransformerConfig:
    check_supported(config)
    num_heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // num_heads
    moe = moe_config(config)
    dense_layers = config["num_hidden_layers"] if moe is None else moe.first_k_dense_replace
    if dense_layers and not config.get("intermediate_size"):
        raise ValueError("LLaDA2 config has dense MLP layers but no 'intermediate_size'")
    return TransformerConfig(
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,  # 0 means heads (LLaDA2.1's config)
        intermediate_size=config.get("intermediate_size") or 0,
        rope_theta=float(config.get("rope_theta", 10000.0)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        max_position_embeddings=config.get("max_position_embeddings", 16384),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        head_dim=head_dim,
        qk_norm=bool(config.get("use_qk_norm", True)),
        rotary_dim=int(head_dim * config.get("partial_rotary_factor", 0.5)),
        attention=ATTENTION,
        moe=moe,
    )


def config_json(config: TransformerConfig, ids: CheckpointIds, trained_block: int | None = None) -> dict:
    """LLaDA2's config.json keys (``LLaDA2MoeConfig``); like the release, no mask_token_id and no block size."""
    moe = config.moe
    return {
        "architectures": ["LLaDA2MoeModelLM"], "model_type": MODEL_TYPE,
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
        "norm_topk_prob": True, "pad_token_id": ids.pad_id, "torch_dtype": "bfloat16",
    } | ({"block_size": moe.routing_block, "expert_capacity": moe.expert_capacity}
         if moe.expert_capacity is not None else {})


FAMILY = Family(
    name=NAME, title="LLaDA2", recognises=is_family, transformer_config=transformer_config, layout=layout,
    weight_names=WEIGHT_NAMES, end_of_turn_token="<|role_end|>", mask_token="<|mask|>",
    mask_token_id=156895,  # the release's id, used only when the tokenizer lacks <|mask|>
    config_json=config_json, checkpoint_views=True, rule_settings=rule_settings,
    decoding={"block_length": DEFAULT_BLOCK_LENGTH, "decoding": "low_confidence_dynamic", "steps_per_block": 32,
              "threshold": 0.95})
