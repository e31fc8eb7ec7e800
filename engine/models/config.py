"""The transformer's shape: what a checkpoint family's module (``engine.models.families``) reads from its
config.json."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.models.kv_cache import CacheSpec
from engine.parallel.shard import TensorShard

TRANSFORMER_ATTENTIONS = ("bidirectional", "block_causal")  # the one transformer's: whole rows, or blocks

@dataclass(frozen=True)
class MoEConfig:
    """A sparse mixture-of-experts MLP (LLaDA2): sigmoid router, group-limited top-k (LLaDA2.0 / 2.1) or
    block routing (LLaDA2.2, ``expert_capacity`` set), a shared expert."""

    num_experts: int
    experts_per_token: int  # top-k routed experts of a token
    moe_intermediate_size: int  # each routed expert's SwiGLU width
    n_group: int = 1  # experts form n_group groups of consecutive experts ...
    topk_group: int = 1  # ... and a token chooses among the experts of its topk_group best groups
    num_shared_experts: int = 0  # one shared SwiGLU of width moe_intermediate_size * num_shared_experts
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0  # layers below this index use the dense MLP (intermediate_size)
    expert_capacity: int | None = None  # block routing (LLaDA2.2): the experts one routing block keeps;
    # None: group-limited routing per token
    routing_block: int | None = None  # block routing's blocks of absolute positions (the checkpoint's block_size)

    def __post_init__(self):
        if self.expert_capacity is not None:
            if not 0 < self.experts_per_token <= self.expert_capacity <= self.num_experts:
                raise ValueError(f"block routing needs 0 < experts_per_token ({self.experts_per_token}) <= "
                                 f"expert_capacity ({self.expert_capacity}) <= num_experts ({self.num_experts})")
            if not self.routing_block or self.routing_block < 1:
                raise ValueError(f"block routing needs a positive routing_block, got {self.routing_block!r}")
        if self.num_experts % self.n_group or self.num_experts // self.n_group < 2:
            raise ValueError(f"{self.num_experts} experts do not form {self.n_group} groups of two or more")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"topk_group {self.topk_group} must be in [1, n_group {self.n_group}]")
        if self.experts_per_token > self.topk_group * self.num_experts // self.n_group:
            raise ValueError(f"{self.experts_per_token} experts per token exceed the {self.topk_group} "
                             "chosen groups' experts")


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    rope_full_precision: bool = False  # rotate q/k in float32 even in a half-precision model (LLaDA)
    embedding_scale: float = 1.0  # LLaDA's input_emb_norm multiplies embeddings by sqrt(hidden)
    logit_scale: float = 1.0  # LLaDA's scale_logits multiplies logits by 1/sqrt(hidden)
    head_dim: int | None = None  # None: hidden_size // num_heads (SDAR and LLaDA2 give it explicitly)
    qk_norm: bool = False  # per-head RMSNorm of q and k (weights [head_dim]) before RoPE (SDAR, LLaDA2)
    rotary_dim: int | None = None  # RoPE rotates the first rotary_dim dims of a head; None: head_dim
    attention: str = "bidirectional"  # one of TRANSFORMER_ATTENTIONS: over the whole row, or over blocks
    moe: MoEConfig | None = None
    shard: TensorShard = field(default_factory=TensorShard)  # the rank these shapes are one share of

    def __post_init__(self):
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"rotary_dim {self.rotary_dim} must be even and in (0, head_dim {self.head_dim}]")
        if self.attention not in TRANSFORMER_ATTENTIONS:
            raise ValueError(f"attention must be one of {TRANSFORMER_ATTENTIONS}, got {self.attention!r}")

    def cache_spec(self, width: int) -> CacheSpec:
        """Block rows' cache: every layer full, with the key mask and the scratch column a window needs."""
        return CacheSpec.uniform(self.num_layers, self.num_kv_heads, self.head_dim, width, scratch_column=True,
                                 key_mask=True)

    @property
    def routing_block(self) -> int | None:
        """The routing blocks of a block-routed MoE (LLaDA2.2), else None."""
        return self.moe.routing_block if self.moe is not None and self.moe.expert_capacity is not None else None

    def rank_share(self, shard: TensorShard) -> TransformerConfig:
        """The shapes rank ``shard.rank`` holds: its heads, its part of each MLP and expert (vocabulary whole:
        the embedding and head modules split it)."""
        if not shard.is_split:
            return self
        moe = self.moe and replace(self.moe, moe_intermediate_size=shard.split(
            self.moe.moe_intermediate_size, "moe_intermediate_size"))
        return replace(self, num_heads=shard.split(self.num_heads, "attention heads"),
                       num_kv_heads=shard.split_kv_heads(self.num_kv_heads), head_dim=self.head_dim,
                       intermediate_size=shard.split(self.intermediate_size, "intermediate_size"), moe=moe,
                       shard=shard)


def qwen_transformer_config(config: dict, **fields) -> TransformerConfig:
    """The shape a config.json of Qwen2's or Qwen3's keys describes (Dream, SDAR), with ``fields`` on top."""
    num_heads = config["num_attention_heads"]
    return TransformerConfig(**{
        "vocab_size": config["vocab_size"], "hidden_size": config["hidden_size"],
        "num_layers": config["num_hidden_layers"], "num_heads": num_heads,
        "num_kv_heads": config.get("num_key_value_heads") or num_heads,
        "intermediate_size": config["intermediate_size"], "rope_theta": float(config.get("rope_theta", 10000.0)),
        "rms_norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": config.get("max_position_embeddings", 32768),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)), **fields})
