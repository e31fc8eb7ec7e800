"""Loading a checkpoint, specified: the model's parameters are allocated once, in the dtype asked for.

Casting after allocating would first put the whole model in float32 on the device (LLaDA-8B: ~30 GiB
before its 16 GiB bf16 copy, and the caching allocator keeps the freed blocks reserved).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

from engine.models import load_model

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def bf16_copy(source: Path, destination: Path) -> Path:
    """``source`` with every weight stored in bfloat16 (config, tokenizer and shard index as they are)."""
    shutil.copytree(source, destination)
    for file in destination.glob("*.safetensors"):
        weights = {name: tensor.to(torch.bfloat16) for name, tensor in load_file(file).items()}
        save_file(weights, file, metadata={"format": "pt"})
    return destination


class Float32Tensors(TorchDispatchMode):
    """Records every float32 tensor a torch op produces off the meta device (allocations included)."""

    def __init__(self) -> None:
        super().__init__()
        self.produced: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" \
                    and tensor.dtype == torch.float32:
                self.produced.append((str(func), tuple(tensor.shape)))
        return result


@pytest.mark.parametrize("fixture", ["tiny-llada", "tiny-dream"])
def test_a_bf16_checkpoint_loaded_in_bf16_never_holds_a_float32_parameter(fixture, tmp_path):
    checkpoint = bf16_copy(FIXTURES / fixture, tmp_path / fixture)
    with Float32Tensors() as float32:
        lm = load_model(checkpoint, dtype="bfloat16")
    assert float32.produced == []
    assert {parameter.dtype for parameter in lm.model.parameters()} == {torch.bfloat16}
    exact = load_model(checkpoint, dtype="float32")  # bf16 values are exact in float32
    for (name, parameter), (_, reference) in zip(lm.model.named_parameters(), exact.model.named_parameters()):
        assert torch.equal(parameter, reference.to(torch.bfloat16)), name
