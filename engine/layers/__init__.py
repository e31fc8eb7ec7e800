"""The layer kit under the model stacks: FP8 weights (``fp8``: the kernels; ``quantization``: the scheme a
checkpoint names; ``fp8_modules``: the modules a model's linears and experts become)."""
