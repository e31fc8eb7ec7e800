"""The vocabulary split by rows over the ranks: each rank embeds the ids in its rows and computes their logits.

An id outside a rank's rows embeds as zeros there, so the all-reduce of the embeddings is exact (one rank adds
the row, the others add zeros). Logits are joined by an all-gather; a step reads few positions, so that is
``[positions, vocab]`` once per step. The last rank's rows past the vocabulary are zeros and are cut away. Each
layer's weight loader takes its rows of the checkpoint's ``[vocab, hidden]`` tensor, zeros past the vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.loading import WeightSlot, copy_weight, padded_rows_share
from engine.parallel.shard import TensorShard, all_reduce, gather_vocabulary


class VocabularyRows(nn.Module):
    """One rank's rows of a ``[vocab, hidden]`` weight, and the loader that cuts them from the checkpoint's."""

    weight: nn.Parameter
    shard: TensorShard

    def weight_loader(self, target: torch.Tensor, full: torch.Tensor, name: str) -> None:
        """Copy rows ``first .. first + rows`` of checkpoint tensor ``name`` (``full``), zeros past the vocabulary."""
        copy_weight(target, padded_rows_share(full, self.weight.shape[0], self.shard), name)

    def weight_slots(self, name: str) -> dict[str, WeightSlot]:
        return {f"{name}.weight": WeightSlot(self.weight, self.weight_loader)}


class VocabularyEmbedding(VocabularyRows):
    """``nn.Embedding`` of one rank's vocabulary rows (``weight [rows, hidden]``), summed over the ranks."""

    def __init__(self, vocab_size: int, hidden_size: int, shard: TensorShard):
        super().__init__()
        self.shard, self.vocab_size = shard, vocab_size
        self.rows = shard.vocabulary_rows(vocab_size)
        self.first = shard.rank * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.first
        outside = (local < 0) | (local >= self.rows)
        embedded = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[..., None], 0)
        return all_reduce(embedded, self.shard)

    def share(self, full: torch.Tensor) -> torch.Tensor:
        """``full [..., vocab]`` (probabilities) cut to this rank's rows, padded with zeros past the vocabulary."""
        piece = full[..., self.first:self.first + self.rows]
        return F.pad(piece, (0, self.rows - piece.shape[-1])) if piece.shape[-1] < self.rows else piece


class VocabularyHead(VocabularyRows):
    """The LM head over one rank's vocabulary rows; the logits of every rank joined on each."""

    def __init__(self, hidden_size: int, vocab_size: int, shard: TensorShard):
        super().__init__()
        self.shard, self.vocab_size = shard, vocab_size
        self.weight = nn.Parameter(torch.empty(shard.vocabulary_rows(vocab_size), hidden_size))
        self.first = shard.rank * self.weight.shape[0]  # the id of this rank's first row

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return gather_vocabulary(self.local(hidden), self.shard, self.vocab_size)

    def local(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's columns of the logits, ``[..., rows]``: ids ``first`` on."""
        return F.linear(hidden, self.weight)


def tied_logits(embedding: nn.Module, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits ``[..., vocab_size]`` of a head tied to ``embedding`` (an ``nn.Embedding`` or this rank's
    :class:`VocabularyEmbedding`): every rank's vocabulary columns joined on each."""
    local = F.linear(hidden, embedding.weight)
    if not isinstance(embedding, VocabularyEmbedding):
        return local
    return gather_vocabulary(local, embedding.shard, vocab_size)


def weighted_embeddings(embedding: nn.Module, probabilities: torch.Tensor) -> torch.Tensor:
    """``probabilities [..., vocab] @ embeddings``: split, each rank's vocabulary rows weigh its own embeddings
    and the sum over the ranks is the whole product (no rank gathers the embedding)."""
    if not isinstance(embedding, VocabularyEmbedding):
        return torch.matmul(probabilities, embedding.weight)
    return all_reduce(torch.matmul(embedding.share(probabilities), embedding.weight), embedding.shard)


def embedding(vocab_size: int, hidden_size: int, shard: TensorShard) -> nn.Module:
    """``nn.Embedding`` on one device, else this rank's :class:`VocabularyEmbedding` (same ``weight`` name)."""
    if not shard.is_split:
        weight = torch.empty(vocab_size, hidden_size)
        if not weight.is_meta:  # nn.Embedding's own random fill; on the meta device the loader fills it (a meta
            nn.init.normal_(weight)  # fill would import torch._dynamo, over a second of a process's start)
        return nn.Embedding(vocab_size, hidden_size, _weight=weight)
    return VocabularyEmbedding(vocab_size, hidden_size, shard)


def head(hidden_size: int, vocab_size: int, shard: TensorShard) -> nn.Module:
    """A bias-free LM head on one device, else this rank's :class:`VocabularyHead` (same ``weight`` name)."""
    if not shard.is_split:
        return nn.Linear(hidden_size, vocab_size, bias=False)
    return VocabularyHead(hidden_size, vocab_size, shard)
