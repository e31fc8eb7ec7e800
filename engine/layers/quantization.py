"""The one weight quantization served, FP8-dynamic, as compressed-tensors writes it in ``quantization_config``.

A checkpoint's config is read with the ``compressed-tensors`` library (what vLLM and SGLang read it with):
``quant_method: compressed-tensors``, ``format: float-quantized``, every config group targeting ``Linear`` with
8-bit float weights, one scale per output channel, and 8-bit float input activations quantized per token at run
time. Any other scheme is refused naming the key that differs. ``quantization="fp8"`` on an unquantized
checkpoint quantizes its weights at load with the same scheme and the library's own arithmetic, so it gives what
the FP8 checkpoint made from it gives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from pydantic import ValidationError

from engine.layers.fp8 import FP8

if TYPE_CHECKING:  # the library is imported where a checkpoint or a config asks for FP8 (it takes seconds)
    from compressed_tensors.quantization import QuantizationArgs

QUANTIZATIONS = ("fp8",)  # what EngineConfig.quantization / load_model(quantization=...) accept (vLLM's name)
FORMAT = "float-quantized"
# what quantization="fp8" leaves in the model's dtype: RedHatAI's FP8-dynamic rules (the head, embeddings,
# routers, the vision tower, DiffusionGemma's self-conditioning)
DEFAULT_IGNORE = ("lm_head", "re:.*embed.*", "re:.*router.*", "re:.*mlp\\.gate$", "re:.*vision.*",
                  "re:.*self_conditioning.*")
WEIGHTS = {"type": "float", "num_bits": 8, "strategy": "channel", "symmetric": True, "dynamic": False}
ACTIVATIONS = {"type": "float", "num_bits": 8, "strategy": "token", "symmetric": True, "dynamic": True}
SERVED = ("FP8-dynamic: float8 e4m3 weights with one scale per output channel (strategy channel), "
          "activations quantized per token at run time (strategy token, dynamic)")


@dataclass(frozen=True)
class Fp8Scheme:
    """FP8-dynamic weights: which layers it leaves alone (``ignore``, compressed-tensors' patterns over the
    checkpoint's module names) and the weights' quantization arguments."""

    ignore: tuple[str, ...]
    weights: QuantizationArgs

    def quantizes(self, checkpoint_module: str) -> bool:
        """Whether the linear layer the checkpoint names ``checkpoint_module`` is FP8."""
        from compressed_tensors.utils.match import match_name

        return not any(match_name(checkpoint_module, pattern) for pattern in self.ignore)

    def quantize_weight(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``weight [..., out, in]`` -> e4m3 codes and scales ``[..., out, 1]``, as the library's min-max
        observer and compressor make them (in the weight's dtype)."""
        from compressed_tensors.quantization.lifecycle.forward import quantize
        from compressed_tensors.quantization.utils import calculate_qparams

        scale, zero_point = calculate_qparams(weight.amin(dim=-1, keepdim=True), weight.amax(dim=-1, keepdim=True),
                                              self.weights)
        return quantize(weight, scale, zero_point, self.weights, dtype=FP8), scale


def fp8_scheme(config: dict, requested: str | None, where: str) -> Fp8Scheme | None:
    """The FP8 scheme a checkpoint (``config.json`` as ``config``, at ``where``) is loaded with: its own
    ``quantization_config``, or with ``requested="fp8"`` and none in the checkpoint, weights quantized at load;
    None for unquantized weights. Anything else is refused naming the key."""
    if requested is not None and requested not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} or None, got {requested!r}")
    raw = config.get("quantization_config")
    if raw is not None:
        return read_quantization_config(raw, where)
    if requested is None:
        return None
    from compressed_tensors.quantization import preset_name_to_scheme

    return Fp8Scheme(DEFAULT_IGNORE, preset_name_to_scheme("FP8_DYNAMIC", ["Linear"]).weights)


def read_quantization_config(raw: dict, where: str) -> Fp8Scheme:
    """``quantization_config`` read by compressed-tensors, and refused unless it is FP8-dynamic."""
    def refuse(key: str, value) -> ValueError:
        return ValueError(f"{where}: quantization_config.{key} is {value!r}; the engine serves {SERVED}")

    from compressed_tensors.quantization import QuantizationConfig

    if not isinstance(raw, dict) or raw.get("quant_method") != "compressed-tensors":
        raise refuse("quant_method", raw.get("quant_method") if isinstance(raw, dict) else raw)
    try:
        config = QuantizationConfig.model_validate(raw)
    except ValidationError as error:
        raise ValueError(f"{where}: quantization_config is not a compressed-tensors config: {error}") from error
    if config.format != FORMAT:
        raise refuse("format", config.format)
    if config.kv_cache_scheme is not None:
        raise refuse("kv_cache_scheme", config.kv_cache_scheme.model_dump(exclude_defaults=True))
    if not config.config_groups:
        raise refuse("config_groups", config.config_groups)
    weights = None
    for group, scheme in config.config_groups.items():
        if list(scheme.targets) != ["Linear"]:
            raise refuse(f"config_groups.{group}.targets", scheme.targets)
        if scheme.output_activations is not None:
            raise refuse(f"config_groups.{group}.output_activations", "set")
        for part, args, wanted in (("weights", scheme.weights, WEIGHTS),
                                   ("input_activations", scheme.input_activations, ACTIVATIONS)):
            if args is None:
                raise refuse(f"config_groups.{group}.{part}", None)
            for key, value in wanted.items():
                if getattr(args, key) != value:
                    raise refuse(f"config_groups.{group}.{part}.{key}", getattr(args, key))
        weights = scheme.weights
    return Fp8Scheme(tuple(config.ignore or ()), weights)
