"""The transformer's elementwise pieces and its attention call, each in as few operations as its
precision allows (every aten operation is a dispatch and, on a GPU, a kernel launch).

* RMSNorm normalizes in float32 for a half-precision input, casts back, then scales: LLaDA's order.
* Rotate-half RoPE as ``x * cos + roll(x, d/2) * signed_sin`` with ``signed_sin = [-sin, sin]``: the
  same products as ``x * cos + cat(-x2, x1) * sin`` (a negation is exact), q and k of every packed
  token rotated by one call, in place; partial RoPE rotates a head's first ``rotary_dim`` dims.
* Attention stays on a fused SDPA kernel for grouped-query models too: on CUDA, where ``enable_gqa``
  with an explicit mask falls back to the math backend (fp32 scores, K/V repeated), the query groups
  are folded into the query length instead, so SDPA sees as many query heads as key heads and no K/V
  is copied.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HALF_DTYPES = (torch.float16, torch.bfloat16)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in HALF_DTYPES:
            normalized = x.float()
            normalized = normalized * torch.rsqrt(normalized.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * normalized.to(x.dtype)
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotary_tables(position_ids: torch.Tensor, rotary_dim: int, theta: float,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``signed_sin`` (``[-sin, sin]``) for rotate-half RoPE at explicit positions.

    ``position_ids`` of any shape ``[...]`` give tables ``[..., 1, rotary_dim]`` (broadcast over heads).
    ``rotary_dim`` is the rotated width of a head, also the exponent's denominator: the whole head_dim
    for most families, ``int(head_dim * partial_rotary_factor)`` for partial RoPE (LLaDA2, as
    transformers' default rope init computes it). Angles are computed in float32 (float64 for a float64
    model), then cast to ``dtype``.
    """
    compute_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    exponents = torch.arange(0, rotary_dim, 2, device=position_ids.device, dtype=compute_dtype) / rotary_dim
    angles = position_ids.to(compute_dtype)[..., None, None] * (1.0 / theta**exponents)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1).to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype)


def rotate_(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[..., heads, head_dim]`` in place, computing in the tables' dtype (float32 tables
    rotate a bf16 ``x`` in float32 and round once, as LLaDA's ``rope_full_precision``).

    Tables narrower than the head (partial RoPE) rotate the first ``rotary_dim`` dims of each head,
    rotate-half within them; the other dims pass through unchanged."""
    rotated = x if cos.shape[-1] == x.shape[-1] else x[..., :cos.shape[-1]]
    eager_inference = not torch.compiler.is_compiling() and not (x.requires_grad and torch.is_grad_enabled())
    half = rotated.shape[-1] // 2
    if x.dtype == cos.dtype and eager_inference:  # one op fewer; a compiled graph cannot take out= views
        torch.add(rotated * cos, rotated.roll(half, dims=-1) * signed_sin, out=rotated)
    elif x.dtype == cos.dtype:  # training (out= has no autograd) or compiled: copy_
        rotated.copy_(rotated * cos + rotated.roll(half, dims=-1) * signed_sin)
    else:
        widened = rotated.to(cos.dtype)
        rotated.copy_(widened * cos + widened.roll(half, dims=-1) * signed_sin)
    return x


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
           fold_groups: bool | None = None) -> torch.Tensor:
    """Bidirectional attention, token-major in and out.

    q ``[rows, length, heads, d]``; keys/values ``[rows, kv_heads, keys, d]`` (views of a cache are
    fine); mask ``[rows, 1, 1, keys]`` additive (0 or -inf), depending only on the key, or
    ``[rows, 1, length, keys]``, one per query (block-causal attention). Returns
    ``[rows * length, heads * d]``. A grouped-query model's groups are folded into the query length
    (``fold_groups``, default: everywhere but the CPU, whose fused kernel takes ``enable_gqa`` with a
    mask; CUDA's fused kernels do not, and SDPA would fall back to its math backend). Both give the
    same numbers: each query row attends on its own.
    """
    rows, length, heads, head_dim = q.shape
    groups = heads // keys.shape[1]
    if fold_groups is None:
        fold_groups = q.device.type != "cpu"
    if groups == 1 or not fold_groups:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask,
                                             enable_gqa=groups > 1)
        return out.transpose(1, 2).reshape(rows * length, heads * head_dim)
    # query head h reads key head h // groups: fold each key head's groups into its query length
    folded = q.view(rows, length, -1, groups, head_dim).permute(0, 2, 3, 1, 4)
    folded = folded.reshape(rows, -1, groups * length, head_dim)
    if mask.shape[2] > 1:  # folded query g * length + i is query i of group g
        mask = mask.repeat(1, 1, groups, 1)
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask)
    out = out.view(rows, -1, groups, length, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(rows * length, heads * head_dim)
