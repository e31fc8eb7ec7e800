"""One bidirectional transformer for every checkpoint family (LLaDA, Dream).

Llama-shaped blocks (RMSNorm, RoPE, SwiGLU, multi-head or grouped-query attention, optional QKV bias)
with **no causal mask**. Two things make it fit mixed-state batching:

* RoPE is driven by explicit per-row ``position_ids``, so a left-padded row sees exactly the relative
  positions it would see alone.
* A forward runs up to two *parts* packed together (:meth:`BidirectionalTransformer.forward_step`):
  whole rows (a block's first step, which also writes the rows' keys/values into a preallocated
  :class:`KVArena`) and windows of columns per row (each row its own columns) that attend to the rows'
  cached keys/values. The parts share every linear layer (one pass over the weights); attention runs per
  part. A window's own keys/values replace the cached ones in place, which gives the "dual cache" step
  when the window is the active block and the "prefix cache" step when it is the active block plus
  everything after it (the columns before it are then the cached prefix).

Keys are cached after RoPE: a column's position never changes for a row, so rotating once is enough.
The arena has one trailing "scratch" column that is always masked out; window entries that do not
exist for a row (rows with shorter windows) are pointed at it, so a ragged window is still one dense
scatter with no Python loop over rows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.step_inputs import KVArena, RefreshPart, WindowPart


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
    """Rotate-half RoPE in the dtype of ``cos`` (float32 tables rotate a bf16 ``x`` in float32)."""
    widened = x.to(cos.dtype)
    first, second = widened.chunk(2, dim=-1)
    return (widened * cos + torch.cat([-second, first], dim=-1) * sin).to(x.dtype)


def _attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_mask: torch.Tensor,
               gqa: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=key_mask[:, None, None, :], enable_gqa=gqa)


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

    def forward(self, x: torch.Tensor, parts: list[_PartContext], layer: int) -> torch.Tensor:
        """x: the parts' tokens packed ``[tokens, hidden]``; projections run once over all of them."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        outputs, offset = [], 0
        for part in parts:
            size = part.rows * part.length
            shape = (part.rows, part.length, -1, self.head_dim)
            part_q, part_k, part_v = (t[offset:offset + size].view(shape).transpose(1, 2) for t in (q, k, v))
            part_q, part_k = apply_rotary(part_q, part.cos, part.sin), apply_rotary(part_k, part.cos, part.sin)
            out = part.attend(layer, part_q, part_k, part_v, self.num_kv_heads != self.num_heads)
            outputs.append(out.transpose(1, 2).reshape(size, -1))
            offset += size
        return self.o_proj(torch.cat(outputs) if len(outputs) > 1 else outputs[0])


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

    def forward(self, x: torch.Tensor, parts: list[_PartContext], layer: int) -> torch.Tensor:
        x = x + self.attention(self.input_norm(x), parts, layer)
        return x + self.mlp(self.post_attention_norm(x))


@dataclass
class _PartContext:
    """One part of a packed forward as its layers see it: shape, rotary tables, where keys come from."""

    rows: int
    length: int
    cos: torch.Tensor
    sin: torch.Tensor
    attend: Callable  # (layer, q, k, v, gqa) -> attention output: where this part's keys come from


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

    def forward_full(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                     key_mask: torch.Tensor) -> torch.Tensor:
        """Every column of every row, no cache: hidden states ``[rows, width, hidden]``."""
        columns = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.forward_step(RefreshPart(input_ids, position_ids, key_mask, columns), None, None)

    def forward_step(self, refresh: RefreshPart | None, window: WindowPart | None,
                     arena: KVArena | None) -> torch.Tensor:
        """One packed forward of a refresh part and/or a window part.

        Returns the hidden states the parts ask for, refresh rows first: ``[rows, n, hidden]``.
        """
        parts, inputs = [], []
        if refresh is not None:
            parts.append(self._refresh_context(refresh, arena))
            inputs.append(refresh.tokens)
        if window is not None:
            parts.append(self._window_context(window, arena))
            inputs.append(window.tokens)
        x = self.embed_tokens(torch.cat([t.reshape(-1) for t in inputs]) if len(inputs) > 1
                              else inputs[0].reshape(-1))
        if self.config.embedding_scale != 1.0:
            x = x * self.config.embedding_scale
        for index, layer in enumerate(self.layers):
            x = layer(x, parts, index)
        read, offset = [], 0
        for part, context in zip((p for p in (refresh, window) if p is not None), parts):
            hidden = x[offset:offset + context.rows * context.length].view(context.rows, context.length, -1)
            offset += context.rows * context.length
            if isinstance(part, RefreshPart):
                read.append(hidden.gather(1, part.read_columns[..., None].expand(-1, -1, hidden.shape[-1])))
            elif part.read_shift:
                positions = (torch.arange(part.num_read, device=hidden.device) - part.read_shift).clamp(min=0)
                read.append(hidden[:, positions])
            else:
                read.append(hidden[:, :part.num_read])
        return torch.cat(read) if len(read) > 1 else read[0]

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = self.embed_tokens.weight.dtype
        if self.config.rope_full_precision and dtype in (torch.float16, torch.bfloat16):
            dtype = torch.float32
        return rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def _refresh_context(self, part: RefreshPart, arena: KVArena | None) -> _PartContext:
        rows, length = part.tokens.shape
        end = part.first_column + length

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
            if part.slots is not None:
                arena.keys[layer][part.slots, :, part.first_column:end] = k
                arena.values[layer][part.slots, :, part.first_column:end] = v
            return _attention(q, k, v, part.key_mask, gqa)

        return _PartContext(rows, length, *self._rotary(part.positions), attend)

    def _window_context(self, part: WindowPart, arena: KVArena) -> _PartContext:
        rows, length = part.tokens.shape
        slot_index = part.slots[:, None]
        start = part.context_start

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
            keys, values = arena.keys[layer], arena.values[layer]
            keys[slot_index, :, part.columns] = k.transpose(1, 2)
            values[slot_index, :, part.columns] = v.transpose(1, 2)
            if part.slot_runs is None:
                return _attention(q, keys[part.slots, :, start:], values[part.slots, :, start:],
                                  arena.key_mask[part.slots, start:], gqa)
            outputs, row = [], 0
            for first, count in part.slot_runs:  # views of the arena: no copy of the cache
                last = first + count
                outputs.append(_attention(q[row:row + count], keys[first:last, :, start:],
                                          values[first:last, :, start:], arena.key_mask[first:last, start:], gqa))
                row += count
            return torch.cat(outputs) if len(outputs) > 1 else outputs[0]

        return _PartContext(rows, length, *self._rotary(part.positions), attend)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(hidden))
        return logits * self.config.logit_scale if self.config.logit_scale != 1.0 else logits
