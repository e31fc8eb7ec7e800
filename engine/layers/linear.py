"""Linear layers split over tensor-parallel ranks, each calling its own collective, so a model file calls none.

A column-parallel layer holds its rank's output features (rows of ``W``): its input is whole, its output this
rank's part, and it needs no collective. A row-parallel layer holds its rank's input features (columns of ``W``):
each rank's product is a partial sum of the whole output, added over the ranks by one all-reduce. A layer that
adds several row-parallel outputs first (routed experts and a shared expert) sums them once with
:class:`RankSum`. Unsplit (``WHOLE``), each is a plain ``nn.Linear``.

Each layer owns its weight loader (``engine.layers.loading``): a column-parallel layer keeps its rows of a
checkpoint tensor, part by part when fused (q/k/v; gate/up), and a row-parallel layer its columns of the weight.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.loading import WeightSlot, copy_weight, parts_share, rows_share
from engine.parallel.shard import WHOLE, TensorShard, all_reduce


class ColumnParallelLinear(nn.Linear):
    """``y = x W^T (+ b)`` for this rank's ``out_features`` (its share of the whole layer's): no collective."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, shard: TensorShard = WHOLE):
        super().__init__(in_features, out_features, bias=bias)
        self.shard = shard

    def weight_loader(self, target: torch.Tensor, full: torch.Tensor, name: str, kind: str = "weight",
                      part: str | None = None) -> None:
        """Copy this rank's rows of checkpoint tensor ``name`` (``full``) into ``target``; ``part``: which part of a
        fused layer ``full`` is (its alias: the whole fused tensor)."""
        copy_weight(target, column_share(full, self.shard, self.out_features, getattr(self, "parts", None), part,
                                         name), name)

    def weight_slots(self, name: str) -> dict[str, WeightSlot]:
        return linear_slots(self, name, ("weight", "bias"))


class RowParallelLinear(nn.Linear):
    """``y = sum over ranks of x_r W_r^T``: this rank's ``in_features`` of the input, the partial products added
    over the ranks (one all-reduce of ``[tokens, out_features]``). ``reduce_results=False`` leaves the partial
    sum to a caller that adds others to it before one :class:`RankSum`. No bias: every rank would add it."""

    def __init__(self, in_features: int, out_features: int, shard: TensorShard = WHOLE, reduce_results: bool = True):
        super().__init__(in_features, out_features, bias=False)
        self.shard, self.reduce_results = shard, reduce_results

    @property
    def output_shard(self) -> TensorShard:
        """The ranks this layer sums its output over (``WHOLE``: none)."""
        return self.shard if self.reduce_results else WHOLE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(F.linear(x, self.weight), self.output_shard)

    def weight_loader(self, target: torch.Tensor, full: torch.Tensor, name: str, kind: str = "weight") -> None:
        """Copy this rank's columns of checkpoint tensor ``name`` (``full``) into ``target``."""
        copy_weight(target, rows_share(full, 1, self.in_features, self.shard, name) if kind == "weight" else full,
                    name)

    def weight_slots(self, name: str) -> dict[str, WeightSlot]:
        return linear_slots(self, name, ("weight",))


class RankSum(nn.Module):
    """Partial sums added over the ranks (one all-reduce, in place); the input itself when not split."""

    def __init__(self, shard: TensorShard = WHOLE):
        super().__init__()
        self.shard = shard

    def forward(self, partial: torch.Tensor) -> torch.Tensor:
        return all_reduce(partial, self.shard)


def column_share(full: torch.Tensor, shard: TensorShard, out_features: int, parts: dict[str, int] | None,
                 part: str | None, name: str) -> torch.Tensor:
    """A column-parallel layer's rows of ``full`` (a weight, its per-channel scale or its bias): of the whole
    layer, of one of its ``parts``, or of every part when ``part`` is none of them (the fused tensor's alias)."""
    if parts is None:
        return rows_share(full, 0, out_features, shard, name)
    if part in parts:
        return rows_share(full, 0, parts[part], shard, name)
    return parts_share(full, 0, list(parts.values()), shard, name)


def linear_slots(layer: nn.Module, name: str, kinds: tuple[str, ...]) -> dict[str, WeightSlot]:
    """A kit linear's checkpoint tensors with its ``weight_loader``: each tensor ``kind`` it holds under ``name``,
    or for a fused layer (``parts``) each part's view under its parent's name, and the whole under its ``alias``."""
    parts, alias = getattr(layer, "parts", None), getattr(layer, "alias", None)
    parent = name.rpartition(".")[0]
    prefix = f"{parent}." if parent else ""
    slots = {}
    for kind in kinds:
        tensor = getattr(layer, kind)
        if tensor is None:
            continue
        if parts is None:
            slots[f"{name}.{kind}"] = WeightSlot(tensor, partial(layer.weight_loader, kind=kind))
            continue
        for part, piece in zip(parts, tensor.split(list(parts.values()))):
            slots[f"{prefix}{part}.{kind}"] = WeightSlot(piece, partial(layer.weight_loader, kind=kind, part=part))
        if alias is not None:
            slots[f"{prefix}{alias}.{kind}"] = WeightSlot(tensor, partial(layer.weight_loader, kind=kind, part=alias))
    return slots
