"""DiffusionGemma's text stack as its config.json describes it: per-layer attention shapes and RoPE.

Read from ``text_config`` of ``DiffusionGemmaConfig`` (transformers ``models/diffusion_gemma``): sliding
layers attend to the last ``sliding_window`` positions with the base head size and full RoPE; global
layers attend to everything with ``per_layer_config``'s head size and key/value heads, values taken
from the key projection (no ``v_proj``), and a "proportional" partial RoPE.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from engine.models.kv_cache import CacheSpec, LayerSpec
from engine.parallel.shard import TensorShard

LayerKind = Literal["sliding", "global"]
LAYER_KINDS = {"sliding_attention": "sliding", "full_attention": "global"}


@dataclass(frozen=True)
class LayerShape:
    kind: LayerKind
    head_dim: int
    num_kv_heads: int
    rope_theta: float
    rotated_fraction: float  # share of a head's frequencies that rotate (proportional RoPE)
    proportional: bool  # frequencies over the whole head, the unrotated ones zero (else default RoPE)

    @property
    def values_from_keys(self) -> bool:
        """Global layers have no value projection: values are the normed key projection."""
        return self.kind == "global"

    def inverse_frequencies(self) -> torch.Tensor:
        """``[head_dim // 2]`` float32, as transformers' default and proportional RoPE compute them."""
        if not self.proportional:
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
            return 1.0 / (self.rope_theta ** exponents)
        rotated = int(self.rotated_fraction * self.head_dim // 2)
        exponents = torch.arange(0, 2 * rotated, 2, dtype=torch.int64).float() / self.head_dim
        frequencies = 1.0 / (self.rope_theta ** exponents)
        return torch.cat([frequencies, torch.zeros(self.head_dim // 2 - rotated)])


@dataclass(frozen=True)
class GemmaTextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    layers: tuple[LayerShape, ...]
    sliding_window: int
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    canvas_length: int
    rms_norm_eps: float = 1e-6
    final_logit_softcapping: float = 30.0
    max_position_embeddings: int = 131_072
    tie_word_embeddings: bool = True
    shard: TensorShard = field(default_factory=TensorShard)  # the rank these shapes are one share of

    def rank_share(self, shard: TensorShard) -> GemmaTextConfig:
        """The shapes rank ``shard.rank`` holds: its heads and key/value heads of each layer, its part of the dense
        MLP, of each expert and of the self-conditioning MLP (vocabulary whole: the embedding splits it)."""
        if not shard.is_split:
            return self
        layers = tuple(replace(layer, num_kv_heads=shard.split_kv_heads(layer.num_kv_heads)) for layer in self.layers)
        return replace(self, num_heads=shard.split(self.num_heads, "attention heads"), layers=layers,
                       intermediate_size=shard.split(self.intermediate_size, "intermediate_size"),
                       moe_intermediate_size=shard.split(self.moe_intermediate_size, "moe_intermediate_size"),
                       shard=shard)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def cache_spec(self, width: int) -> CacheSpec:
        """Canvas rows' cache: a global layer keeps every context position, a sliding layer a ring of the
        last ``sliding_window - 1``: an encoder query sees itself and the ``sliding_window - 1`` positions
        before it, and the canvas sees the context's last ``sliding_window - 1``, as transformers keeps them."""
        return CacheSpec(tuple(LayerSpec(layer.num_kv_heads, layer.head_dim,
                                         None if layer.kind == "global" else self.sliding_window)
                               for layer in self.layers), width)

    def layers_of(self, kind: LayerKind) -> list[int]:
        return [index for index, layer in enumerate(self.layers) if layer.kind == kind]


_REFUSED = (("use_bidirectional_attention", None, "bidirectional encoder attention"),
            ("attention_bias", False, "attention biases"),
            ("hidden_activation", "gelu_pytorch_tanh", "the MLP activation"),
            ("final_logit_softcapping", 30.0, None))


def _check_supported(text: dict) -> None:
    for key, supported, what in _REFUSED:
        value = text.get(key, supported)
        if what is not None and value != supported:
            raise ValueError(f"DiffusionGemma text_config key {key!r} = {value!r} ({what}) is not supported (this "
                             f"engine computes {key}={supported!r}); refusing a model that would decode differently")
    if not text.get("num_experts") or not text.get("top_k_experts"):
        raise ValueError("DiffusionGemma text_config names no num_experts / top_k_experts: every released layer "
                         "has routed experts beside its dense MLP")


def _layer_shape(text: dict, index: int, layer_type: str, per_layer: dict | None) -> LayerShape:
    """One layer's shape. ``per_layer`` is the config's ``per_layer_config`` (None: the config has no such
    key). A config that has one, even ``{}`` or null, gives a layer it does not list the base head size and key/value
    heads, as transformers does; a config without one gives its global layers ``global_head_dim``."""
    if layer_type not in LAYER_KINDS:
        raise ValueError(f"DiffusionGemma layer {index} has type {layer_type!r}; served: {sorted(LAYER_KINDS)}")
    rope = (text.get("rope_parameters") or DEFAULT_ROPE)[layer_type]
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ("default", "proportional") or rope.get("factor", 1.0) != 1.0:
        raise ValueError(f"DiffusionGemma {layer_type} RoPE {rope!r} is not supported (default or proportional, "
                         "unscaled)")
    fraction = float(rope.get("partial_rotary_factor", 1.0))
    if rope_type == "default" and fraction != 1.0:
        raise ValueError(f"DiffusionGemma {layer_type}: a partial default RoPE ({fraction}) is not supported")
    overrides = (per_layer or {}).get(str(index), (per_layer or {}).get(index, {}))
    kind = LAYER_KINDS[layer_type]
    if kind == "global" and per_layer is None:  # a config written before per_layer_config: its global keys
        overrides = {"head_dim": text.get("global_head_dim", 512),
                     "num_key_value_heads": text.get("num_global_key_value_heads") or text["num_key_value_heads"]}
    return LayerShape(kind=kind, head_dim=overrides.get("head_dim", text.get("head_dim", 256)),
                      num_kv_heads=overrides.get("num_key_value_heads", text["num_key_value_heads"]),
                      rope_theta=float(rope["rope_theta"]), rotated_fraction=fraction,
                      proportional=rope_type == "proportional")


DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}


def layer_types(text: dict) -> list[str]:
    """Each layer's type as transformers settles it: five sliding to one global, the last layer global."""
    count = text["num_hidden_layers"]
    types = list(text.get("layer_types") or
                 ["sliding_attention" if (index + 1) % 6 else "full_attention" for index in range(count)])
    types[-1] = "full_attention"
    return types


def gemma_text_config(config: dict) -> GemmaTextConfig:
    """The text stack of a DiffusionGemma config.json; ValueError naming a key it would not reproduce."""
    text = config.get("text_config") or {}
    _check_supported(text)
    per_layer = (text["per_layer_config"] or {}) if "per_layer_config" in text else None
    layers = tuple(_layer_shape(text, index, kind, per_layer) for index, kind in enumerate(layer_types(text)))
    return GemmaTextConfig(
        vocab_size=text.get("vocab_size", 262_144), hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"], num_heads=text["num_attention_heads"], layers=layers,
        sliding_window=text.get("sliding_window", 512), num_experts=text["num_experts"],
        experts_per_token=text["top_k_experts"], moe_intermediate_size=text["moe_intermediate_size"],
        canvas_length=config.get("canvas_length", 256), rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        final_logit_softcapping=float(text.get("final_logit_softcapping") or 30.0),
        max_position_embeddings=text.get("max_position_embeddings", 131_072),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)))
