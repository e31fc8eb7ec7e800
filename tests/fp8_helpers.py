"""FP8-dynamic checkpoints made from the tiny fixtures with compressed-tensors' own observer and compressor, and
the library's fake-quantized reference: dequantized weights in float32, each quantized layer's input rounded to
e4m3 per token by the library at run time."""
from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from compressed_tensors.compressors import FloatQuantizationCompressor
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import dequantize, fake_quantize
from compressed_tensors.quantization.utils import calculate_qparams, compute_dynamic_scales_and_zp
from compressed_tensors.utils.match import match_name
from safetensors.torch import save_file
from torch import nn

import engine.models.moe as moe
from tests.model_helpers import raw_checkpoint

SCHEME = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
# RedHatAI's FP8-dynamic ignore list, as it spells it for DiffusionGemma, and its rule for LLaDA2's router
IGNORE = ["lm_head", "re:.*embed.*", "re:.*router.*", "re:.*mlp\\.gate$", "re:.*vision.*", "re:.*self_conditioning.*"]
LINEAR_WEIGHT = re.compile(r".*(_proj|query_key_value|dense)\.weight$")  # the fixtures' nn.Linear weights
FUSED_EXPERTS = re.compile(r"(.*experts)\.(gate_up_proj|down_proj)$")  # DiffusionGemma's 3-D expert stacks


def split_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """3-D expert stacks as checkpoints split per expert store them (``experts.E.{gate,up,down}_proj.weight``)."""
    split = {}
    for name, tensor in tensors.items():
        fused = FUSED_EXPERTS.fullmatch(name)
        if fused is None:
            split[name] = tensor
            continue
        for expert, stack in enumerate(tensor):
            pieces = dict(zip(("gate_proj", "up_proj"), stack.chunk(2))) if fused[2] == "gate_up_proj" else {
                "down_proj": stack}
            split |= {f"{fused[1]}.{expert}.{piece}.weight": part.contiguous() for piece, part in pieces.items()}
    return split


def quantized(name: str) -> bool:
    return bool(LINEAR_WEIGHT.fullmatch(name)) and not any(
        match_name(name.removesuffix(".weight"), pattern) for pattern in IGNORE)


def compress(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """One Linear weight as llm-compressor writes it: min-max per channel, compressed by the library."""
    scale, _ = calculate_qparams(weight.amin(dim=-1, keepdim=True), weight.amax(dim=-1, keepdim=True), SCHEME.weights)
    return FloatQuantizationCompressor.compress({"weight": weight, "weight_scale": scale}, SCHEME)


def write_checkpoint(source: Path, target: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.suffix != ".safetensors" and file.name != "config.json":
            shutil.copy(file, target / file.name)
    (target / "config.json").write_text(json.dumps(config))
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(target / "model.safetensors"))
    return target


def fp8_checkpoint(source: Path, target: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """``source`` cast to ``dtype``, its experts split per expert, every Linear weight but the ignored ones FP8."""
    tensors = {}
    for name, tensor in split_experts(raw_checkpoint(source)).items():
        tensor = tensor.to(dtype)
        if quantized(name):
            compressed = compress(tensor)
            tensors |= {name: compressed["weight"], f"{name}_scale": compressed["weight_scale"]}
        else:
            tensors[name] = tensor
    config = json.loads((source / "config.json").read_text()) | {"quantization_config": quantization_config()}
    return write_checkpoint(source, target, tensors, config)


def quantization_config() -> dict:
    """The ``quantization_config`` llm-compressor writes for FP8-dynamic with :data:`IGNORE`."""
    return QuantizationConfig(config_groups={"group_0": SCHEME}, format="float-quantized",
                              ignore=IGNORE).model_dump(mode="json")


def dequantized_checkpoint(fp8: Path, target: Path, original: Path | None = None) -> Path:
    """The FP8 checkpoint's weights dequantized by the library in float32 (scales upcast first), no
    quantization_config; with ``original``, its experts are that checkpoint's instead (not quantized)."""
    tensors, kept = raw_checkpoint(fp8), split_experts(raw_checkpoint(original)) if original else {}
    plain = {}
    for name, tensor in tensors.items():
        if name.endswith("_scale") and name.removesuffix("_scale") in tensors:
            continue  # a weight's scale
        if tensor.dtype == torch.float8_e4m3fn:
            tensor = dequantize(tensor, tensors[f"{name}_scale"].float(), args=SCHEME.weights)
        plain[name] = kept[name].float() if ".experts." in name and name in kept else tensor.float()
    config = json.loads((fp8 / "config.json").read_text())
    del config["quantization_config"]
    return write_checkpoint(fp8, target, plain, config)


def fake_quantized_tokens(x: torch.Tensor) -> torch.Tensor:
    """``x [tokens, k]`` rounded to e4m3 per token by the library (its dynamic scales, then quantize-dequantize)."""
    args, rows = SCHEME.input_activations, x.reshape(1, -1, x.shape[-1])
    scale, zero_point = compute_dynamic_scales_and_zp(rows, args, nn.Identity())
    return fake_quantize(rows, scale, zero_point, args).view(x.shape)


def reference_experts(x, gate_up, down, counts, activation="silu"):
    """Each expert's gated MLP with both inputs fake-quantized per token."""
    outputs = []
    for expert, rows in enumerate(x.split(counts.tolist())):
        if rows.shape[0]:
            gate, up = F.linear(fake_quantized_tokens(rows), gate_up[expert]).chunk(2, dim=-1)
            outputs.append(F.linear(fake_quantized_tokens(moe.ACTIVATIONS[activation](gate) * up), down[expert]))
    return torch.cat(outputs) if outputs else x.new_zeros(0, down.shape[1])


@contextmanager
def fake_quantized_activations(model: nn.Module, monkeypatch) -> Iterator[None]:
    """Run ``model`` (dequantized weights) as the library's fake-quantized model: every Linear but the ignored ones
    and the head takes its input rounded per token, and so do the experts."""
    hooks = [module.register_forward_pre_hook(lambda module, args: (fake_quantized_tokens(args[0]),))
             for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and name != "lm_head" and quantized(f"{name}.weight")]
    with monkeypatch.context() as patch:
        patch.setattr(moe, "grouped_glu_eager", reference_experts)
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
