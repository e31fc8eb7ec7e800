"""One transformer for every checkpoint family (LLaDA, Dream, SDAR, LLaDA2).

Llama-shaped blocks (RMSNorm, RoPE, SwiGLU, multi-head or grouped-query attention, optional QKV bias)
with **no causal mask**: attention is bidirectional, or block-causal when a part says so. Per family:
an explicit head_dim, q/k RMSNorm before RoPE and partial RoPE (SDAR, LLaDA2), a mixture-of-experts
MLP after the first dense layers (LLaDA2, ``engine.models.moe``). Two things make it fit mixed-state
batching:

* RoPE is driven by explicit per-row ``position_ids``, so a left-padded row sees exactly the relative
  positions it would see alone.
* A forward runs up to two *parts* packed together (:meth:`BidirectionalTransformer.forward_step`):
  whole rows (a block's first step, which also writes the rows' keys/values into a preallocated
  :class:`KVCache`) and windows of columns per row (each row its own columns) that attend to the rows'
  cached keys/values. The parts share every linear layer (one pass over the weights), which sees each
  row's real tokens only (``engine.models.packed_step``); attention runs per part, in the part's box.
  A window's own keys/values replace the cached ones in place, which gives the "dual cache" step when
  the window is the active block and the "prefix cache" step when it is the active block plus
  everything after it (the columns before it are then the cached prefix).

Keys are cached after RoPE: a column's position never changes for a row, so rotating once is enough.
The cache has one trailing "scratch" column that is always masked out; window entries that do not
exist for a row (rows with shorter windows) are pointed at it, so a ragged window is still one dense
scatter with no Python loop over rows.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.layers import vocab
from engine.layers.linear import RowParallelLinear
from engine.layers.loading import checkpoint_slots
from engine.models.config import TransformerConfig
from engine.models.kv_cache import KVCache
from engine.models.layers import RMSNorm, attend, rotate_
from engine.models.moe import MoE
from engine.models.options import ModelOptions
from engine.models.packed_step import PartPlan, StepPlan, packed_tokens, plan_step, rotary_dtype
from engine.models.projections import MLP, fused_projection
from engine.models.step_inputs import RefreshPart, WindowPart


def each_row(function, x: torch.Tensor, spans: tuple[tuple[int, int], ...] | None) -> torch.Tensor:
    """``function`` over packed tokens ``x`` at once, or (batch-invariant mode) over each row's own span
    of tokens, so a GEMM sees the row count it sees for that row alone (bf16 GEMM rows can change with
    the number of rows and their offset in the matrix); tokens outside every span get zeros."""
    if spans is None:
        return function(x)
    outputs = [function(x[start:start + count]) for start, count in spans]
    out = x.new_zeros(x.shape[0], outputs[0].shape[-1])
    for (start, count), output in zip(spans, outputs):
        out[start:start + count] = output
    return out


class Attention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.rotary_dim = config.rotary_dim
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.qkv_proj = fused_projection(self, "qkv_proj", config.hidden_size, {
            "q_proj": q_size, "k_proj": kv_size, "v_proj": kv_size}, config.qkv_bias, "query_key_value", config.shard)
        self.o_proj = RowParallelLinear(q_size, config.hidden_size, config.shard)  # sums the heads over the ranks
        # per-head RMSNorm of q and k before RoPE (SDAR, LLaDA2)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.batch_invariant = False  # each row attends alone over its own keys (apply_options)

    def forward(self, x: torch.Tensor, plan: StepPlan, layer: int) -> torch.Tensor:
        """x: the parts' tokens packed ``[tokens, hidden]``; one GEMM and one rotation for all of them,
        then one attention call per part."""
        spans = plan.token_spans if self.batch_invariant else None
        qkv = each_row(self.qkv_proj, x, spans).view(x.shape[0], -1, self.head_dim)  # [tokens, q+k+v heads, d]
        if self.q_norm is not None:
            heads, keys = self.num_heads, self.num_heads + self.num_kv_heads
            qkv[:, :heads] = self.q_norm(qkv[:, :heads])
            qkv[:, heads:keys] = self.k_norm(qkv[:, heads:keys])
        if plan.cos.shape[-1] != self.rotary_dim:  # tables built for another width would rotate wrongly
            raise ValueError(f"rotary tables of width {plan.cos.shape[-1]}, expected rotary_dim {self.rotary_dim}")
        rotate_(qkv[:, :self.num_heads + self.num_kv_heads], plan.cos, plan.signed_sin)
        outputs = [self._attend_part(qkv, part, plan, layer) for part in plan.parts]
        return each_row(self.o_proj, outputs[0] if len(outputs) == 1 else torch.cat(outputs), spans)

    def _attend_part(self, qkv: torch.Tensor, part: PartPlan, plan: StepPlan, layer: int) -> torch.Tensor:
        """One part's attention in its box (a packed part's tokens scattered into it and back)."""
        if len(plan.parts) > 1:
            qkv = qkv[part.offset:part.offset + part.num_tokens]
        qkv = part.to_box(qkv).view(part.rows, part.length, -1, self.head_dim)
        new_kv = qkv[:, :, self.num_heads:].view(part.rows, part.length, 2, self.num_kv_heads, self.head_dim)
        if part.write_index is not None:
            plan.layers[layer][part.write_index] = new_kv
        q = qkv[:, :, :self.num_heads]
        if self.batch_invariant:
            return part.from_box(self._attend_each_row(q, new_kv, part, layer))
        if part.context is None:
            keys, values = new_kv.transpose(1, 3).unbind(2)  # [rows, kv_heads, length, d] each
        else:
            keys, values = part.context[layer].unbind(1)
        return part.from_box(attend(q, keys, values, part.mask))

    def _attend_each_row(self, q: torch.Tensor, new_kv: torch.Tensor, part: PartPlan, layer: int) -> torch.Tensor:
        """Batch-invariant attention: each row alone, over exactly its own keys (and, in a refresh part,
        its own queries), so every kernel sees the shapes it would see in a batch of one and a row's
        numbers cannot depend on its neighbours or on the box's width. Pad queries get zeros."""
        if len(part.context_rows) != part.rows:
            raise ValueError("batch-invariant attention needs each row's place in the context (PartPlan.context_rows)")
        out = q.new_zeros(part.rows, part.length, self.num_heads * self.head_dim)
        for row, (place, num_keys) in enumerate(zip(part.context_rows, part.row_keys)):
            own_keys = part.attention.own_columns(num_keys, part.mask.shape[-1])
            if part.context is None:  # refresh: the row's own tokens are its queries and its keys
                keys, values = new_kv[row:row + 1, own_keys].transpose(1, 3).unbind(2)
                own_queries = part.attention.own_columns(num_keys, part.length)
            else:
                keys, values = part.context[layer][place:place + 1, :, :, own_keys].unbind(1)
                own_queries = slice(0, part.row_queries[row]) if part.row_queries else slice(None)
            mask = part.mask[place:place + 1, :, own_queries if part.mask.shape[2] > 1 else slice(None), own_keys]
            out[row, own_queries] = attend(q[row:row + 1, own_queries], keys, values, mask)
        return out.view(part.rows * part.length, -1)


