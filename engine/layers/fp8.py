"""FP8 kernels: e4m3 weights with one float32 scale per output channel, activations quantized per token.

``y = (q_x * s_x) @ (q_w * s_w)^T``: ``q_x`` is each token's row rounded to e4m3 after dividing by
``s_x = max|row| / 448``, ``q_w`` the stored weight and ``s_w`` its per-channel scale. On a GPU with FP8 tensor
cores ``torch._scaled_mm`` computes it with row-wise scales; elsewhere the operands are dequantized and
multiplied, so on the CPU the result is that float math exactly (float32, or float64 in a float64 model).
A row-parallel layer's input is split over the ranks: its ``max|row|`` is taken over every rank's part (one
small all-reduce), so a split model rounds each token as the whole model does.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.parallel.shard import WHOLE, TensorShard, all_reduce_max

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
SMALLEST_SCALE = torch.finfo(torch.float32).eps  # an all-zero row's scale, as compressed-tensors sets it
SCALED_MM_ALIGNMENT = 16  # _scaled_mm wants both GEMM dimensions multiples of this


@dataclass(frozen=True)
class ExpertScales:
    """An FP8 expert stack's per-channel scales (``[E, out, 1]``) and the ranks its ``down`` input is split over."""

    gate_up: torch.Tensor
    down: torch.Tensor
    input_shard: TensorShard = WHOLE


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the dequantized math runs in: float32, or wider when the model is (float64)."""
    return torch.promote_types(dtype, torch.float32)


def quantize_rows(x: torch.Tensor, input_shard: TensorShard = WHOLE) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., k]`` -> its e4m3 codes and one float32 scale per row ``[..., 1]`` (dynamic, symmetric); a row
    split over ``input_shard``'s ranks takes its maximum over all of them."""
    wide = x.to(compute_dtype(x.dtype))
    amax = all_reduce_max(wide.abs().amax(dim=-1, keepdim=True).float(), input_shard)
    scale = amax / FP8_MAX
    scale = torch.where(scale == 0, torch.full_like(scale, SMALLEST_SCALE), scale)
    return (wide / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``codes * scale`` in ``dtype`` (exact in float32 and wider: an e4m3 code times a float32 scale)."""
    return codes.to(dtype) * scale.to(dtype)


def scaled_mm_supported(device: torch.device, in_features: int, out_features: int) -> bool:
    """Whether ``torch._scaled_mm`` runs this GEMM on FP8 tensor cores (CUDA, compute capability >= 8.9)."""
    if device.type != "cuda" or in_features % SCALED_MM_ALIGNMENT or out_features % SCALED_MM_ALIGNMENT:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def scaled_matmul(codes: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Quantized rows ``codes [n, in]`` (``scale [n, 1]``) times e4m3 ``weight [out, in]`` (``weight_scale
    [out, 1]``) -> ``[n, out]`` in ``out_dtype``."""
    if scaled_mm_supported(codes.device, weight.shape[1], weight.shape[0]):
        return tensor_core_matmul(codes, scale, weight, weight_scale, out_dtype, bias)
    wide = compute_dtype(out_dtype)
    out = F.linear(dequantize(codes, scale, wide), dequantize(weight, weight_scale, wide))
    return out.to(out_dtype) if bias is None else (out + bias.to(wide)).to(out_dtype)


def tensor_core_matmul(codes: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`scaled_matmul` as ``torch._scaled_mm`` computes it with row-wise scales: ``weight.t()`` is the
    column-major operand it wants, ``weight_scale.t()`` one scale per output column. Torch runs the same call on
    the CPU, which is how the tests check this path without a GPU."""
    return torch._scaled_mm(codes, weight.t(), scale_a=scale, scale_b=weight_scale.float().t(), bias=bias,
                            out_dtype=out_dtype)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
               input_shard: TensorShard = WHOLE) -> torch.Tensor:
    """``x [..., in]`` through an e4m3 ``weight [out, in]`` with ``weight_scale [out, 1]``, ``x`` quantized per
    token; the result in ``x``'s dtype."""
    codes, scale = quantize_rows(x.reshape(-1, x.shape[-1]), input_shard)
    return scaled_matmul(codes, scale, weight, weight_scale, x.dtype, bias).view(*x.shape[:-1], weight.shape[0])


def fp8_grouped_glu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor,
                    activation: Callable[[torch.Tensor], torch.Tensor], scales: ExpertScales) -> torch.Tensor:
    """Every expert's gated MLP over its rows of ``x`` (sorted by expert, ``counts [E]`` each) with e4m3 weights
    ``gate_up [E, 2I, H]``, ``down [E, H, I]``; each GEMM's input is quantized per token, the intermediate
    included (all experts' at once: one collective when split). One expert at a time (counts read on the host)."""
    sizes = counts.tolist()
    middles = []
    for expert, rows in enumerate(x.split(sizes)):
        if not rows.shape[0]:
            continue
        gate, up = fp8_linear(rows, gate_up[expert], scales.gate_up[expert]).chunk(2, dim=-1)
        middles.append(activation(gate) * up)
    middle = torch.cat(middles) if middles else x.new_zeros(0, down.shape[2])
    codes, row_scales = quantize_rows(middle, scales.input_shard)
    outputs = [scaled_matmul(expert_codes, expert_scales, down[expert], scales.down[expert], x.dtype)
               for expert, (expert_codes, expert_scales) in enumerate(zip(codes.split(sizes), row_scales.split(sizes)))
               if sizes[expert]]
    return torch.cat(outputs) if outputs else x.new_zeros(0, down.shape[1])
