"""The transformer's shape: what a checkpoint family's loader (llada.py, dream.py) reads from its config."""
from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads
