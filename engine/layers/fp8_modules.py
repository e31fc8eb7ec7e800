"""The modules FP8 weights live in, and the pass that turns a model's linears and experts into them.

:func:`to_fp8` runs on a model built on the meta device, after it took its dtype and before its memory exists:
each linear layer the scheme quantizes becomes an :class:`Fp8Linear` (a fused q/k/v or gate/up one too, parts and
all), and each stack of experts (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``) gets e4m3 parameters and
float32 scales beside them (``gate_up_proj_scale [E, 2I, 1]``, ``down_proj_scale [E, H, 1]``). A tensor's scale is
named as the tensor plus ``_scale``, as compressed-tensors names ``weight_scale``. Vocabulary layers stay in the
model's dtype. In a split model an FP8 layer loads and cuts its weight as the layer it replaces does, its
per-channel scale cut as the weight's rows; a row-parallel one (replacing a
:class:`~engine.layers.linear.RowParallelLinear`) takes each token's scale over all ranks' parts of its input and
sums its output over the ranks.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.layers.fp8 import FP8, ExpertScales, fp8_linear
from engine.layers.linear import ColumnParallelLinear, RowParallelLinear, column_share, linear_slots
from engine.layers.loading import WeightSlot, copy_weight, rows_share
from engine.layers.quantization import Fp8Scheme
from engine.parallel.shard import WHOLE, TensorShard, all_reduce

VOCABULARY_LAYERS = ("lm_head",)  # linears never quantized (the head reads its weight directly)
EXPERT_PROJECTIONS = ("gate_up_proj", "down_proj")


def fp8_parameter(*shape: int, dtype: torch.dtype = FP8) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Fp8Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``weight [out, in]`` in e4m3 and ``weight_scale [out, 1]`` in float32, ``x``
    quantized per token (``engine.layers.fp8``). ``parts`` / ``alias``: a fused projection's, as
    :class:`~engine.models.projections.FusedLinear` keeps them, its checkpoint parts offered as views.
    ``input_shard``: the ranks a row-parallel layer's input is split over; ``output_shard``: those it sums its
    output over; ``column_shard``: those a column-parallel layer's output features are split over."""

    def __init__(self, in_features: int, out_features: int, bias_dtype: torch.dtype | None,
                 parts: dict[str, int] | None = None, alias: str | None = None, input_shard: TensorShard = WHOLE,
                 output_shard: TensorShard = WHOLE, column_shard: TensorShard = WHOLE):
        super().__init__()
        self.input_shard, self.output_shard, self.column_shard = input_shard, output_shard, column_shard
        self.in_features, self.out_features = in_features, out_features
        self.weight = fp8_parameter(out_features, in_features)
        self.weight_scale = fp8_parameter(out_features, 1, dtype=torch.float32)
        self.bias = None if bias_dtype is None else fp8_parameter(out_features, dtype=bias_dtype)
        self.parts, self.alias = parts, alias

    @classmethod
    def like(cls, linear: nn.Linear) -> Fp8Linear:
        """The FP8 layer of ``linear``'s shape, parts and split, on its device."""
        row_parallel = isinstance(linear, RowParallelLinear)
        with torch.device(linear.weight.device):
            bias = None if linear.bias is None else linear.bias.dtype
            return cls(linear.in_features, linear.out_features, bias, getattr(linear, "parts", None),
                       getattr(linear, "alias", None), linear.shard if row_parallel else WHOLE,
                       linear.output_shard if row_parallel else WHOLE,
                       linear.shard if isinstance(linear, ColumnParallelLinear) else WHOLE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(fp8_linear(x, self.weight, self.weight_scale, self.bias, self.input_shard), self.output_shard)

    def weight_loader(self, target: torch.Tensor, full: torch.Tensor, name: str, kind: str = "weight",
                      part: str | None = None) -> None:
        """Copy this rank's share of checkpoint tensor ``name`` (``full``): a row-parallel layer's columns of the
        weight (its scales whole), else a column-parallel layer's rows (``part``: as
        :meth:`~engine.layers.linear.ColumnParallelLinear.weight_loader`)."""
        if self.input_shard.is_split:
            share = rows_share(full, 1, self.in_features, self.input_shard, name) if kind == "weight" else full
        else:
            share = column_share(full, self.column_shard, self.out_features, self.parts, part, name)
        copy_weight(target, share, name)

    def weight_slots(self, name: str) -> dict[str, WeightSlot]:
        """Its ``weight``, ``weight_scale`` (and ``bias``); a fused layer's per part and under its alias."""
        return linear_slots(self, name, ("weight", "weight_scale", "bias"))


def expert_scales(experts: nn.Module) -> ExpertScales | None:
    """An FP8 expert stack's scales; None when its weights are not FP8."""
    if experts.gate_up_proj.dtype != FP8:
        return None
    return ExpertScales(experts.gate_up_proj_scale, experts.down_proj_scale, experts.down_proj_input_shard)


def to_fp8(model: nn.Module, scheme: Fp8Scheme, checkpoint_name: Callable[[str], str | None],
           shard: TensorShard = WHOLE) -> None:
    """Make the linears and expert stacks of meta-device ``model`` (rank ``shard``'s share) that ``scheme``
    quantizes FP8, in place. ``checkpoint_name``: the checkpoint's name of one of our tensor names (None: the
    family has none), matched against the scheme's ``ignore`` patterns without its ``.weight``."""
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if isinstance(child, nn.Linear) and child_name not in VOCABULARY_LAYERS:
                if _quantized(scheme, checkpoint_name, _linear_names(parent_name, name, child), name):
                    setattr(parent, child_name, Fp8Linear.like(child))
            elif all(isinstance(getattr(child, p, None), nn.Parameter) for p in EXPERT_PROJECTIONS):
                if _quantized(scheme, checkpoint_name, [f"{name}.0.gate_proj.weight"], name):
                    _experts_to_fp8(child, shard)


def _linear_names(parent_name: str, name: str, linear: nn.Linear) -> list[str]:
    """Our checkpoint-level weight names of a linear: its parts' (and its alias's) when fused, else its own."""
    parts = [*(getattr(linear, "parts", None) or ()), *filter(None, [getattr(linear, "alias", None)])]
    if not parts:
        return [f"{name}.weight"]
    return [f"{parent_name}.{part}.weight" if parent_name else f"{part}.weight" for part in parts]


def _quantized(scheme: Fp8Scheme, checkpoint_name: Callable[[str], str | None], ours: list[str],
               module: str) -> bool:
    theirs = [checkpoint_name(name) for name in ours]
    decisions = {scheme.quantizes((found or name).removesuffix(".weight")) for found, name in zip(theirs, ours)}
    if len(decisions) > 1:
        raise ValueError(f"quantization_config.ignore keeps some but not all of the projections fused in {module} "
                         f"({', '.join(found or name for found, name in zip(theirs, ours))}): ignore all or none")
    return decisions.pop()


def _experts_to_fp8(experts: nn.Module, shard: TensorShard) -> None:
    experts.down_proj_input_shard = shard
    for projection in EXPERT_PROJECTIONS:
        stack = getattr(experts, projection)
        with torch.device(stack.device):
            setattr(experts, projection, fp8_parameter(*stack.shape))
            setattr(experts, f"{projection}_scale", fp8_parameter(*stack.shape[:2], 1, dtype=torch.float32))
