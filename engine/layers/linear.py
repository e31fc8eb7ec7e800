"""Linear layers split over tensor-parallel ranks, each calling its own collective, so a model file calls none.

A column-parallel layer holds its rank's output features (rows of ``W``): its input is whole, its output this
rank's part, and it needs no collective. A row-parallel layer holds its rank's input features (columns of ``W``):
each rank's product is a partial sum of the whole output, added over the ranks by one all-reduce. A layer that
adds several row-parallel outputs first (routed experts and a shared expert) sums them once with
:class:`RankSum`. Unsplit (``WHOLE``), each is a plain ``nn.Linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.parallel.shard import WHOLE, TensorShard, all_reduce


class ColumnParallelLinear(nn.Linear):
    """``y = x W^T (+ b)`` for this rank's ``out_features`` (its share of the whole layer's): no collective."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, shard: TensorShard = WHOLE):
        super().__init__(in_features, out_features, bias=bias)
        self.shard = shard


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


class RankSum(nn.Module):
    """Partial sums added over the ranks (one all-reduce, in place); the input itself when not split."""

    def __init__(self, shard: TensorShard = WHOLE):
        super().__init__()
        self.shard = shard

    def forward(self, partial: torch.Tensor) -> torch.Tensor:
        return all_reduce(partial, self.shard)


def part_views(layer: nn.Module, prefix: str, kinds: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """A fused layer's checkpoint tensors: ``{prefix + part + "." + kind: view}`` for each of its ``parts`` and
    each tensor ``kind`` it holds, and the whole tensor under ``prefix + alias`` when it has an alias."""
    views = {}
    for kind in kinds:
        tensor = getattr(layer, kind)
        if tensor is not None:
            for name, piece in zip(layer.parts, tensor.split(list(layer.parts.values()))):
                views[f"{prefix}{name}.{kind}"] = piece
            if layer.alias is not None:
                views[f"{prefix}{layer.alias}.{kind}"] = tensor
    return views
