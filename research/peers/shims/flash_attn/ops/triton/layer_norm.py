"""Eager RMSNorm standing in for flash-attn's triton ``rms_norm_fn`` (peer harness shim).

It is the eager version SDAR keeps commented out under ``SDARRMSNorm.forward`` (modeling_sdar.py:356-375):
normalise in float32, cast back to the input dtype, then multiply by the weight.
"""
from __future__ import annotations

import torch


def rms_norm_fn(x, weight, bias=None, residual=None, eps=1e-6, dropout_p=0.0, prenorm=False,
                residual_in_fp32=False, **unused):
    if bias is not None or residual is not None or dropout_p or prenorm or unused:
        raise NotImplementedError("rms_norm_fn shim: only weight * rmsnorm(x) is provided")
    input_dtype = x.dtype
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)
