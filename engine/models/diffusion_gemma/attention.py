"""DiffusionGemma's attention in one layer: a store's causal attention over its row's cached context (writing
its keys and values, and the prefix cache's pages), and the canvases' bidirectional attention over their
row's context and themselves. The eager forward and the compiled graphs both call it."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.diffusion_gemma.step import DecodePlan, StorePlan


def attention(layer: nn.Module, cache: torch.Tensor, pages: torch.Tensor | None, h: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor, store: StorePlan | None, decode: DecodePlan | None,
              num_store: int) -> torch.Tensor:
    """One layer's attention over both parts: the store's keys and values written (and its pages), then
    the canvases over their context and themselves. ``h`` holds the store's tokens first."""
    q, k, v = layer.self_attn.project(h, cos, sin)
    sliding = layer.shape.kind == "sliding"
    outputs = []
    if store is not None:
        if store.page_tokens is not None:
            pages[store.page_entries, :, :, store.page_columns] = torch.stack(
                [k[store.page_tokens], v[store.page_tokens]], dim=1)
        outputs.append(store_attention(cache, q[:num_store], k[:num_store], v[:num_store], store, sliding))
    if decode is not None:
        rows, length = decode.rows, decode.length
        canvas_kv = torch.stack([k[num_store:], v[num_store:]], dim=1).view(rows, length, 2, *k.shape[1:])
        canvas_kv = canvas_kv.permute(0, 2, 3, 1, 4)  # [rows, 2, kv_heads, canvas, d]
        context = cache[decode.slots] if sliding else cache[decode.slots, :, :, :decode.global_keys]
        keys = torch.cat([context, canvas_kv], dim=3)
        mask = decode.sliding_mask if sliding else decode.global_mask
        queries = q[num_store:].view(rows, length, *q.shape[1:])
        outputs.append(_attend(queries, keys, mask).reshape(rows * length, -1))
    return layer.self_attn.o_proj(torch.cat(outputs) if len(outputs) > 1 else outputs[0])


def store_attention(cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: StorePlan,
                    sliding: bool) -> torch.Tensor:
    """The store's queries over their row's cached context and themselves, causally; its keys and values
    written to the cache (a sliding layer's ring keeps the last ones)."""
    new_kv = torch.stack([k, v], dim=1)  # [tokens, 2, kv_heads, d]
    queries = plan.to_box(q)
    if sliding:
        box = plan.to_box(new_kv).permute(0, 2, 3, 1, 4)  # [rows, 2, kv_heads, length, d]
        keys = torch.cat([cache[plan.slots], box], dim=3)
        out = _attend(queries, keys, plan.sliding_mask)
        cache[plan.token_slots[plan.ring_tokens], :, :, plan.ring_columns] = new_kv[plan.ring_tokens]
    else:
        cache[plan.token_slots, :, :, plan.positions] = new_kv
        out = _attend(queries, cache[plan.slots, :, :, :plan.global_keys], plan.global_mask)
    return plan.from_box(out)


def _attend(queries: torch.Tensor, keys_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """queries ``[rows, length, heads, d]``, keys_values ``[rows, 2, kv_heads, keys, d]``; scale 1 (q is
    normed). Returns ``[rows, length, heads * d]``."""
    keys, values = keys_values.unbind(1)
    groups = queries.shape[2] // keys.shape[1]
    out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values, attn_mask=mask, scale=1.0,
                                         enable_gqa=groups > 1)
    return out.transpose(1, 2).reshape(queries.shape[0], queries.shape[1], -1)
