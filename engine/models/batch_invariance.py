"""Process-wide cuBLAS settings that keep a GEMM's result for one row independent of the batch's shape.

``load_model(..., batch_invariant=True)`` runs each row's attention alone over its own keys
(``engine.models.transformer.Attention``), which on the CPU is all it takes: bf16 ``F.linear`` rows are
bitwise the same for any number of rows there. On CUDA, cuBLAS may also split a GEMM's K dimension by
shape and reduce bf16 products at lower precision, so the loader applies the settings vLLM's
batch-invariant mode uses:

* ``CUBLAS_WORKSPACE_CONFIG=:16:8`` and ``CUBLASLT_WORKSPACE_SIZE=1``: no workspace for split-K
  reductions. cuBLAS reads them when its handle is created, so they only take effect if set before
  the process's first CUDA matmul (the loader warns when it is too late: set them in the job's
  environment, e.g. ``runtime_env={"env_vars": ...}``);
* no reduced-precision bf16/fp16 reductions, no TF32, cuBLASLt as the preferred library.

They apply to everything in the process, not only to this model; the loader applies them.
"""
from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

CUBLAS_ENVIRONMENT = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}


def configure_cuda_batch_invariance() -> None:
    """Apply the settings above; a no-op without CUDA."""
    if not torch.cuda.is_available():
        return
    late = torch.cuda.is_initialized()
    for name, value in CUBLAS_ENVIRONMENT.items():
        if os.environ.get(name) != value:
            if late:
                logger.warning("batch_invariant: %s=%s must be set before CUDA starts (set it in the "
                               "process environment); this process keeps cuBLAS's current workspace", name, value)
            os.environ[name] = value
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.preferred_blas_library("cublaslt")
