"""A CPU stand-in for the ``flash_attn`` package, written for the peer harness (not the real library).

Only what SDAR's ``modeling_sdar.py`` calls at inference is here: ``flash_attn_func`` runs
``torch.nn.functional.scaled_dot_product_attention`` on flash-attn's ``[batch, length, heads, dim]`` layout.
Grouped-query attention follows flash-attn's rule (query head ``h`` reads key/value head ``h // (Hq / Hkv)``),
which is SDPA's ``enable_gqa``. ``causal=True`` uses flash-attn's bottom-right alignment when the query is
shorter than the keys.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, **unused):
    """Attention of ``q [b, lq, hq, d]`` over ``k, v [b, lk, hkv, d]``; returns ``[b, lq, hq, d]``."""
    if dropout_p or alibi_slopes is not None or tuple(window_size) != (-1, -1) or return_attn_probs or unused:
        raise NotImplementedError("flash_attn shim: only dropout 0, no alibi, no window, no probs")
    mask = None
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        rows = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
        mask = torch.arange(lk, device=q.device)[None, :] <= rows
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         is_causal=False, scale=softmax_scale, enable_gqa=True)
    return out.transpose(1, 2)


def flash_attn_varlen_func(*args, **kwargs):
    raise NotImplementedError("flash_attn shim: varlen attention is not provided")
