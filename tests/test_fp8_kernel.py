"""The FP8 GEMM that CUDA devices run, ``torch._scaled_mm`` with row-wise scales, checked on the CPU, where torch
runs the same call: with our operand layout it computes the dequantized math the CPU path uses."""
from __future__ import annotations

import pytest
import torch

from engine.layers.fp8 import quantize_rows, scaled_matmul, tensor_core_matmul


def quantized_operands(rows: int, in_features: int, out_features: int, seed: int = 0):
    """Activations quantized per token and a weight quantized per output channel, as the FP8 layers hold them."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=generator) * 3
    weight = torch.randn(out_features, in_features, generator=generator) / 8
    return (*quantize_rows(x), *quantize_rows(weight))


@pytest.mark.parametrize("rows", [1, 7, 48])
def test_the_tensor_core_gemm_in_float32_is_the_dequantized_math_up_to_summation_order(rows):
    codes, scale, weight, weight_scale = quantized_operands(rows, 64, 96)
    torch.testing.assert_close(tensor_core_matmul(codes, scale, weight, weight_scale, torch.float32),
                               scaled_matmul(codes, scale, weight, weight_scale, torch.float32), rtol=1e-6, atol=1e-5)


def test_the_tensor_core_gemm_in_bf16_with_a_bias_is_the_dequantized_math_within_bf16_rounding():
    codes, scale, weight, weight_scale = quantized_operands(16, 128, 64, seed=1)
    bias = torch.randn(64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    fast = tensor_core_matmul(codes, scale, weight, weight_scale, torch.bfloat16, bias)
    exact = (codes.float() * scale) @ (weight.float() * weight_scale).t() + bias.float()
    assert fast.dtype == torch.bfloat16 and fast.shape == (16, 64)
    torch.testing.assert_close(fast.float(), exact, rtol=2**-7, atol=2**-7 * exact.abs().max().item())


def test_a_transposed_scale_layout_would_be_caught():
    """Scales applied to the wrong axis (one per input column, say) change the product: the check above binds."""
    codes, scale, weight, weight_scale = quantized_operands(16, 64, 64, seed=3)
    swapped = tensor_core_matmul(codes, scale, weight, weight_scale.flip(0), torch.float32)
    assert not torch.allclose(swapped, scaled_matmul(codes, scale, weight, weight_scale, torch.float32))
