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
    """logits [rows, block, vocab] with ``bias`` [len(rows), vocab] added to ``rows`` (a new tensor: the
    caller's logits stay the model's)."""
    added = bias.to(logits.dtype)[:, None, :].expand(-1, logits.shape[1], -1)
    return logits.index_add(0, rows, added)


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


# -- log-probabilities -------------------------------------------------------------------------------
MAX_TOP_LOGPROBS = 20  # OpenAI's own limit


def token_logprobs(logits: torch.Tensor, mask_id: int | None, tokens: torch.Tensor, num_top: int,
                   bias: torch.Tensor | None = None):
    """Log-probabilities under the model's distribution over every token but MASK (never a candidate),
    with the row's logit bias and without temperature, top-k or top-p. ``mask_id`` None: over every token
    (DiffusionGemma's canvas starts from random tokens and may sample any).

    logits [r, block, vocab] (not modified); tokens [r, block]; bias [r, vocab] or None.
    Returns (of ``tokens`` [r, block], the ``num_top`` largest [r, block, num_top], their ids).
    """
    scores = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)[:, None, :]
    if mask_id is not None:
        scores = scores.index_fill(-1, torch.tensor([mask_id], device=scores.device), float("-inf"))
    logprobs = torch.log_softmax(scores, dim=-1)
    chosen = logprobs.gather(-1, tokens[..., None]).squeeze(-1)
    top = logprobs.topk(num_top, dim=-1) if num_top else None
    empty = logprobs.new_zeros((*tokens.shape, 0))
    return chosen, (top.values if top else empty), (top.indices if top else empty.long())


class LogprobBuffer:
    """Each slot's active block: the log-probabilities of its positions, written at the step each was
    committed, read once the block completes. Allocated on first use (no cost for other requests)."""

    def __init__(self, slots: int, block_length: int, device: torch.device):
        shape = (slots, block_length)
        self.chosen = torch.zeros(shape, dtype=torch.float64, device=device)
        self.top_values = torch.zeros((*shape, MAX_TOP_LOGPROBS), dtype=torch.float64, device=device)
        self.top_ids = torch.zeros((*shape, MAX_TOP_LOGPROBS), dtype=torch.long, device=device)

    def move(self, moves: Sequence[tuple[int, int]]) -> None:
        """Follow rows the persistent batch moved to another slot mid-block (``(from, to)`` pairs)."""
        for source, target in moves:
            for buffer in (self.chosen, self.top_values, self.top_ids):
                buffer[target] = buffer[source]

    def write(self, slots: torch.Tensor, offsets: torch.Tensor, commit: torch.Tensor, chosen: torch.Tensor,
              top_values: torch.Tensor, top_ids: torch.Tensor) -> None:
        """Record the positions ``commit`` [q] marks among the block positions ``(slots, offsets)`` [q]."""
        num_top = top_values.shape[-1]
        self.chosen[slots, offsets] = torch.where(commit, chosen.to(torch.float64), self.chosen[slots, offsets])
        keep = commit[:, None]
        self.top_values[slots, offsets, :num_top] = torch.where(keep, top_values.to(torch.float64),
                                                                self.top_values[slots, offsets, :num_top])
        self.top_ids[slots, offsets, :num_top] = torch.where(keep, top_ids, self.top_ids[slots, offsets, :num_top])