class Layer(nn.Module):
    def __init__(self, config: TransformerConfig, index: int):
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config)
        self.post_attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        moe = config.moe
        if moe is None or index < moe.first_k_dense_replace:
            self.mlp = MLP(config.hidden_size, config.intermediate_size, config.shard)
        else:  # the shared expert's partial sum joins the routed experts' before the one sum over the ranks
            shared = moe.moe_intermediate_size * moe.num_shared_experts
            self.mlp = MoE(config.hidden_size, moe, MLP(config.hidden_size, shared, config.shard, reduce_results=False)
                           if shared else None, config.shard)

    def forward(self, x: torch.Tensor, plan: StepPlan, layer: int) -> torch.Tensor:
        x = x + self.attention(self.input_norm(x), plan, layer)
        spans = plan.token_spans if self.attention.batch_invariant else None
        if isinstance(self.mlp, MoE):  # per row in batch-invariant mode, routing included
            return x + self.mlp(self.post_attention_norm(x), spans, plan.routing_blocks)
        return x + each_row(self.mlp, self.post_attention_norm(x), spans)


class BidirectionalTransformer(nn.Module):
    """Token ids in, final hidden states out; :meth:`logits` maps chosen hidden states to the vocab.

    Callers gather the hidden states they need *before* asking for logits, so a ``[rows, width,
    vocab]`` tensor is never built.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = vocab.embedding(config.vocab_size, config.hidden_size, config.shard)
        self.layers = nn.ModuleList(Layer(config, index) for index in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = vocab.head(config.hidden_size, config.vocab_size, config.shard)
        self.tie_weights()
        self.options = ModelOptions()
        self.compiled = None  # a CompiledForward when options.compile

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward_full(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                     key_mask: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
        """Every column of every row, no cache: hidden states ``[rows, width, hidden]`` (block-causal
        attention over blocks of ``block_size`` positions when given)."""
        columns = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        part = RefreshPart(input_ids, position_ids, key_mask, columns, block_size=block_size)
        return self.forward_step(part, None, None)

    def forward_step(self, refresh: RefreshPart | None, window: WindowPart | None,
                     kv_cache: KVCache | None) -> torch.Tensor:
        """One packed forward of a refresh part and/or a window part (compiled when ``options.compile``).

        Returns the hidden states the parts ask for, refresh rows first: ``[rows, n, hidden]``.
        """
        if self.compiled is not None:
            return self.compiled.forward_step(refresh, window, kv_cache)
        return self.forward_step_eager(refresh, window, kv_cache)

    def apply_options(self, options: ModelOptions) -> None:
        """Run forwards as ``options`` say: through compiled, shape-bucketed layers
        (``engine.models.compiled``) or eagerly, and with each row's attention computed alone over its
        own keys (:meth:`Attention._attend_each_row`) or not. The loader applies them once, before any
        engine runs the model: every engine that shares this model object runs it the same way. An eager
        model never imports the compiler (torch._dynamo takes over a second of a process's start)."""
        self.options = options
        self.compiled = None
        if options.compile:
            from engine.models.compiled import CompiledForward

            self.compiled = CompiledForward(self)
        for layer in self.layers:
            layer.attention.batch_invariant = options.batch_invariant

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        return x * self.config.embedding_scale if self.config.embedding_scale != 1.0 else x

    def forward_step_eager(self, refresh: RefreshPart | None, window: WindowPart | None,
                           kv_cache: KVCache | None) -> torch.Tensor:
        config = self.config
        plan = plan_step(refresh, window, kv_cache, rotary_dtype(self.dtype, config.rope_full_precision),
                         self.dtype, config.rotary_dim, config.rope_theta, config.routing_block)
        parts = [p for p in (refresh, window) if p is not None]
        x = self.embed(packed_tokens(plan.parts, [p.tokens for p in parts]))
        for index, layer in enumerate(self.layers):
            x = layer(x, plan, index)
        read = [self._read(part, plan_part.to_box(x[plan_part.offset:plan_part.offset + plan_part.num_tokens])
                           .view(plan_part.rows, plan_part.length, -1))
                for part, plan_part in zip(parts, plan.parts)]
        return torch.cat(read) if len(read) > 1 else read[0]

    @staticmethod
    def _read(part: RefreshPart | WindowPart, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden states a part asks for, ``[rows, n, hidden]``."""
        if isinstance(part, RefreshPart):
            return hidden.gather(1, part.read_columns[..., None].expand(-1, -1, hidden.shape[-1]))
        if part.read_columns is not None:
            return hidden.gather(1, part.read_columns[..., None].expand(-1, -1, hidden.shape[-1]))
        if part.read_shift:
            positions = (torch.arange(part.num_read, device=hidden.device) - part.read_shift).clamp(min=0)
            return hidden[:, positions]
        return hidden[:, :part.num_read]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter and persistent buffer under its checkpoint-level names, as views of our
        tensors: what a loader copies into (``engine.layers.loading.checkpoint_slots``). A fused projection
        appears as its parts (q/k/v, gate/up) and q/k/v also whole (LLaDA2's ``query_key_value``); stacked
        experts appear one expert at a time (``mlp.experts.{e}.{gate,up,down}_proj.weight``)."""
        return {name: slot.tensor for name, slot in checkpoint_slots(self).items()}

    def experts_touched(self) -> torch.Tensor | None:
        """Per MoE layer, the distinct experts its last forward routed a token to (``[moe layers]``, on
        the device: reading it is the caller's host sync); None for a dense model."""
        counts = [layer.mlp.experts_touched for layer in self.layers if isinstance(layer.mlp, MoE)]
        return torch.stack(counts) if counts else None

    def logits(self, hidden: torch.Tensor, at: tuple[torch.Tensor, torch.Tensor] | None = None,
               row_spans: tuple[tuple[int, int], ...] | None = None, local: bool = False) -> torch.Tensor:
        """Logits of hidden states ``[rows, n, hidden]``, or with ``at`` = (rows, columns) ``[positions]``
        of those positions only, ``[positions, vocab]``. Batch-invariant mode runs each row on its own
        (``row_spans``: (first position, count) of each row's positions). ``local``: a split model's own
        vocabulary columns only (``lm_head.first`` on), not joined over the ranks."""
        if at is not None:
            hidden = hidden[at]
        head = self._local_head if local else self._head
        if self.layers[0].attention.batch_invariant:
            if hidden.dim() == 3 and hidden.shape[0] > 1:
                return torch.cat([self.logits(row, local=local) for row in hidden.split(1)])
            if row_spans is not None and len(row_spans) > 1:
                return each_row(head, hidden, row_spans)
        return head(hidden)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(hidden))
        return logits * self.config.logit_scale if self.config.logit_scale != 1.0 else logits

    def _local_head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head.local(self.norm(hidden))
        return logits * self.config.logit_scale if self.config.logit_scale != 1.0 else logits
