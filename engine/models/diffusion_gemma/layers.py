"""DiffusionGemma's layer pieces, named as its checkpoint names them (``model.decoder.layers.N.*``).

Each computes what transformers' ``modeling_diffusion_gemma`` computes, in the same order of operations,
so float32 logits agree to rounding: Gemma's RMSNorm (``x * (mean(x^2) + eps)^-0.5`` in float32, then
the weight), the dense gated MLP (tanh GELU), the router (its own unscaled norm, a learned scale,
softmax in float32, top-k renormalised, a per-expert scale), the experts summed in expert order, and the
self-conditioning block that mixes the previous step's soft predictions into the canvas embeddings.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.experts import expert_slots
from engine.layers.fp8_modules import expert_scales
from engine.layers.linear import ColumnParallelLinear, RankSum, RowParallelLinear
from engine.layers.loading import WeightSlot
from engine.models.diffusion_gemma.config import GemmaTextConfig, LayerShape
from engine.models.moe import gelu_tanh, grouped_experts, sort_by_expert
from engine.parallel.shard import WHOLE, TensorShard


class GemmaRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        widened = x.float()
        normed = widened * torch.pow(widened.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            normed = normed * self.weight.float()
        return normed.type_as(x)


class GatedMLP(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))``; split over ranks, ``down`` sums its output over them."""

    def __init__(self, hidden_size: int, intermediate_size: int, shard: TensorShard = WHOLE):
        super().__init__()
        self.gate_proj = ColumnParallelLinear(hidden_size, intermediate_size, shard=shard)
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, shard=shard)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, config: GemmaTextConfig):
        super().__init__()
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, with_scale=False)
        self.proj = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(config.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(config.num_experts))
        self.root_size = config.hidden_size ** -0.5
        self.top_k = config.experts_per_token

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [tokens, k], experts [tokens, k])`` of tokens ``x [tokens, hidden]``."""
        scores = self.proj(self.norm(x) * self.scale * self.root_size)
        probabilities = F.softmax(scores, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probabilities, k=self.top_k, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[experts], experts


class Experts(nn.Module):
    """Each token's experts' gated MLPs, weighted and summed in expert order, with no host read and shapes
    fixed by ``x``'s, so a compiled step can hold it: the (token, slot) pairs sorted by expert go through
    one grouped GEMM per projection (:func:`engine.models.moe.grouped_experts`, whose loop over the experts
    reads the counts once where ``_grouped_mm`` does not take the dtype or device: float64, CUDA float32),
    each pair's output is weighted and cast to ``x``'s dtype, and each token adds its pairs into zeros in
    ascending expert order, as ``index_add_`` over the experts hit does on CPU.
    Eager runs this path too: it equals that loop bit for bit and costs less on CPU."""

    def __init__(self, config: GemmaTextConfig):
        super().__init__()
        size, hidden = config.moe_intermediate_size, config.hidden_size
        self.gate_up_proj = nn.Parameter(torch.empty(config.num_experts, 2 * size, hidden))
        self.down_proj = nn.Parameter(torch.empty(config.num_experts, hidden, size))
        self.rank_sum = RankSum(config.shard)  # split: each expert's part of its width gives a partial sum

    def weight_slots(self, name: str) -> dict[str, WeightSlot]:
        """The stacks under their own names and each expert's projections as views (``engine.layers.experts``)."""
        return expert_slots(self, f"{name}.", self.rank_sum.shard, stacked=True)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """``x [tokens, hidden]``, ``weights`` and ``experts [tokens, k]`` -> ``[tokens, hidden]``."""
        tokens, k = experts.shape
        order, counts = sort_by_expert(experts, self.gate_up_proj.shape[0])
        routed = grouped_experts(x[order // k], self.gate_up_proj, self.down_proj, counts, "gelu_tanh",
                                 expert_scales(self))
        parts = (routed * weights.flatten()[order, None]).to(x.dtype)
        # each pair's sorted position; a token's positions, ascending, are its slots in expert order
        position = torch.empty_like(order).index_copy_(0, order, torch.arange(order.numel(), device=x.device))
        rows = position.view(tokens, k).sort(dim=1).values
        wide = torch.promote_types(x.dtype, torch.float32)
        if wide == x.dtype:
            out = torch.zeros_like(x)
            for slot in range(k):
                out += parts[rows[:, slot]]
            return self.rank_sum(out)
        # below float32, index_add_ sums the repeats of an index in float32 and rounds once: slots that
        # repeat an expert (the router's top-k never gives them) are summed so, rounded at each new expert
        pair_experts = experts.flatten()[order][rows]
        repeats = pair_experts[:, 1:] == pair_experts[:, :-1]
        total = torch.zeros(x.shape, dtype=wide, device=x.device)
        for slot in range(k):
            if slot:
                total = torch.where(repeats[:, slot - 1, None], total, total.to(x.dtype).to(wide))
            total += parts[rows[:, slot]]
        return self.rank_sum(total.to(x.dtype))


class SelfAttentionProjections(nn.Module):
    """q/k/v projections and norms of one layer (global layers have no ``v_proj``)."""

    def __init__(self, config: GemmaTextConfig, shape: LayerShape):
        super().__init__()
        hidden, heads = config.hidden_size, config.num_heads
        self.shape = shape
        self.q_proj = ColumnParallelLinear(hidden, heads * shape.head_dim, shard=config.shard)
        self.k_proj = ColumnParallelLinear(hidden, shape.num_kv_heads * shape.head_dim, shard=config.shard)
        self.v_proj = None if shape.values_from_keys else ColumnParallelLinear(
            hidden, shape.num_kv_heads * shape.head_dim, shard=config.shard)
        self.o_proj = RowParallelLinear(heads * shape.head_dim, hidden, config.shard)
        self.q_norm = GemmaRMSNorm(shape.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(shape.head_dim, config.rms_norm_eps)
        self.v_norm = GemmaRMSNorm(shape.head_dim, config.rms_norm_eps, with_scale=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries ``[tokens, heads, d]``, rotated keys and values ``[tokens, kv_heads, d]``."""
        d = self.shape.head_dim
        q = rotate(self.q_norm(self.q_proj(x).view(x.shape[0], -1, d)), cos, sin)
        raw_keys = self.k_proj(x).view(x.shape[0], -1, d)
        raw_values = raw_keys if self.v_proj is None else self.v_proj(x).view(x.shape[0], -1, d)
        return q, rotate(self.k_norm(raw_keys), cos, sin), self.v_norm(raw_values)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the whole head (``cos``/``sin`` ``[tokens, 1, d]``), as transformers does."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class SelfConditioning(nn.Module):
    """The previous step's soft predictions, through a gated MLP, added to the canvas embeddings."""

    def __init__(self, config: GemmaTextConfig):
        super().__init__()
        hidden = config.hidden_size
        self.pre_norm = GemmaRMSNorm(hidden, config.rms_norm_eps)
        self.post_norm = GemmaRMSNorm(hidden, config.rms_norm_eps, with_scale=False)
        self.gate_proj = ColumnParallelLinear(hidden, config.intermediate_size, shard=config.shard)
        self.up_proj = ColumnParallelLinear(hidden, config.intermediate_size, shard=config.shard)
        self.down_proj = RowParallelLinear(config.intermediate_size, hidden, config.shard)

    def forward(self, embeddings: torch.Tensor, soft_embeddings: torch.Tensor) -> torch.Tensor:
        normed = self.pre_norm(soft_embeddings)
        signal = self.down_proj(gelu_tanh(self.gate_proj(normed)) * self.up_proj(normed))
        return self.post_norm(embeddings + signal)
