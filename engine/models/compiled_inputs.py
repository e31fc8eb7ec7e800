"""The inputs of a compiled forward (``engine.models.compiled``), held in buffers preallocated per graph.

Each bucketed shape (kind, rows, length, keys) gets one set of input tensors the first time it runs:
token ids, positions, the key mask, the keys' positions (block-causal windows) and the cache
columns and slots its keys and values are written to. Every later step of that shape refills the same
tensors in place, so the graph sees the same addresses and shapes at every call. That is the static-shape
contract a captured graph needs to replay a bucket without recording it again.

With exact shapes (``engine.models.compiled_shapes``, the CPU) each forward gets new tensors of its own
shape instead: there is no graph to replay, and keeping one set per shape would hold one for every width.
The compiled forward runs each part's whole box (rows x length), never a packed count of real tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BucketInputs:
    """One graph's input buffers (``[rows, length]`` or ``[rows, keys]``), refilled at every step."""

    tokens: torch.Tensor
    positions: torch.Tensor
    key_mask: torch.Tensor  # bool
    key_positions: torch.Tensor | None  # block-causal windows: the positions of the context's columns
    write_slots: torch.Tensor | None  # [rows, 1] cache slot of each row (None: the part writes no cache)
    write_columns: torch.Tensor | None  # cache column of each token (the scratch column for padding)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The buffers that exist, in field order."""
        return tuple(t for t in (self.tokens, self.positions, self.key_mask, self.key_positions,
                                 self.write_slots, self.write_columns) if t is not None)


@dataclass
class StaticInputs:
    """Every bucket's :class:`BucketInputs`, keyed by ``(kind, rows, length, keys, writes, positional)``."""

    buckets: dict[tuple, BucketInputs]

    def get(self, key: tuple, device: torch.device) -> BucketInputs:
        """The buffers of ``key``'s graph, allocated on first use."""
        inputs = self.buckets.get(key)
        if inputs is None:
            inputs = self.buckets[key] = allocate(key, device)
        return inputs


def allocate(key: tuple, device: torch.device) -> BucketInputs:
    """New input tensors of the shape ``key`` (``(kind, rows, length, keys, writes, positional)``):
    ``positional`` when the part's mask reads its keys' positions (``PartAttention.mask_reads_positions``).
    A window's write slots are its rows' slots ``[0, rows)`` at every step: filled here, once."""
    kind, rows, length, keys, writes, positional = key
    long = {"dtype": torch.long, "device": device}
    inputs = BucketInputs(
        tokens=torch.zeros(rows, length, **long), positions=torch.zeros(rows, length, **long),
        key_mask=torch.zeros(rows, keys, dtype=torch.bool, device=device),
        key_positions=torch.zeros(rows, keys, **long) if positional and kind == "window" else None,
        write_slots=torch.zeros(rows, 1, **long) if writes else None,
        write_columns=torch.zeros(rows, length, **long) if writes else None)
    if writes and kind == "window":
        inputs.write_slots[:, 0] = torch.arange(rows, device=device)
    return inputs


def fill(buffer: torch.Tensor, tensor: torch.Tensor, value, left: int = 0) -> torch.Tensor:
    """``buffer`` ``[R, W]`` holds ``tensor`` ``[r, n]`` at rows ``[0, r)`` and columns ``[left, left + n)``
    and ``value`` everywhere else; returns ``buffer``."""
    rows, width = tensor.shape
    if rows != buffer.shape[0] or width != buffer.shape[1]:
        buffer.fill_(value)
    buffer[:rows, left:left + width].copy_(tensor)
    return buffer
