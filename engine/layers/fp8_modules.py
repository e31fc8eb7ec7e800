"""The modules FP8 weights live in, and the pass that turns a model's linears and experts into them.

:func:`to_fp8` runs on a model built on the meta device, after it took its dtype and before its memory exists:
each linear layer the scheme quantizes becomes an :class:`Fp8Linear` (a fused q/k/v or gate/up one too, parts and
all), and each stack of experts (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``) gets e4m3 parameters and
float32 scales beside them (``gate_up_proj_scale [E, 2I, 1]``, ``down_proj_scale [E, H, 1]``). A tensor's scale is
named as the tensor plus ``_scale``, as compressed-tensors names ``weight_scale``. Vocabulary layers stay in the
model's dtype. In a split model a row-parallel layer (a :class:`~engine.layers.linear.RowParallelLinear`, or in
the stacks not yet on the kit one named ``o_proj`` or ``down_proj``) takes each token's scale over all ranks' parts
of its input, and sums its output over the ranks as the layer it replaces did.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.layers.fp8 import FP8, ExpertScales, fp8_linear
from engine.layers.linear import RowParallelLinear, part_views
from engine.layers.quantization import Fp8Scheme
from engine.parallel.shard import WHOLE, TensorShard, all_reduce

VOCABULARY_LAYERS = ("lm_head",)  # linears never quantized (the head reads its weight directly)
EXPERT_PROJECTIONS = ("gate_up_proj", "down_proj")
ROW_PARALLEL = ("o_proj", "down_proj")  # plain nn.Linear layers whose input is split (stacks not on the kit)


def fp8_parameter(*shape: int, dtype: torch.dtype = FP8) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Fp8Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``weight [out, in]`` in e4m3 and ``weight_scale [out, 1]`` in float32, ``x``
    quantized per token (``engine.layers.fp8``). ``parts`` / ``alias``: a fused projection's, as
    :class:`~engine.models.projections.FusedLinear` keeps them, its checkpoint parts offered as views.
    ``input_shard``: the ranks a row-parallel layer's input is split over; ``output_shard``: those it sums its
    output over."""

    def __init__(self, in_features: int, out_features: int, bias_dtype: torch.dtype | None,
                 parts: dict[str, int] | None = None, alias: str | None = None, input_shard: TensorShard = WHOLE,
                 output_shard: TensorShard = WHOLE):
        super().__init__()
        self.input_shard, self.output_shard = input_shard, output_shard
        self.in_features, self.out_features = in_features, out_features
        self.weight = fp8_parameter(out_features, in_features)
        self.weight_scale = fp8_parameter(out_features, 1, dtype=torch.float32)
        self.bias = None if bias_dtype is None else fp8_parameter(out_features, dtype=bias_dtype)
        self.parts, self.alias = parts, alias

    @classmethod
    def like(cls, linear: nn.Linear, input_shard: TensorShard = WHOLE) -> Fp8Linear:
        """The FP8 layer of ``linear``'s shape (and parts), on its device."""
        with torch.device(linear.weight.device):
            bias = None if linear.bias is None else linear.bias.dtype
            output_shard = linear.output_shard if isinstance(linear, RowParallelLinear) else WHOLE
            return cls(linear.in_features, linear.out_features, bias, getattr(linear, "parts", None),
                       getattr(linear, "alias", None), input_shard, output_shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(fp8_linear(x, self.weight, self.weight_scale, self.bias, self.input_shard), self.output_shard)

    def views(self, prefix: str) -> dict[str, torch.Tensor]:
        """A fused layer's checkpoint tensors: each part's ``weight``, ``weight_scale`` (and ``bias``), and the
        whole under ``alias`` when it has one."""
        return part_views(self, prefix, ("weight", "weight_scale", "bias"))


def expert_scales(experts: nn.Module) -> ExpertScales | None:
    """An FP8 expert stack's scales; None when its weights are not FP8."""
    if experts.gate_up_proj.dtype != FP8:
        return None
    return ExpertScales(experts.gate_up_proj_scale, experts.down_proj_scale, experts.down_proj_input_shard)


def expert_views(prefix: str, experts: nn.Module) -> dict[str, torch.Tensor]:
    """Each expert's projections as checkpoints split per expert name them
    (``{e}.{gate,up,down}_proj.weight``, and ``.weight_scale`` when FP8), as views of the stacks."""
    scales = expert_scales(experts)
    kinds = {"weight": (experts.gate_up_proj, experts.down_proj)}
    if scales is not None:
        kinds["weight_scale"] = (scales.gate_up, scales.down)
    views = {}
    for kind, (gate_up, down) in kinds.items():
        for expert, (pair, down_part) in enumerate(zip(gate_up, down)):
            gate, up = pair.chunk(2)
            views |= {f"{prefix}{expert}.gate_proj.{kind}": gate, f"{prefix}{expert}.up_proj.{kind}": up,
                      f"{prefix}{expert}.down_proj.{kind}": down_part}
    return views


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
                    row_parallel = isinstance(child, RowParallelLinear) or child_name in ROW_PARALLEL
                    setattr(parent, child_name, Fp8Linear.like(child, shard if row_parallel else WHOLE))
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
