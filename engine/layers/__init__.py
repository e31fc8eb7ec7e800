"""The layer kit under the model stacks: layers that own their tensor-parallel collectives (``linear``: column-
and row-parallel linears; ``vocab``: the vocabulary-split embedding and head) and FP8 weights (``fp8``: the
kernels; ``quantization``: the scheme a checkpoint names; ``fp8_modules``: the modules a model's linears and
experts become)."""
