"""The sparse mixture-of-experts MLP of LLaDA2 (``LLaDA2MoeSparseMoeBlock``), computed grouped.

Routing, as the checkpoint's own modeling code (``LLaDA2MoeGate``) does it, all in float32:
``scores = sigmoid(h @ W^T)``; the expert bias is added for the *choice* only; experts form ``n_group``
groups of consecutive experts, a group scores the sum of its two best biased scores, a token keeps its
``topk_group`` best groups and takes its ``experts_per_token`` best biased experts among them (slot
order: descending biased score). Its weights are the *unbiased* scores of those experts, renormalised
to sum 1 (when more than one expert: the reference ignores ``norm_topk_prob``) and multiplied by
``routed_scaling_factor``.

Block routing (LLaDA2.2: the checkpoint names ``expert_capacity``) replaces the groups: over each routing
block (one request's tokens of one absolute block of ``routing_block`` positions, :func:`routing_blocks`),
``s = sigmoid(logits) + expert_bias``; the block keeps the ``expert_capacity`` experts of largest
max-over-its-tokens ``s``, and each token takes its ``experts_per_token`` best by ``s`` among them, exact
ties to the lower expert id, as SGLang's released kernels (``_block_aggregation_kernel``,
``_token_topk_kernel``) choose; the weights are as above. A token's experts depend on the other tokens of
its block, never on another request's. The combine casts each slot's expert output to float32, weights it, sums the
slots in slot order and casts back, as the reference's ``moe_infer``; the shared expert is added after.

Experts are stacked (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``) and computed grouped: the
(token, slot) pairs are sorted by expert (stable), counted, and each expert's rows go through one
``torch._grouped_mm`` over every expert at once, with no host sync. Where ``_grouped_mm`` does not take
the dtype or device (float64), a loop over the experts (never over tokens) reads the counts once. A
compiled graph traces ``_grouped_mm`` in bfloat16; in other dtypes it calls the same code as one opaque
custom operation (``blockserve::grouped_glu``), except on CUDA without ``_grouped_mm``, where that
shape runs eagerly. DiffusionGemma's experts use the same helpers with a tanh-GELU gate.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.experts import expert_slots
from engine.layers.fp8 import ExpertScales, fp8_grouped_glu
from engine.layers.fp8_modules import expert_scales
from engine.layers.linear import RankSum
from engine.layers.loading import WeightSlot
from engine.models.config import MoEConfig
from engine.parallel.shard import WHOLE, TensorShard

GROUPED_MM_DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float16), "cuda": (torch.bfloat16,)}


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# the gate's activation of a gated expert MLP, ``activation(gate) * up``, by the name the custom op takes
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": gelu_tanh}


def grouped_mm_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``torch._grouped_mm`` computes in ``dtype`` on ``device`` eagerly (else the per-expert loop)."""
    return hasattr(torch, "_grouped_mm") and dtype in GROUPED_MM_DTYPES.get(device.type, ())


def grouped_glu_eager(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor,
                      activation: str = "silu") -> torch.Tensor:
    """Every expert's gated MLP (SwiGLU for ``"silu"``) over its rows of ``x`` (sorted by expert,
    ``counts [E]`` each): one ``_grouped_mm`` per projection, or where it does not take the dtype or
    device, :func:`expert_loop`, a loop over the experts (never over tokens) that reads the counts on the
    host once."""
    if not grouped_mm_supported(x.dtype, x.device):
        return expert_loop(x, gate_up, down, counts, activation)
    ends = counts.cumsum(0).to(torch.int32)
    gate, up_part = torch._grouped_mm(x, gate_up.transpose(-1, -2), offs=ends).chunk(2, dim=-1)
    return torch._grouped_mm(ACTIVATIONS[activation](gate) * up_part, down.transpose(-1, -2), offs=ends)


def expert_loop(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor,
                activation: str = "silu") -> torch.Tensor:
    """:func:`grouped_glu_eager` one expert at a time."""
    outputs = []
    for expert, rows in enumerate(x.split(counts.tolist())):
        if rows.shape[0]:
            gate, up_part = F.linear(rows, gate_up[expert]).chunk(2, dim=-1)
            outputs.append(F.linear(ACTIVATIONS[activation](gate) * up_part, down[expert]))
    return torch.cat(outputs) if outputs else x.new_zeros(0, down.shape[1])


def _grouped_glu_contiguous(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor,
                            activation: str) -> torch.Tensor:
    return grouped_glu_eager(x, gate_up, down, counts, activation).contiguous()


