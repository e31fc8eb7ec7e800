"""Per-request logit processing, batched: logit bias, and top-k / top-p filtering of sampled rows.

Every function takes the rows of a step that use a setting, with that setting per row as a tensor, and
computes each row from its own logits only (sorts, softmaxes and cumulative sums along the vocabulary),
so a row's result does not depend on the batch: batched decoding still equals solo decoding.

* logit bias (OpenAI's ``logit_bias``): added to the row's logits before anything else, so the
  candidate, its confidence and the sampled token all see the biased distribution.
* top-k / top-p (sampled rows only; greedy's argmax is always kept by both): on the temperature-scaled
  logits, keep the ``k`` largest (ties with the k-th kept too), then the smallest prefix, largest first,
  whose probability reaches ``p`` (renormalized over what top-k kept); every other token gets -inf, so
  the Gumbel-max draw samples from the renormalized rest. The confidence that decides which positions
  commit stays the model's (biased) probability of the candidate.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

TOP_K_OFF, TOP_P_OFF = 0, 1.0


@dataclass(frozen=True)
class TokenFilters:
    """Top-k / top-p for the sampled rows of a step (aligned with ``Sampling.rows``)."""

    top_k: torch.Tensor  # [k] int64, 0: off
    top_p: torch.Tensor  # [k] float, 1.0: off


@dataclass(frozen=True)
class RowBias:
    """Logit bias for the rows of a step that have one."""

    rows: torch.Tensor  # [b] row indices
    values: torch.Tensor  # [b, vocab]


def dense_bias(biases: Sequence[Mapping[int, float]], vocab_size: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """[rows, vocab] bias rows from ``{token id: bias}`` maps (a host-side build, one copy)."""
    dense = torch.zeros((len(biases), vocab_size), dtype=dtype)
    for row, bias in enumerate(biases):
        if bias:
            dense[row, list(bias)] = torch.tensor(list(bias.values()), dtype=dtype)
    return dense.to(device, non_blocking=True)


def apply_logit_bias(logits: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """logits [rows, block, vocab] with ``bias`` [len(rows), vocab] added to ``rows`` (in place)."""
    logits[rows] += bias.to(logits.dtype)[:, None, :]
    return logits


def filter_top_k_top_p(scaled: torch.Tensor, filters: TokenFilters) -> torch.Tensor:
    """scaled [k, block, vocab] with tokens outside each row's top-k, then top-p, set to -inf."""
    ordered = scaled.sort(dim=-1, descending=True, stable=True).values
    vocab = scaled.shape[-1]
    k = torch.where(filters.top_k > 0, filters.top_k.clamp(max=vocab), vocab)
    kth = ordered.gather(-1, (k - 1)[:, None, None].expand(*ordered.shape[:2], 1))
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    probabilities = torch.softmax(ordered, dim=-1)
    mass_before = probabilities.cumsum(dim=-1) - probabilities
    p = filters.top_p.to(scaled.dtype)[:, None, None]
    kept = (mass_before < p) & (ordered > float("-inf"))
    kept[..., 0] = True  # the most likely token always survives
    smallest_kept = ordered.masked_fill(~kept, float("inf")).amin(dim=-1, keepdim=True)
    return scaled.masked_fill(scaled < smallest_kept, float("-inf"))
