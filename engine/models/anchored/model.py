"""An anchored-block model: one Ministral-3 stack that stores context causally and denoises blocks
bidirectionally, both as spans of one forward (``engine.models.anchored.spans``), and one untied head.

Each layer: RMSNorm, grouped-query attention with rotate-half RoPE at YaRN's frequencies (cos and sin
times its attention factor) and Llama-4's per-position query scale after the rotation, a residual; RMSNorm,
SwiGLU, a residual. Keys and values are cached per slot and column, column = position.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers import vocab
from engine.layers.linear import ColumnParallelLinear, RowParallelLinear
from engine.layers.loading import checkpoint_slots
from engine.models.anchored.config import AnchoredConfig
from engine.models.anchored.spans import SpanPlan, SpanStep, plan_spans, split_by_row
from engine.models.kv_cache import KVCache, PagePool
from engine.models.layers import RMSNorm, attend, rotate_
from engine.models.options import ModelOptions

Groups = tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], ...]  # per group of rows: packed
# token indices, their box indices, the rows' slots, the mask [rows, 1, span, width] (engine.models.anchored.spans)
COMPILED_GRAPHS = 8  # graphs dynamo keeps per thread: span groups (one or two) x the step kinds a run meets


class Attention(nn.Module):
    def __init__(self, config: AnchoredConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = ColumnParallelLinear(config.hidden_size, self.heads * self.head_dim, shard=config.shard)
        self.k_proj = ColumnParallelLinear(config.hidden_size, self.kv_heads * self.head_dim, shard=config.shard)
        self.v_proj = ColumnParallelLinear(config.hidden_size, self.kv_heads * self.head_dim, shard=config.shard)
        self.o_proj = RowParallelLinear(self.heads * self.head_dim, config.hidden_size, config.shard)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, write_slots: torch.Tensor, groups: Groups,
                cos: torch.Tensor, signed_sin: torch.Tensor, query_scale: torch.Tensor | None,
                cache: torch.Tensor) -> torch.Tensor:
        """``cache``: this layer's keys and values, ``[slots, 2, kv_heads, columns, head_dim]``."""
        tokens = x.shape[0]
        keys, values = cache[:, 0], cache[:, 1]
        q = rotate_(self.q_proj(x).view(tokens, self.heads, self.head_dim), cos, signed_sin)
        k = rotate_(self.k_proj(x).view(tokens, self.kv_heads, self.head_dim), cos, signed_sin)
        v = self.v_proj(x).view(tokens, self.kv_heads, self.head_dim)
        if query_scale is not None:
            q = q * query_scale
        keys[write_slots, :, positions] = k
        values[write_slots, :, positions] = v
        out = torch.empty((tokens, self.heads * self.head_dim), dtype=x.dtype, device=x.device)
        for packed, box, slots, mask in groups:
            out[packed] = self._attend_group(q, keys, values, packed, box, slots, mask)
        return self.o_proj(out)

    def _attend_group(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, packed: torch.Tensor,
                      box: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One group's queries scattered into its box ``[rows, span, ...]`` (sizes from its mask, so a compiled
        graph traces them), attended over the first ``width`` columns of its slots, gathered back."""
        rows, _, span, width = mask.shape
        boxed = q.new_zeros((rows * span, self.heads, self.head_dim))
        boxed[box] = q[packed]
        boxed = boxed.view(rows, span, self.heads, self.head_dim)
        return attend(boxed, keys[slots, :, :width], values[slots, :, :width], mask)[box]


class Layer(nn.Module):
    def __init__(self, config: AnchoredConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = nn.ModuleDict({name: ColumnParallelLinear(*shape, shard=config.shard) for name, shape in (
            ("gate_proj", (config.hidden_size, config.intermediate_size)),
            ("up_proj", (config.hidden_size, config.intermediate_size)))})
        self.mlp["down_proj"] = RowParallelLinear(config.intermediate_size, config.hidden_size, config.shard)

    def forward(self, x, positions, write_slots, groups, cos, signed_sin, query_scale, cache):
        attended = self.self_attn(self.input_layernorm(x), positions, write_slots, groups, cos, signed_sin, query_scale,
                                  cache)
        x = x + attended
        h = self.post_attention_layernorm(x)
        return x + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](h)) * self.mlp["up_proj"](h))


def run_layers(model: AnchoredTransformer, x: torch.Tensor, positions: torch.Tensor, write_slots: torch.Tensor,
               groups: Groups, cos: torch.Tensor, signed_sin: torch.Tensor, query_scale: torch.Tensor | None,
               cache: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Every layer over the packed tokens ``x``; ``cache``: every layer's keys and values, ``KVCache.data`` (one
    input to a compiled graph) or ``KVCache.layers`` (views made once, so an eager step indexes no layer)."""
    for index, layer in enumerate(model.layers):
        x = layer(x, positions, write_slots, groups, cos, signed_sin, query_scale, cache[index])
    return x


