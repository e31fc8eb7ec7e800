"""Read HF-format checkpoint directories: config.json, (sharded) safetensors, tokenizer files.

Weights are streamed tensor by tensor from safetensors into a model built on the meta device, cast
to the target dtype there and only then allocated with ``to_empty``, so peak memory is one model in
that dtype plus one tensor (casting after ``to_empty`` would first allocate the whole model in float32).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class WeightNames:
    """A checkpoint family's weight names against ours: whole-model names, and each layer's names
    after ``<layer_prefix>N.`` (ours after ``layers.N.``)."""

    top: Mapping[str, str]  # theirs -> ours
    layer: Mapping[str, str]  # theirs -> ours, within one layer
    layer_prefix: str  # "model.layers." (Qwen2 / Dream), "model.transformer.blocks." (LLaDA)
    dropped: tuple[str, ...] = ()  # parts of their names that hold no weight of ours (rotary caches)

    def ours(self, name: str) -> str | None:
        """Our name for a checkpoint name; None for one to drop; any other name is returned as it is
        (the loader reports it as unexpected)."""
        if name in self.top:
            return self.top[name]
        if any(part in name for part in self.dropped):
            return None
        layer, _, rest = name.removeprefix(self.layer_prefix).partition(".")
        if name.startswith(self.layer_prefix) and layer.isdigit() and rest in self.layer:
            return f"layers.{layer}.{self.layer[rest]}"
        return name

    def theirs(self, num_layers: int) -> dict[str, str]:
        """Our parameter name -> the checkpoint's, to write a checkpoint in the family's format."""
        names = {ours: theirs for theirs, ours in self.top.items()}
        for index in range(num_layers):
            names |= {f"layers.{index}.{ours}": f"{self.layer_prefix}{index}.{theirs}"
                      for theirs, ours in self.layer.items()}
        return names


def read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with path.open() as f:
        return json.load(f)


def safetensors_files(directory: Path) -> list[Path]:
    index = directory / SHARD_INDEX
    if index.is_file():
        shards = sorted(set(read_json(index)["weight_map"].values()))
        return [directory / shard for shard in shards]
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise ValueError(f"no safetensors weights in {directory}")
    return found


def iter_checkpoint_tensors(directory: Path) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """Yield ``(name, load)`` pairs; ``load()`` reads that one tensor from disk."""
    for file in safetensors_files(directory):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                yield name, (lambda handle=handle, name=name: handle.get_tensor(name))


def load_weights(
    model: nn.Module, directory: Path, rename: Callable[[str], str | None],
    device: torch.device, dtype: torch.dtype,
) -> None:
    """Fill a meta-device ``model`` from ``directory``; ``rename`` maps checkpoint names to ours
    (``None`` skips a tensor that we do not use, e.g. rotary caches)."""
    model.to(dtype)  # still on the meta device: the parameters are born in ``dtype``, never float32
    model.to_empty(device=device)
    model.tie_weights()  # moving off the meta device unties shared parameters
    params = model.checkpoint_tensors()  # fused projections appear as their checkpoint's parts
    loaded: set[str] = set()
    for checkpoint_name, load in iter_checkpoint_tensors(directory):
        name = rename(checkpoint_name)
        if name is None:
            continue
        if name not in params:
            raise ValueError(f"unexpected weight {checkpoint_name!r} in {directory}")
        tensor = load()
        if tensor.shape != params[name].shape:
            raise ValueError(
                f"weight {checkpoint_name!r} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(params[name].shape)} from config.json")
        with torch.no_grad():
            params[name].copy_(tensor.to(dtype))
        loaded.add(name)
    tied = {"lm_head.weight"} if model.lm_head.weight is model.embed_tokens.weight else set()
    missing = set(params) - loaded - tied
    if missing:
        raise ValueError(f"checkpoint {directory} lacks weights: {sorted(missing)[:5]}")
