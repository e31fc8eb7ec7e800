"""One bidirectional transformer for every checkpoint family (LLaDA, Dream).

Llama-shaped blocks (RMSNorm, RoPE, SwiGLU, multi-head or grouped-query attention, optional QKV bias)
with **no causal mask**. Two things make it fit mixed-state batching:

* RoPE is driven by explicit per-row ``position_ids``, so a left-padded row sees exactly the relative
  positions it would see alone.
* A forward can run over a *window* of columns per row (``[rows, width]`` column indices, each row its
  own columns) against a :class:`KVCache` built by an earlier full forward. The window's own keys and
  values are written into the cache in place and attention runs over the whole cached row, which gives
  the "dual cache" step when the window is the active block and the "prefix cache" step when the window
  is the active block plus everything after it (the columns before it are then the cached prefix).

Keys are cached after RoPE: a column's position never changes for a row, so rotating once is enough.
Each cache tensor has one extra trailing "scratch" column that is always masked out; window entries
that do not exist for a row (rows with shorter windows) are pointed at it, so a ragged window is still
one dense scatter with no Python loop over rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass
class KVCache:
    """Per-layer keys/values ``[rows, kv_heads, width + 1, head_dim]``; the last column is scratch."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_mask: torch.Tensor  # [rows, width + 1] bool, True where a real (non-pad) key sits

    @property
    def scratch_column(self) -> int:
        return self.key_mask.shape[1] - 1

    def select_rows(self, rows: torch.Tensor) -> KVCache:
        """The cache of ``rows`` only (copied), for a batch whose other rows have left."""
        return KVCache([k[rows] for k in self.keys], [v[rows] for v in self.values], self.key_mask[rows])


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin ``[rows, 1, width, head_dim]`` for rotate-half RoPE at explicit positions."""
    compute_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    exponents = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=compute_dtype) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    angles = position_ids.to(compute_dtype)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, key_mask, cache_kv=None, window_columns=None):
        rows, width, _ = x.shape
        q = self.q_proj(x).view(rows, width, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(rows, width, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(rows, width, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache_kv is not None:
            cached_k, cached_v = cache_kv
            index = window_columns[:, None, :, None].expand(-1, self.num_kv_heads, -1, self.head_dim)
            cached_k.scatter_(2, index, k)
            cached_v.scatter_(2, index, v)
            k, v = cached_k, cached_v
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask[:, None, None, :],
            enable_gqa=self.num_kv_heads != self.num_heads)
        out = out.transpose(1, 2).reshape(rows, width, -1)
        return self.o_proj(out), (k, v)


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config)
        self.post_attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, key_mask, cache_kv=None, window_columns=None):
        attended, kv = self.attention(self.input_norm(x), cos, sin, key_mask, cache_kv, window_columns)
        x = x + attended
        return x + self.mlp(self.post_attention_norm(x)), kv


class BidirectionalTransformer(nn.Module):
    """Token ids in, final hidden states out; :meth:`logits` maps chosen hidden states to the vocab.

    Callers gather the hidden states they need *before* asking for logits, so a ``[rows, width,
    vocab]`` tensor is never built.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward_full(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, key_mask: torch.Tensor,
        build_cache: bool = False,
    ) -> tuple[torch.Tensor, KVCache | None]:
        """Every column of every row. ``key_mask`` [rows, width] is True on real tokens."""
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, x.dtype)
        keys, values = [], []
        for layer in self.layers:
            x, (k, v) = layer(x, cos, sin, key_mask)
            if build_cache:
                keys.append(F.pad(k, (0, 0, 0, 1)))
                values.append(F.pad(v, (0, 0, 0, 1)))
        if not build_cache:
            return x, None
        return x, KVCache(keys, values, F.pad(key_mask, (0, 1), value=False))

    def forward_window(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, window_columns: torch.Tensor,
        cache: KVCache,
    ) -> torch.Tensor:
        """Run ``[rows, window]`` tokens that sit at ``window_columns`` of each cached row.

        Their keys/values replace the cached ones in place; columns pointing at the scratch column are
        padding of a ragged window and are never attended.
        """
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer, k, v in zip(self.layers, cache.keys, cache.values):
            x, _ = layer(x, cos, sin, cache.key_mask, (k, v), window_columns)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))
