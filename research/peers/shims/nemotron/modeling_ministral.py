"""Our stand-in for Nemotron-Labs-Diffusion's companion ``modeling_ministral.py``, which is not public.

The remote ``modeling_nemotron_labs_diffusion.py`` imports ``Ministral3Model``, ``Ministral3PreTrainedModel``,
``Ministral3Attention``, ``apply_rotary_pos_emb``, ``repeat_kv`` and ``_get_llama_4_attn_scale`` from it. This
file builds them on transformers' ``ministral3`` (its layers, YaRN rotary tables and Llama-4 query scale), and
adds the one switch the remote code drives, as its calls imply:

* attention is causal when a layer's ``diffusion_lm`` is False or the call passes ``use_causal_mask=True``,
  else bidirectional over the cached context and the whole input;
* a call with ``use_cache=True`` appends the input's keys and values to the cache; any other call reads the
  cache and writes nothing (the denoising and drafting forwards).

The Llama-4 scale multiplies the rotated queries at absolute positions (the cache's length plus the offset).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.models.ministral3 import modeling_ministral3 as tf
from transformers.models.ministral3.modeling_ministral3 import apply_rotary_pos_emb, repeat_kv  # noqa: F401

Ministral3PreTrainedModel = tf.Ministral3PreTrainedModel


def _get_llama_4_attn_scale(positions, beta, original_max_position_embeddings):
    """Per-position query scale ``[positions, 1]`` (broadcast over ``[batch, heads, positions, head_dim]``)."""
    if beta is None:
        return torch.ones((positions.shape[-1], 1), device=positions.device)
    return (1 + beta * torch.log(1 + torch.floor(positions.float() / original_max_position_embeddings)))[:, None]


class Ministral3Attention(tf.Ministral3Attention):
    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.diffusion_lm = getattr(config, "diffusion_lm", False)

    def forward(self, hidden_states, position_embeddings, cache_position, past_key_values=None,
                use_cache=False, use_causal_mask=False):
        batch, length, _ = hidden_states.shape
        shape = (batch, length, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        rope = self.config.rope_parameters
        q = q * _get_llama_4_attn_scale(cache_position, rope.get("llama_4_scaling_beta"),
                                        rope.get("original_max_position_embeddings")).to(q.dtype)
        past = past_key_values.get_seq_length(self.layer_idx) if past_key_values is not None else 0
        if past_key_values is not None and use_cache:
            k, v = past_key_values.update(k, v, self.layer_idx)
        elif past:
            layer = past_key_values.layers[self.layer_idx]
            k, v = torch.cat([layer.keys, k], dim=2), torch.cat([layer.values, v], dim=2)
        k, v = repeat_kv(k, self.num_key_value_groups), repeat_kv(v, self.num_key_value_groups)
        causal = use_causal_mask or not self.diffusion_lm
        mask = None
        if causal:
            keys = torch.arange(k.shape[2], device=q.device)
            mask = keys[None, :] <= (past + torch.arange(length, device=q.device))[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor
    past_key_values: DynamicCache | None


class Ministral3Model(Ministral3PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList()
        for index in range(config.num_hidden_layers):
            layer = tf.Ministral3DecoderLayer(config, index)
            layer.self_attn = Ministral3Attention(config, index)
            self.layers.append(layer)
        self.norm = tf.Ministral3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = tf.Ministral3RotaryEmbedding(config=config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                cache_position=None, use_causal_mask=False, is_training=False, **kwargs):
        if attention_mask is not None:
            raise ValueError("this stand-in runs unpadded rows only")
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        hidden = self.embed_tokens(input_ids)
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if cache_position is None:
            cache_position = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)
        if position_ids is None:
            position_ids = cache_position[None]
        position_embeddings = self.rotary_emb(hidden, position_ids)
        for layer in self.layers:
            hidden = hidden + layer.self_attn(layer.input_layernorm(hidden), position_embeddings, cache_position,
                                              past_key_values, use_cache, use_causal_mask)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return EncoderOutput(self.norm(hidden), past_key_values if use_cache else None)
