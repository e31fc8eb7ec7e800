"""The DiffusionGemma checkpoint family (``google/diffusiongemma-26B-A4B-it``), text only.

Where the mapping comes from (transformers >= 5.24, ``models/diffusion_gemma``):
* config.json: ``model_type: "diffusion_gemma"``, ``architectures: ["DiffusionGemmaForBlockDiffusion"]``,
  ``canvas_length`` (the block), the text stack under ``text_config`` (``engine.models.diffusion_gemma.config``)
  and a Gemma 4 ``vision_config``, whose tower is not loaded: a request with an image is refused.
* Weights: one stack under ``model.decoder.`` (the encoder shares every tensor but each layer's
  ``layer_scalar`` buffer, kept here as ``encoder_layer_scalar``); the head is tied to the embeddings.
* Decoding: canvases of random tokens denoised by the entropy-bound sampler
  (``engine.rules.entropy_bound``), as canvas rows; settings from generation_config.json.
* No mask token (the canvas starts from random tokens); EOS ``<eos>`` (1); ``<end_of_turn>`` also stops.
"""
from __future__ import annotations

from engine.models.checkpoint import WeightNames
from engine.models.diffusion_gemma.config import GemmaTextConfig, gemma_text_config
from engine.models.diffusion_gemma.model import DiffusionGemmaTransformer
from engine.models.family import CheckpointIds, Family
from engine.models.layout import RowLayout

NAME = "diffusion_gemma"
SAMPLER = "entropy_bound"  # its one decoding rule: transformers' canvas sampler (engine/rules/entropy_bound.py)
MODEL_TYPE = "diffusion_gemma"
ARCHITECTURE = "DiffusionGemmaForBlockDiffusion"
DECODER = "model.decoder."
ENCODER_LAYERS = "model.encoder.language_model.layers."
IMAGE_TOKEN_KEYS = ("image_token_id", "boi_token_id", "eoi_token_id")


class GemmaWeightNames(WeightNames):
    """The decoder's names, less its prefix; the encoder's layer scalars; nothing else of the encoder."""

    def ours(self, name: str) -> str | None:
        if name.startswith(DECODER):
            return name.removeprefix(DECODER)
        if name.startswith(ENCODER_LAYERS) and name.endswith(".layer_scalar"):
            return "layers." + name.removeprefix(ENCODER_LAYERS).replace("layer_scalar", "encoder_layer_scalar")
        if name.startswith("model.encoder.") or name == "lm_head.weight":
            return None  # the vision tower, and the encoder's and head's copies of the decoder's tensors
        return name

    def theirs_of(self, ours: str) -> str | None:
        if ours.endswith("encoder_layer_scalar"):
            return ENCODER_LAYERS + ours.removeprefix("layers.").replace("encoder_layer_scalar", "layer_scalar")
        return DECODER + ours


WEIGHT_NAMES = GemmaWeightNames(top={}, layer={}, layer_prefix="layers.")


def is_family(config: dict) -> bool:
    return config.get("model_type") == MODEL_TYPE or ARCHITECTURE in config.get("architectures", [])


def layout(config: dict) -> RowLayout:
    return RowLayout(NAME, "canvas", trained_block=config.get("canvas_length", 256), caches=("dual",),
                     own_rule=SAMPLER)


def image_tokens(config: dict) -> tuple[int, ...]:
    """Token ids that only an image request carries (the image placeholder and its brackets)."""
    return tuple(config[key] for key in IMAGE_TOKEN_KEYS if config.get(key) is not None)


def config_json(config: GemmaTextConfig, ids: CheckpointIds, trained_block: int | None = None) -> dict:
    """A text-only DiffusionGemma config.json (``vision_config`` null: no image tower to load)."""
    layer_types = ["sliding_attention" if shape.kind == "sliding" else "full_attention" for shape in config.layers]
    base = next((shape for shape in config.layers if shape.kind == "sliding"), config.layers[0])
    per_layer = {str(index): {"head_dim": shape.head_dim, "num_key_value_heads": shape.num_kv_heads}
                 for index, shape in enumerate(config.layers) if shape.kind == "global"}
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": base.rope_theta}}
    globals_ = [shape for shape in config.layers if shape.kind == "global"]
    if globals_:
        rope["full_attention"] = {"rope_type": "proportional", "rope_theta": globals_[0].rope_theta,
                                  "partial_rotary_factor": globals_[0].rotated_fraction}
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "canvas_length": trained_block or
            config.canvas_length, "tie_word_embeddings": True, "vision_config": None, "text_config": {
                "model_type": "diffusion_gemma_text", "vocab_size": config.vocab_size,
                "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
                "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
                "num_key_value_heads": base.num_kv_heads, "head_dim": base.head_dim, "layer_types": layer_types,
                "per_layer_config": per_layer, "rope_parameters": rope, "sliding_window": config.sliding_window,
                "num_experts": config.num_experts, "top_k_experts": config.experts_per_token,
                "moe_intermediate_size": config.moe_intermediate_size, "rms_norm_eps": config.rms_norm_eps,
                "final_logit_softcapping": config.final_logit_softcapping,
                "max_position_embeddings": config.max_position_embeddings, "hidden_activation": "gelu_pytorch_tanh",
                "pad_token_id": ids.pad_id, "eos_token_id": ids.eos_id, "bos_token_id": ids.bos_id}}


FAMILY = Family(
    name=NAME, title="DiffusionGemma", recognises=is_family, transformer_config=gemma_text_config, layout=layout,
    weight_names=WEIGHT_NAMES, end_of_turn_token="<end_of_turn>", mask_token="<pad>",  # no mask token: see above
    config_json=config_json, model_class=DiffusionGemmaTransformer, image_tokens=image_tokens,
    decoding={"decoding": SAMPLER})
