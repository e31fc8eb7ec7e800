"""Read HF-format checkpoint directories: config.json, (sharded) safetensors, tokenizer files.

Weights are streamed tensor by tensor from safetensors into a model built on the meta device, cast
to the target dtype there and only then allocated with ``to_empty``, so peak memory is one model in
that dtype plus one tensor (casting after ``to_empty`` would first allocate the whole model in float32).
"""
from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.layers.fp8 import FP8
from engine.layers.fp8_modules import to_fp8
from engine.layers.loading import checkpoint_slots
from engine.layers.quantization import Fp8Scheme
from engine.parallel.shard import WHOLE, TensorShard

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
    same_within_layer: tuple[str, ...] = ()  # layer-relative name prefixes ours share ("mlp.experts.")

    def ours(self, name: str) -> str | None:
        """Our name for a checkpoint name; None for one to drop; any other name is returned as it is
        (the loader reports it as unexpected)."""
        if name in self.top:
            return self.top[name]
        if any(part in name for part in self.dropped):
            return None
        layer, _, rest = name.removeprefix(self.layer_prefix).partition(".")
        if name.startswith(self.layer_prefix) and layer.isdigit():
            if rest in self.layer:
                return f"layers.{layer}.{self.layer[rest]}"
            if rest.startswith(self.same_within_layer) and self.same_within_layer:
                return f"layers.{layer}.{rest}"
        return name

    def theirs(self, num_layers: int) -> dict[str, str]:
        """Our parameter name -> the checkpoint's, to write a checkpoint in the family's format."""
        names = {ours: theirs for theirs, ours in self.top.items()}
        for index in range(num_layers):
            names |= {f"layers.{index}.{ours}": f"{self.layer_prefix}{index}.{theirs}"
                      for theirs, ours in self.layer.items()}
        return names

    def theirs_of(self, ours: str) -> str | None:
        """The checkpoint's name for one of our checkpoint-level names (None: the family has no such
        tensor, e.g. the q/k/v parts of LLaDA2's fused projection)."""
        inverse_top = {o: t for t, o in self.top.items()}
        if ours in inverse_top:
            return inverse_top[ours]
        layer, _, rest = ours.removeprefix("layers.").partition(".")
        if not (ours.startswith("layers.") and layer.isdigit()):
            return None
        inverse_layer = {o: t for t, o in self.layer.items()}
        if rest in inverse_layer:
            return f"{self.layer_prefix}{layer}.{inverse_layer[rest]}"
        if self.same_within_layer and rest.startswith(self.same_within_layer):
            return f"{self.layer_prefix}{layer}.{rest}"
        return None


# Qwen-style checkpoints (Dream's Qwen2, SDAR's Qwen3): theirs -> ours within a layer, and the top level
QWEN_LAYER_NAMES = {
    "input_layernorm.weight": "input_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    **{f"self_attn.{p}_proj.weight": f"attention.{p}_proj.weight" for p in ("q", "k", "v", "o")},
    **{f"mlp.{p}_proj.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
}
QWEN_TOP_NAMES = {"model.embed_tokens.weight": "embed_tokens.weight", "model.norm.weight": "norm.weight",
                  "lm_head.weight": "lm_head.weight"}


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
    device: torch.device, dtype: torch.dtype, shard: TensorShard = WHOLE,
    fp8: Fp8Scheme | None = None, checkpoint_name: Callable[[str], str | None] = lambda name: None,
) -> None:
    """Fill a meta-device ``model`` from ``directory``; ``rename`` maps checkpoint names to ours
    (``None`` skips a tensor that we do not use, e.g. rotary caches). A model split over ranks takes rank
    ``shard.rank``'s share of each tensor, cut by the layer that holds it (``engine.layers.loading``). With an
    ``fp8`` scheme the layers it quantizes hold FP8 weights (``engine.layers.fp8_modules``; ``checkpoint_name``:
    ours -> the checkpoint's name, for its ignore list), read as stored or quantized here from the checkpoint's
    own dtype, whole, before the layer cuts the codes and their scales."""
    model.to(dtype)  # still on the meta device: the parameters are born in ``dtype``, never float32
    if fp8 is not None:
        to_fp8(model, fp8, checkpoint_name, shard)
    # to_empty's empty_like of a meta tensor runs torch's Python references, which import sympy (a third of a
    # second of every process's start); an empty tensor of each shape is the same storage without them
    model._apply(lambda tensor: torch.empty(tensor.shape, dtype=tensor.dtype, device=device))
    model.tie_weights()  # moving off the meta device unties shared parameters
    slots = checkpoint_slots(model)  # fused projections appear as their checkpoint's parts
    params = {name: slot.tensor for name, slot in slots.items()}
    loaded: set[str] = set()
    for stored_name, load in iter_checkpoint_tensors(directory):
        name = _our_name(rename, stored_name, params)
        if name is None:
            continue
        if name not in params:
            raise ValueError(f"unexpected weight {stored_name!r} in {directory}")
        for target, tensor in _as_stored(name, load(), params, fp8, stored_name):
            slots[target].load(tensor, stored_name)
            loaded.add(target)
    missing = unwritten(params, loaded)
    if missing:
        raise ValueError(f"checkpoint {directory} lacks weights: {missing[:5]}")


def _our_name(rename: Callable[[str], str | None], stored_name: str, params: dict[str, torch.Tensor]) -> str | None:
    """Our name of a checkpoint tensor; an FP8 scale (``<weight>_scale``) is named after its weight."""
    name = rename(stored_name)
    if name in params or not stored_name.endswith("_scale"):
        return name
    weight = rename(stored_name.removesuffix("_scale"))
    return name if weight is None else f"{weight}_scale"


def _as_stored(name: str, tensor: torch.Tensor, params: dict[str, torch.Tensor], fp8: Fp8Scheme | None,
               checkpoint_name: str) -> list[tuple[str, torch.Tensor]]:
    """``(our name, tensor)`` pairs to copy for one checkpoint tensor: itself, or for an FP8 parameter given
    in another dtype, its e4m3 codes and its scale (quantized whole, before a rank takes its share)."""
    stored_fp8, wanted_fp8 = tensor.dtype == FP8, params[name].dtype == FP8
    if stored_fp8 and not wanted_fp8:
        raise ValueError(f"weight {checkpoint_name!r} is float8, but the model keeps it in its own dtype: "
                         f"quantization_config.ignore names it, or it is a layer FP8 does not quantize")
    if wanted_fp8 and not stored_fp8:
        codes, scale = fp8.quantize_weight(tensor)
        return [(name, codes), (f"{name}_scale", scale)]
    return [(name, tensor)]


def unwritten(tensors: dict[str, torch.Tensor], written: set[str]) -> list[str]:
    """The names in ``tensors`` whose memory the ``written`` ones do not cover: a name counts as
    loaded when its bytes were (a tied head through the embedding, LLaDA2's fused q/k/v through its
    parts or the other way round), so a tensor offered under two names is needed once. Every offered
    tensor is contiguous (whole parameters or row slices of them), so its bytes are one span."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                   for name, t in tensors.items() if name in written)
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    starts = [start for start, _ in merged]
    missing = []
    for name, tensor in sorted(tensors.items()):
        begin, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        span = bisect.bisect_right(starts, begin) - 1
        if name not in written and size and (span < 0 or merged[span][1] < begin + size):
            missing.append(name)
    return missing
