"""A checkpoint tensor cut to one rank's share, from the shape that rank's module expects.

The rule is read off the shapes: a tensor the rank holds whole is copied; one that differs in one dimension is
cut there into ``full / local`` equal pieces, and the rank takes the piece its heads or columns read (a key/value
head kept by several ranks is the same piece for each). Three tensors hold several parts along the cut
dimension, each cut on its own: vocabulary rows (padded on the last rank), a stacked expert's ``gate_up_proj``
and its FP8 scale (gate then up), and LLaDA2's fused ``query_key_value`` (queries, then keys and values of equal
size; its FP8 ``weight_scale`` alike).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.parallel.shard import TensorShard


def rank_share(name: str, full: torch.Tensor, local_shape: tuple[int, ...], shard: TensorShard,
               vocabulary: bool = False, query_key_value: tuple[int, int, int] | None = None) -> torch.Tensor:
    """The part of checkpoint tensor ``name`` (``full``) that rank ``shard.rank`` holds, shaped ``local_shape``.
    ``query_key_value``: a fused q/k/v's local part sizes along dimension 0 (queries are split by ``size``)."""
    if tuple(full.shape) == tuple(local_shape):
        return full
    if vocabulary:
        rows = local_shape[0]
        piece = full[shard.rank * rows:(shard.rank + 1) * rows]
        return F.pad(piece, (0, 0, 0, rows - piece.shape[0])) if piece.shape[0] < rows else piece
    if query_key_value is not None:
        queries = query_key_value[0] * shard.size
        keys = (full.shape[0] - queries) // 2
        return torch.cat([_piece(name, part, (rows, *local_shape[1:]), shard, 0)
                          for part, rows in zip(full.split([queries, keys, keys]), query_key_value)])
    dim = _cut_dimension(name, full.shape, local_shape)
    if name.endswith(("gate_up_proj", "gate_up_proj_scale")):
        half_shape = tuple(size // 2 if d == dim else size for d, size in enumerate(local_shape))
        return torch.cat([_piece(name, half, half_shape, shard, dim) for half in full.chunk(2, dim=dim)], dim=dim)
    return _piece(name, full, local_shape, shard, dim)


def _cut_dimension(name: str, full: torch.Size, local: tuple[int, ...]) -> int:
    differing = [d for d, (whole, part) in enumerate(zip(full, local)) if whole != part]
    if len(full) != len(local) or len(differing) != 1:
        raise ValueError(f"weight {name!r} of shape {tuple(full)} cannot be cut to a rank's {tuple(local)}")
    return differing[0]


def _piece(name: str, full: torch.Tensor, local_shape: tuple[int, ...], shard: TensorShard, dim: int) -> torch.Tensor:
    pieces, leftover = divmod(full.shape[dim], local_shape[dim])
    if leftover or shard.size % pieces:
        raise ValueError(f"weight {name!r}: {full.shape[dim]} along dimension {dim} is not a rank's "
                         f"{local_shape[dim]} times a divisor of tensor_parallel_size={shard.size}")
    index = shard.rank // (shard.size // pieces)
    return full.narrow(dim, index * local_shape[dim], local_shape[dim])
