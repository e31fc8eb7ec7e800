"""One rank's share of a model split over ``tensor_parallel_size`` devices, and the collectives its forward calls.

Attention is split by heads (key/value heads too, or each rank keeps one shared key/value head when there are
fewer of them than ranks), the MLPs and each expert by their intermediate width, the vocabulary by rows. A
layer's partial outputs are summed by :func:`all_reduce`; the logits a step reads are joined by
:func:`gather_vocabulary`. Every rank receives the same sums, so every rank's host logic decides the same.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorShard:
    """Rank ``rank`` of ``size`` (size 1: the whole model, no collective)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not one of tensor_parallel_size={self.size} ranks")

    @property
    def is_split(self) -> bool:
        return self.size > 1

    def split(self, total: int, what: str) -> int:
        """One rank's part of ``total`` (heads, an intermediate width); refused when it does not divide."""
        if total % self.size:
            raise ValueError(f"tensor_parallel_size={self.size} does not divide the model's {what} ({total}); "
                             f"choose a size that divides it")
        return total // self.size

    def split_kv_heads(self, kv_heads: int) -> int:
        """One rank's key/value heads. With fewer key/value heads than ranks, each rank keeps the one its query
        heads read (replicated over ``size / kv_heads`` ranks), so the size must be a multiple of them."""
        if kv_heads % self.size == 0:
            return kv_heads // self.size
        if self.size % kv_heads == 0:
            warnings.warn(f"tensor_parallel_size={self.size} over {kv_heads} key/value head(s): each is replicated "
                          f"on the {self.size // kv_heads} ranks whose query heads read it", stacklevel=2)
            return 1
        raise ValueError(f"tensor_parallel_size={self.size} neither divides the model's {kv_heads} key/value heads "
                         f"nor is a multiple of them (which would replicate each over the ranks that read it)")

    def vocabulary_rows(self, vocab_size: int) -> int:
        """Vocabulary rows each rank holds: the vocabulary split evenly, the last rank's share padded with zeros."""
        return -(-vocab_size // self.size)


WHOLE = TensorShard()  # the whole model on one device


@dataclass
class Traffic:
    """Bytes this process's eager collectives sent or received since :meth:`reset` (one rank's view)."""

    all_reduce_bytes: int = 0
    all_gather_bytes: int = 0
    calls: int = 0

    def reset(self) -> None:
        self.all_reduce_bytes = self.all_gather_bytes = self.calls = 0

    @property
    def total_bytes(self) -> int:
        return self.all_reduce_bytes + self.all_gather_bytes


TRAFFIC = Traffic()


def all_reduce(x: torch.Tensor, shard: TensorShard) -> torch.Tensor:
    """``x`` summed over the ranks, in place (every rank gets the same sum); ``x`` itself when not split."""
    if not shard.is_split:
        return x
    if not torch.compiler.is_compiling():
        TRAFFIC.all_reduce_bytes += x.numel() * x.element_size()
        TRAFFIC.calls += 1
    dist.all_reduce(x)
    return x


def all_reduce_max(x: torch.Tensor, shard: TensorShard) -> torch.Tensor:
    """``x``'s elementwise maximum over the ranks, in place; ``x`` itself when not split."""
    if not shard.is_split:
        return x
    if not torch.compiler.is_compiling():
        TRAFFIC.all_reduce_bytes += x.numel() * x.element_size()
        TRAFFIC.calls += 1
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def all_gather(x: torch.Tensor, shard: TensorShard) -> list[torch.Tensor]:
    """Every rank's ``x`` (of one shape on every rank), in rank order, on every rank."""
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(shard.size)]
    if not torch.compiler.is_compiling():
        TRAFFIC.all_gather_bytes += x.numel() * x.element_size() * (shard.size - 1)
        TRAFFIC.calls += 1
    dist.all_gather(pieces, x)
    return pieces


def gather_vocabulary(local: torch.Tensor, shard: TensorShard, vocab_size: int) -> torch.Tensor:
    """Every rank's vocabulary columns ``[..., rows]`` joined into ``[..., vocab_size]`` on every rank."""
    if not shard.is_split:
        return local
    return torch.cat(all_gather(local, shard), dim=-1)[..., :vocab_size]
