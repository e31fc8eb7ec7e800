"""Weight loading owned by the layer kit: the layer that holds a tensor says how a checkpoint tensor becomes its share.

A model's checkpoint-level tensors are :class:`WeightSlot` s: each names the tensor to fill (a parameter, or a
view of one: a fused layer's part, one expert of a stack) and the owning layer's ``weight_loader``, which cuts the
full checkpoint tensor to this rank's share and copies it in. A layer outside the kit holds its tensors whole.
The cuts are the kit's own: a column-parallel layer keeps its rows (output features), a row-parallel one its
columns (input features), the vocabulary layers their rows padded past the vocabulary, and stacked experts each
expert's intermediate width. A per-channel FP8 scale is cut as its weight's rows, or kept whole when the weight is
cut by columns.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.parallel.shard import TensorShard

Loader = Callable[[torch.Tensor, torch.Tensor, str], None]  # (target, full checkpoint tensor, its stored name)


def copy_weight(target: torch.Tensor, share: torch.Tensor, name: str) -> None:
    """Copy ``share`` into ``target`` in ``target``'s dtype, refusing a shape that ``config.json`` does not give."""
    if share.shape != target.shape:
        raise ValueError(f"weight {name!r} has shape {tuple(share.shape)}, expected {tuple(target.shape)} from "
                         f"config.json")
    with torch.no_grad():  # in the target's dtype: the model's, FP8, or float32 for a router or a scale
        target.copy_(share.to(target.dtype))


def whole_loader(target: torch.Tensor, full: torch.Tensor, name: str) -> None:
    """The loader of a tensor every rank holds whole (norms, routers, scales of a row-parallel layer)."""
    copy_weight(target, full, name)


@dataclass(frozen=True)
class WeightSlot:
    """Where one checkpoint tensor goes: ``tensor`` to fill, and ``loader``, its layer's rule for the share."""

    tensor: torch.Tensor
    loader: Loader = whole_loader

    def load(self, full: torch.Tensor, name: str) -> None:
        """Fill ``tensor`` with this rank's share of checkpoint tensor ``name`` (``full``)."""
        self.loader(self.tensor, full, name)


def rows_share(full: torch.Tensor, dim: int, rows: int, shard: TensorShard, name: str) -> torch.Tensor:
    """This rank's ``rows`` of ``full`` along ``dim``. ``full`` is cut into ``full / rows`` equal pieces; with fewer
    pieces than ranks each piece is held by ``size / pieces`` consecutive ranks (a replicated key/value head)."""
    if not shard.is_split:
        return full
    pieces, leftover = divmod(full.shape[dim], rows) if full.dim() > dim else (0, 1)
    if leftover or not pieces or shard.size % pieces:
        raise ValueError(f"weight {name!r} of shape {tuple(full.shape)}: its dimension {dim} is not a rank's {rows} "
                         f"times a divisor of tensor_parallel_size={shard.size}")
    return full.narrow(dim, shard.rank // (shard.size // pieces) * rows, rows)


def padded_rows_share(full: torch.Tensor, rows: int, shard: TensorShard) -> torch.Tensor:
    """Rows ``rank * rows`` on of ``full``, padded with zeros to ``rows`` (the vocabulary's last rank)."""
    piece = full[shard.rank * rows:(shard.rank + 1) * rows]
    return F.pad(piece, (0, 0, 0, rows - piece.shape[0])) if piece.shape[0] < rows else piece


def parts_share(full: torch.Tensor, dim: int, local: list[int], shard: TensorShard, name: str) -> torch.Tensor:
    """A fused tensor stored whole, cut part by part along ``dim``: ``local`` holds this rank's part sizes. The
    first part is split over every rank; the others share the rest equally (q then k and v; gate then up)."""
    if not shard.is_split:
        return full
    first = local[0] * shard.size
    rest = full.shape[dim] - first
    if rest < 0 or rest % max(len(local) - 1, 1):
        raise ValueError(f"weight {name!r} of shape {tuple(full.shape)} does not hold {len(local)} parts along "
                         f"dimension {dim}")
    sizes = [first] + [rest // (len(local) - 1)] * (len(local) - 1)
    return torch.cat([rows_share(part, dim, rows, shard, name)
                      for part, rows in zip(full.split(sizes, dim=dim), local)], dim=dim)


def module_slots(module: nn.Module, name: str) -> dict[str, WeightSlot]:
    """One module's own checkpoint tensors: a kit layer's ``weight_slots``, else its parameters and persistent
    buffers, held whole (``name``: the module's qualified name)."""
    if hasattr(module, "weight_slots"):
        return module.weight_slots(name)
    prefix = f"{name}." if name else ""
    tensors = {prefix + key: p for key, p in module.named_parameters(recurse=False)}
    tensors |= {prefix + key: b for key, b in module.named_buffers(recurse=False)
                if key not in module._non_persistent_buffers_set}
    return {key: WeightSlot(tensor) for key, tensor in tensors.items()}


def checkpoint_slots(model: nn.Module) -> dict[str, WeightSlot]:
    """Every checkpoint tensor of ``model`` under its checkpoint-level name, with the loader of its layer."""
    slots: dict[str, WeightSlot] = {}
    for name, module in model.named_modules():
        slots |= module_slots(module, name)
    return slots