class CompiledLayers:
    """:func:`run_layers` through ``torch.compile`` with dynamic shapes, and the graphs a run has asked for:
    one per number of span groups (the actor's stats report them as any compiled model's)."""

    def __init__(self):
        self.function = torch.compile(run_layers, dynamic=True)
        self.group_counts: set[int] = set()
        self.compile_failures: dict[str, int] = {}  # a failed compile raises: none is ever recorded

    @property
    def num_graphs(self) -> int:
        return len(self.group_counts)

    def __call__(self, model: AnchoredTransformer, x: torch.Tensor, positions: torch.Tensor, write_slots: torch.Tensor,
                 groups: Groups, *rest: torch.Tensor | None) -> torch.Tensor:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILED_GRAPHS)
        self.group_counts.add(len(groups))
        return self.function(model, x, positions, write_slots, groups, *rest)


class AnchoredTransformer(nn.Module):
    def __init__(self, config: AnchoredConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = vocab.embedding(config.vocab_size, config.hidden_size, config.shard)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = vocab.head(config.hidden_size, config.vocab_size, config.shard)
        self.options = ModelOptions()
        self.compiled: CompiledLayers | None = None
        self._rope: tuple[torch.Tensor, float] | None = None  # computed on first use (the loader builds on meta)

    # -- what the loader and the engine ask of any model --------------------------------------------
    def tie_weights(self) -> None:
        pass  # the head is untied

    def apply_options(self, options: ModelOptions) -> None:
        """Batch-invariant mode runs each row's span alone. Compiled, the layers run as one graph whose sizes
        (tokens, rows, spans, columns) are symbols, so a run compiles a graph per number of span groups."""
        if options.compile and options.batch_invariant:
            raise ValueError("compile=True cannot be combined with batch_invariant=True")
        self.options = options
        self.compiled = CompiledLayers() if options.compile else None

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter under its checkpoint-level name (``engine.layers.loading.checkpoint_slots``)."""
        return {name: slot.tensor for name, slot in checkpoint_slots(self).items()}

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    # -- the forward -------------------------------------------------------------------------------
    def run_spans(self, step: SpanStep, cache: KVCache, pool: PagePool | None) -> torch.Tensor:
        """The runner's entry point: :meth:`span_logits`. ``pool`` is None: the prefix cache copies a
        stored prompt's pages from its slot after the step (``PrefixCache.fill``)."""
        return self.span_logits(step, cache)

    def span_logits(self, step: SpanStep, cache: KVCache) -> torch.Tensor:
        """Run every row's span, writing its keys and values; float32 logits at ``step.logit_index``,
        ``[positions, vocab]``. Batch-invariant mode runs each row alone, its head too."""
        if self.options.batch_invariant and step.num_rows > 1:
            return torch.cat([self.span_logits(row, cache) for row in split_by_row(step)])
        return self.head(self.span_hidden(step, cache)).float()

    def span_hidden(self, step: SpanStep, cache: KVCache) -> torch.Tensor:
        """Run every row's span, writing its keys and values; the final normed hidden states at
        ``step.logit_index``, ``[positions, hidden]``."""
        plan = plan_spans(step, step.tokens.device)
        (cos, signed_sin), query_scale = self.rotary(plan)
        groups = tuple((group.packed, group.box, group.slots, group.mask) for group in plan.groups)
        layers = self.compiled or run_layers
        x = layers(self, self.embed_tokens(step.tokens), plan.positions, plan.write_slots, groups, cos,
                   signed_sin, query_scale, cache.data if self.compiled else cache.layers)
        return self.norm(x[step.logit_index])

    def rotary(self, plan: SpanPlan) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """``cos`` and ``signed_sin`` ``[tokens, 1, head_dim]`` at the spans' positions, as transformers builds
        them (float32 angles, times the rope's attention factor, cast to the model's dtype), and the query
        scale ``[tokens, 1, 1]`` (None where it is 1.0 for every position of the step)."""
        if self._rope is None:
            inverse, factor = self.config.inverse_frequencies()
            self._rope = (inverse.to(plan.positions.device), factor)
        inverse, factor = self._rope
        angles = plan.positions[:, None].float() * inverse
        cos, sin = angles.cos() * factor, angles.sin() * factor
        tables = (torch.cat([cos, cos], -1)[:, None].to(self.dtype), torch.cat([-sin, sin], -1)[:, None].to(self.dtype))
        beta, span = self.config.query_scale_beta, self.config.query_scale_span
        if beta is None or plan.max_position < span:
            return tables, None
        scale = 1 + beta * torch.log(1 + torch.floor(plan.positions.float() / span))
        return tables, scale[:, None, None].to(self.dtype)
