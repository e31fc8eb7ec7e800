"""The layer kit under the model stacks: layers that own their tensor-parallel collectives and weight loaders
(``linear``: column- and row-parallel linears; ``vocab``: the vocabulary-split embedding and head; ``experts``:
stacked experts' checkpoint tensors; ``loading``: the weight slots a loader fills and the cuts they make) and FP8
weights (``fp8``: the kernels; ``quantization``: the scheme a checkpoint names; ``fp8_modules``: the modules a
model's linears and experts become)."""
