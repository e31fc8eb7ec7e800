"""One denoising step as pure, batched tensor functions.

Everything here works on the active blocks of a batch: ``[rows, block_length]`` tensors (and the
``[rows, block_length, vocab]`` logits of exactly those positions). Rows are independent: nothing a
row computes depends on another row, which is what makes batched decoding equal solo decoding.

Rules (Fast-dLLM / LLaDA):
* ``threshold``: commit every masked position whose confidence is >= tau, and always the single most
  confident masked position, so each step makes progress.
* ``quota``: LLaDA's low-confidence remasking with S steps per block; step k commits the k-th share of
  the block's masks (masks split evenly, the remainder going to the first steps), most confident first.
* ``factor``: with masked confidences sorted c_1 >= c_2 >= ..., commit the largest prefix n such that
  (n + 1)(1 - c_n) < f, and at least one.
A step cap (``steps_per_block``) commits whatever is still masked at the cap's last step, so a block
always ends.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_HASH_MULTIPLIER = 0x45D9F3B
_UINT32 = 0xFFFFFFFF


@dataclass(frozen=True)
class DecodeRule:
    kind: str  # "threshold" | "quota" | "factor"
    threshold: float = 0.9
    factor: float = 1.0
    steps_per_block: int | None = None


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (int64 tensors holding values < 2**32)."""
    x = ((x >> 16) ^ x) * _HASH_MULTIPLIER & _UINT32
    x = ((x >> 16) ^ x) * _HASH_MULTIPLIER & _UINT32
    return (x >> 16) ^ x


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, positions: torch.Tensor,
                 vocab_size: int) -> torch.Tensor:
    """Counter-based Gumbel noise ``[rows, block, vocab]`` in float64.

    The noise of a (request seed, denoising step, canvas position, token) is a pure function of those
    four numbers, so it does not depend on which other requests share the batch.
    seeds/steps: [rows]; positions: [rows, block] (position within the request's canvas).
    """
    vocab = torch.arange(vocab_size, device=positions.device, dtype=torch.int64)
    key = _hash32((seeds & _UINT32)[:, None] ^ _hash32(steps[:, None] & _UINT32))
    key = _hash32(key ^ positions)[..., None]
    bits = _hash32(key ^ _hash32(vocab + 0x9E3779B9 & _UINT32))
    uniform = (bits.to(torch.float64) + 0.5) / 2.0**32
    return -torch.log(-torch.log(uniform))


def propose_tokens(logits: torch.Tensor, temperatures: torch.Tensor, noise: torch.Tensor | None):
    """Candidate token ``x0`` and its confidence (softmax probability, noise-free) per position.

    logits [rows, block, vocab]; temperatures [rows]; noise as from :func:`gumbel_noise` or None when
    every row is greedy.
    """
    compute_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(compute_dtype)
    candidates = logits.argmax(dim=-1)
    if noise is not None:
        sampled_rows = temperatures > 0
        scaled = logits.double() / temperatures.clamp(min=1e-6).double()[:, None, None] + noise
        candidates = torch.where(sampled_rows[:, None], scaled.argmax(dim=-1), candidates)
    chosen = logits.gather(-1, candidates[..., None]).squeeze(-1)
    confidence = torch.exp(chosen - torch.logsumexp(logits, dim=-1))
    return candidates, confidence


def quota_for_step(num_masked_at_start: torch.Tensor, step: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to commit at ``step`` (0-based) of a block: an even split, remainder first."""
    base, remainder = num_masked_at_start // steps, num_masked_at_start % steps
    return base + (step < remainder).long()


def _rank_by_confidence(confidence: torch.Tensor, masked: torch.Tensor):
    """Ranks (0 = most confident) of masked positions; ties go to the leftmost position."""
    scores = torch.where(masked, confidence, torch.full_like(confidence, -1.0))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    sorted_scores = scores.gather(-1, order)
    return ranks, sorted_scores


def select_commits(rule: DecodeRule, confidence: torch.Tensor, masked: torch.Tensor,
                   step: torch.Tensor, num_masked_at_start: torch.Tensor) -> torch.Tensor:
    """Which masked positions to commit now: bool ``[rows, block]``.

    step [rows]: 0-based denoising step within the current block; num_masked_at_start [rows].
    Rows without masks commit nothing.
    """
    ranks, sorted_scores = _rank_by_confidence(confidence, masked)
    if rule.kind == "threshold":
        commit = masked & ((confidence >= rule.threshold) | (ranks == 0))
    elif rule.kind == "quota":
        quota = quota_for_step(num_masked_at_start, step, rule.steps_per_block)
        commit = masked & (ranks < quota[:, None])
    elif rule.kind == "factor":
        counts = torch.arange(1, masked.shape[-1] + 1, device=masked.device, dtype=confidence.dtype)
        passes = (counts + 1) * (1 - sorted_scores) < rule.factor
        passes[:, 0] = True
        prefix = passes.long().cumprod(dim=-1).sum(dim=-1)
        commit = masked & (ranks < prefix[:, None])
    else:
        raise ValueError(f"unknown decoding rule {rule.kind!r}")
    if rule.steps_per_block is not None:
        at_cap = (step + 1 >= rule.steps_per_block)[:, None]
        commit = commit | (masked & at_cap)
    return commit
