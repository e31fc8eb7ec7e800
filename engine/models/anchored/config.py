"""The shape of an anchored-block model: a Ministral-3 stack (RMSNorm, SwiGLU, grouped-query attention) with
YaRN rotary tables and Llama-4's per-position query scale, as its ``config.json`` gives them."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.models.kv_cache import CacheSpec
from engine.parallel.shard import TensorShard


@dataclass(frozen=True)
class AnchoredConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_parameters: dict = field(default_factory=dict)  # transformers' names, ``rope_theta`` and ``rope_type``
    # included: "yarn" (the release's) or "default"
    shard: TensorShard = field(default_factory=TensorShard)  # the rank these shapes are one share of

    def rank_share(self, shard: TensorShard) -> AnchoredConfig:
        """The shapes rank ``shard.rank`` holds: its heads and its part of the MLP (vocabulary whole: the
        embedding and head modules split it)."""
        if not shard.is_split:
            return self
        return replace(self, num_heads=shard.split(self.num_heads, "attention heads"),
                       num_kv_heads=shard.split_kv_heads(self.num_kv_heads),
                       intermediate_size=shard.split(self.intermediate_size, "intermediate_size"), shard=shard)

    def cache_spec(self, columns: int) -> CacheSpec:
        """Anchored rows' cache: every layer keeps ``columns`` context positions (column = position)."""
        return CacheSpec.uniform(self.num_layers, self.num_kv_heads, self.head_dim, columns)

    @property
    def query_scale_beta(self) -> float | None:
        """Llama-4's ``llama_4_scaling_beta``: queries at position p are scaled by
        ``1 + beta * log(1 + floor(p / original_max_position_embeddings))`` (None: no scale)."""
        return self.rope_parameters.get("llama_4_scaling_beta")

    @property
    def query_scale_span(self) -> int:
        """The positions over which the query scale stays 1.0 (``original_max_position_embeddings``)."""
        return int(self.rope_parameters.get("original_max_position_embeddings") or self.max_position_embeddings)

    def inverse_frequencies(self) -> tuple[torch.Tensor, float]:
        """RoPE's inverse frequencies ``[head_dim / 2]`` (float32) and the factor cos and sin are scaled by,
        computed by transformers' own rope functions (YaRN's ramp and ``mscale`` included)."""
        rope = {key: value for key, value in self.rope_parameters.items() if key != "llama_4_scaling_beta"}
        config = PretrainedConfig()
        config.hidden_size, config.num_attention_heads, config.head_dim = (
            self.hidden_size, self.num_heads, self.head_dim)
        config.max_position_embeddings, config.rope_parameters = self.max_position_embeddings, rope
        if rope.get("rope_type", "default") == "default":
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
            return 1.0 / rope["rope_theta"] ** exponents, 1.0
        inverse, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, torch.device("cpu"))
        return inverse.float(), float(factor)