# ``grouped_glu``: :func:`grouped_glu_eager` as one opaque operation of a compiled graph. Dynamo traces
# ``_grouped_mm`` in bfloat16 only and cannot trace the loop's host read, so other dtypes call this.
# Its output is contiguous, as the shape function promises (``_grouped_mm`` may pad row strides).
# Defined on a library fragment, not with ``torch.library.custom_op``: that one's Python wrapper costs
# ~75 us a call on this CPU, ~15 us here, and a compiled MoE layer calls it once a step.
_LIBRARY = torch.library.Library("blockserve", "FRAGMENT")
_LIBRARY.define("grouped_glu(Tensor x, Tensor gate_up, Tensor down, Tensor counts, str activation) -> Tensor")
_LIBRARY.impl("grouped_glu", _grouped_glu_contiguous, "CompositeExplicitAutograd")


@torch.library.register_fake("blockserve::grouped_glu")
def _grouped_glu_shape(x, gate_up, down, counts, activation):
    return x.new_empty(x.shape[0], down.shape[1])


grouped_glu = torch.ops.blockserve.grouped_glu


def grouped_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor,
                    activation: str = "silu", scales: ExpertScales | None = None) -> torch.Tensor:
    """``x [pairs, H]`` sorted by expert, ``counts [E]`` of each expert's rows -> ``[pairs, H]``: each
    row through its expert's gated MLP (``gate_up [E, 2I, H]``, ``down [E, H, I]``), eagerly or in a
    compiled graph. ``scales``: FP8 weights' per-channel scales (``engine.layers.fp8``)."""
    if scales is not None:
        return fp8_grouped_glu(x, gate_up, down, counts, ACTIVATIONS[activation], scales)
    if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:
        if x.device.type != "cpu" and not grouped_mm_supported(x.dtype, x.device):
            # the loop's host read would break a captured CUDA graph: a full-graph compile refuses
            # this shape, which then runs eagerly with a warning naming the cause
            torch._dynamo.graph_break()
        return grouped_glu(x, gate_up, down, counts, activation)
    return grouped_glu_eager(x, gate_up, down, counts, activation)


