"""Stacked experts' checkpoint tensors and their weight loader.

An expert stack holds every routed expert's gated MLP in two parameters, ``gate_up_proj [E, 2I, H]`` (gate rows,
then up rows) and ``down_proj [E, H, I]``, with FP8 scales ``gate_up_proj_scale [E, 2I, 1]`` and
``down_proj_scale [E, H, 1]`` beside them. Checkpoints name each expert's projections (``{e}.gate_proj.weight``,
``{e}.up_proj.weight``, ``{e}.down_proj.weight``, and ``weight_scale``), which are offered as views of the stacks;
some store the stacks themselves (DiffusionGemma's bf16 ``experts.gate_up_proj``). Split over ranks, each expert
keeps its rank's part of the intermediate width ``I``: rows of gate and up, columns of down (whose per-channel
scale every rank holds whole).
"""
from __future__ import annotations

from functools import partial

import torch
from torch import nn

from engine.layers.fp8_modules import expert_scales
from engine.layers.loading import WeightSlot, copy_weight, parts_share, rows_share
from engine.parallel.shard import TensorShard

# projection -> the dimension cut to the rank's width: (in one expert's tensor, in the stack)
CUTS = {"gate_proj": (0, 1), "up_proj": (0, 1), "gate_up_proj": (0, 1), "down_proj": (1, 2)}


def expert_loader(target: torch.Tensor, full: torch.Tensor, name: str, *, projection: str, kind: str,
                  stacked: bool, width: int, shard: TensorShard) -> None:
    """Copy this rank's share of an expert tensor ``name`` (``full``): one expert's (``stacked=False``) or the
    stack's; ``width``: this rank's intermediate width of each expert."""
    if projection == "down_proj" and kind != "weight":
        copy_weight(target, full, name)  # down's output channels are whole on every rank
        return
    dim = CUTS[projection][stacked]
    if projection == "gate_up_proj":
        share = parts_share(full, dim, [width, width], shard, name)
    else:
        share = rows_share(full, dim, width, shard, name)
    copy_weight(target, share, name)


def expert_slots(experts: nn.Module, prefix: str, shard: TensorShard, stacked: bool) -> dict[str, WeightSlot]:
    """An expert stack's checkpoint tensors with their loader: each expert's projections as views, and the stacks
    under their own names when ``stacked``."""
    width = experts.down_proj.shape[2]
    scales = expert_scales(experts)
    kinds = {"weight": (experts.gate_up_proj, experts.down_proj)}
    if scales is not None:
        kinds["weight_scale"] = (scales.gate_up, scales.down)
    slots = {}
    for kind, (gate_up, down) in kinds.items():
        loader = partial(expert_loader, kind=kind, width=width, shard=shard)
        for expert, (pair, down_part) in enumerate(zip(gate_up, down)):
            gate, up = pair.chunk(2)
            for projection, tensor in (("gate_proj", gate), ("up_proj", up), ("down_proj", down_part)):
                slots[f"{prefix}{expert}.{projection}.{kind}"] = WeightSlot(
                    tensor, partial(loader, projection=projection, stacked=False))
        if stacked:
            suffix = "" if kind == "weight" else "_scale"
            for projection, tensor in (("gate_up_proj", gate_up), ("down_proj", down)):
                slots[f"{prefix}{projection}{suffix}"] = WeightSlot(tensor, partial(loader, projection=projection,
                                                                                    stacked=True))
    return slots