def sort_by_expert(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``order`` of the flattened (token, slot) pairs of ``experts [tokens, k]`` sorted by expert (stable:
    a token's pairs stay in slot order within an expert) and ``counts [num_experts]``, without a host sync
    and with a fixed length (bincount's length depends on the data)."""
    flat = experts.flatten()
    return flat.argsort(stable=True), flat.new_zeros(num_experts).index_add_(0, flat, torch.ones_like(flat))


class Router(nn.Module):
    """The gate: ``weight [E, H]`` and the persistent ``expert_bias [E]`` buffer, both kept float32
    whatever dtype the model is cast to (the reference computes routing in float32; SGLang keeps the
    bias float32 too), so routing does not change with the model's dtype."""

    def __init__(self, hidden_size: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=torch.float32))
        if not self.weight.is_meta:  # a model built with random weights; on the meta device the loader fills it
            # (a meta fill would import torch._dynamo, over a second of a process's start)
            nn.init.normal_(self.weight, std=hidden_size ** -0.5)
        self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        def keep_dtype(tensor):  # move with the model, but never change dtype
            moved = fn(tensor)
            return tensor.to(device=moved.device) if moved.dtype != tensor.dtype else moved
        return super()._apply(keep_dtype, recurse)

    def forward(self, x: torch.Tensor, moe: MoEConfig,
                blocks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Experts ``[tokens, k]`` (int64, slot order) and their float32 weights ``[tokens, k]``; block
        routing reads each token's routing block (``blocks``, :func:`routing_blocks`)."""
        if moe.expert_capacity is not None:
            if blocks is None:
                raise ValueError("block routing (expert_capacity) needs each token's routing block")
            return self._route_blocks(x, moe, blocks)
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        biased = (scores + self.expert_bias.float()).view(x.shape[0], moe.n_group, -1)
        group_scores = biased.topk(2, dim=-1).values.sum(dim=-1)
        groups = group_scores.topk(moe.topk_group, dim=-1, sorted=False).indices
        kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        experts = biased.masked_fill(~kept[..., None], float("-inf")).flatten(1).topk(
            moe.experts_per_token, dim=-1).indices
        weights = scores.gather(1, experts)
        if moe.experts_per_token > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return experts, weights * moe.routed_scaling_factor

    def _route_blocks(self, x: torch.Tensor, moe: MoEConfig, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block routing: ``blocks [tokens]`` numbers each token's routing block from 0, in runs."""
        scores = 1.0 / (1.0 + torch.exp(-F.linear(x.float(), self.weight.float())))  # the kernels' sigmoid
        biased = scores + self.expert_bias.float()
        per_block = biased.new_full(biased.shape, float("-inf")).scatter_reduce_(
            0, blocks[:, None].expand_as(biased), biased, "amax")
        kept = _best(per_block, moe.expert_capacity)
        allowed = torch.zeros_like(per_block, dtype=torch.bool).scatter_(1, kept, True)[blocks]
        experts = _best(biased.masked_fill(~allowed, float("-inf")), moe.experts_per_token)
        weights = scores.gather(1, experts)
        if moe.experts_per_token > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return experts, weights * moe.routed_scaling_factor


def _best(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's ``k`` largest columns, best first, an exact tie to the lower column."""
    return scores.sort(dim=-1, descending=True, stable=True).indices[:, :k]


def routing_blocks(positions: torch.Tensor, block: int) -> torch.Tensor:
    """``[tokens]`` each packed token's routing block, numbered from 0: a new one starts where the absolute
    block (``position // block``) changes or the position does not grow.

    A step packs each row's tokens in increasing positions from a block start, so a row's blocks never join
    another row's; padding (position 0 after a later position) is a block of its own::

        positions  64 65 .. 95 | 0 1 .. 31 32 .. 40 | 0 | 0
        blocks      0  0 ..  0 | 1 1 ..  1  2 ..  2 | 3 | 4
    """
    absolute = torch.div(positions, block, rounding_mode="floor")
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = (absolute[1:] != absolute[:-1]) | (positions[1:] <= positions[:-1])
    return starts.long().cumsum(0) - 1


class StackedExperts(nn.Module):
    """Every routed expert's SwiGLU in two stacked parameters; checkpoints name each expert's
    projections separately (``{e}.gate_proj``, ``{e}.up_proj``, ``{e}.down_proj``), offered as views
    (``engine.layers.experts``, FP8 scales included). ``intermediate_size``: rank ``shard``'s part."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, shard: TensorShard = WHOLE):
        super().__init__()
        self.intermediate_size, self.shard = intermediate_size, shard
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        # random weights for a model built without a checkpoint: left empty they held whatever memory held,
        # NaNs and denormals included. The loader builds on the meta device and fills them itself.
        if not self.gate_up_proj.is_meta:
            nn.init.normal_(self.gate_up_proj, std=hidden_size ** -0.5)
            nn.init.normal_(self.down_proj, std=intermediate_size ** -0.5)

    def weight_slots(self, name: str) -> dict[str, WeightSlot]:
        return expert_slots(self, f"{name}." if name else "", self.shard, stacked=False)

    def checkpoint_views(self, prefix: str) -> dict[str, torch.Tensor]:
        """Each expert's projections as views of the stacks, named after ``prefix``."""
        return {name: slot.tensor for name, slot in expert_slots(self, prefix, self.shard, stacked=False).items()}

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x [pairs, H]`` sorted by expert, ``counts [E]`` of each expert's rows -> ``[pairs, H]``."""
        return grouped_experts(x, self.gate_up_proj, self.down_proj, counts, scales=expert_scales(self))


class MoE(nn.Module):
    """Router + stacked experts + the optional shared expert (a dense MLP given by the caller). Split over ranks,
    each expert holds its rank's intermediate width: the routed and shared outputs are partial sums, added over
    the ranks once (:class:`~engine.layers.linear.RankSum`).

    ``experts_touched`` (a 0-d int64 buffer, written by every forward without a host sync) counts the
    distinct experts the last forward routed any token to: the expert weights it read.
    """

    def __init__(self, hidden_size: int, moe: MoEConfig, shared_experts: nn.Module | None,
                 shard: TensorShard = WHOLE):
        super().__init__()
        self.rank_sum = RankSum(shard)
        self.config = moe
        self.gate = Router(hidden_size, moe.num_experts)
        self.experts = StackedExperts(moe.num_experts, hidden_size, moe.moe_intermediate_size, shard)
        self.shared_experts = shared_experts
        self.register_buffer("experts_touched", torch.zeros((), dtype=torch.int64), persistent=False)

    def forward(self, x: torch.Tensor, spans: tuple[tuple[int, int], ...] | None = None,
                blocks: torch.Tensor | None = None) -> torch.Tensor:
        """``x [tokens, H]``, ``blocks [tokens]`` their routing blocks (:func:`routing_blocks`; block
        routing only). With ``spans`` (batch-invariant mode) each row's ``(first token, count)`` runs
        alone, so an expert's GEMM sees the row's own tokens only; tokens outside every span get zeros."""
        if spans is None:
            out, counts = self._forward(x, blocks)
        else:
            out, counts = x.new_zeros(x.shape), None
            for start, count in spans:
                row_blocks = None if blocks is None else blocks[start:start + count] - blocks[start]
                out[start:start + count], row_counts = self._forward(x[start:start + count], row_blocks)
                counts = row_counts if counts is None else counts + row_counts
        if counts is not None:
            self.experts_touched.copy_(counts.gt(0).sum())
        return self.rank_sum(out)

    def _forward(self, x: torch.Tensor, blocks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        experts, weights = self.gate(x, self.config, blocks)
        order, counts = sort_by_expert(experts, self.config.num_experts)
        routed = self.experts(x[order // experts.shape[1]], counts)
        unsorted = torch.empty_like(routed).index_copy_(0, order, routed)
        out = (unsorted.view(*experts.shape, -1).to(weights.dtype).mul_(weights.unsqueeze(-1))
               .sum(dim=1).to(x.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out, counts
