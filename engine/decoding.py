"""One denoising step as pure, batched tensor functions.

Everything here works on the active blocks of a batch: ``[rows, block_length]`` tensors (and the
``[rows, block_length, vocab]`` logits of exactly those positions). Rows are independent: nothing a
row computes depends on another row, which is what makes batched decoding equal solo decoding.

Rules (Fast-dLLM / LLaDA):
* ``threshold``: commit every masked position whose confidence is >= tau, and always the single most
  confident masked position, so each step makes progress.
* ``quota``: LLaDA's low-confidence remasking with S steps per block; step k commits the k-th share of
  the block's masks (masks split evenly, the remainder going to the first steps), most confident first.
* ``factor`` (Fast-dLLM's ``get_transfer_index_dynamic``): with masked confidences sorted
  c_1 >= c_2 >= ... >= c_m, rank n passes when c_n >= 1 - f / (n + 1) (rank 1 always passes); commit
  the ranks before the first one that fails, except that when only the last-ranked one fails (or none
  does) all m are committed, so the last two masks of a block always go together.
* ``factor_prefix`` (the paper's statement of the rule): commit the largest prefix n with
  (n + 1)(1 - c_n) < f, and at least one.
A family with shifted logits decoded as Fast-dLLM does (``first_step_first_position``) commits only the
block's first position at a block's first step, whatever the rule.
Every rule ends: MASK is never a candidate token, each step commits at least one position, and the
last allowed step (``steps_per_block``, or ``block_length`` at most) commits whatever is still masked,
each with its best non-MASK token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_HASH_MULTIPLIER = 0x45D9F3B
_UINT32 = 0xFFFFFFFF


@dataclass(frozen=True)
class DecodeRule:
    kind: str  # "threshold" | "quota" | "factor" | "factor_prefix"
    threshold: float = 0.9
    factor: float = 1.0
    steps_per_block: int | None = None
    first_step_first_position: bool = False


def decode_rule(config, logit_shift: int) -> DecodeRule:
    """The rule an engine config asks for, on a family with this logit shift."""
    return DecodeRule(config.decoding, config.threshold, config.factor, config.steps_per_block,
                      first_step_first_position=logit_shift > 0 and config.shifted_decoding == "fast-dllm")


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (int64 tensors holding values < 2**32)."""
    x = ((x >> 16) ^ x) * _HASH_MULTIPLIER & _UINT32
    x = ((x >> 16) ^ x) * _HASH_MULTIPLIER & _UINT32
    return (x >> 16) ^ x


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, positions: torch.Tensor,
                 vocab_size: int) -> torch.Tensor:
    """Counter-based Gumbel noise ``[rows, block, vocab]`` in float32.

    The noise of a (request seed, denoising step, canvas position, token) is a pure function of those
    four numbers, so it does not depend on which other requests share the batch.
    seeds/steps: [rows]; positions: [rows, block] (position within the request's canvas).
    """
    vocab = torch.arange(vocab_size, device=positions.device, dtype=torch.int64)
    key = _hash32((seeds & _UINT32)[:, None] ^ _hash32(steps[:, None] & _UINT32))
    key = _hash32(key ^ positions)[..., None]
    bits = _hash32(key ^ _hash32(vocab + 0x9E3779B9 & _UINT32))
    uniform = ((bits >> 8).to(torch.float32) + 0.5) / 2.0**24  # 24 bits: exact in float32, never 0 or 1
    return -torch.log(-torch.log(uniform))


@dataclass(frozen=True)
class Sampling:
    """The rows of a step that sample (temperature > 0), with their noise."""

    rows: torch.Tensor  # [k] row indices
    temperatures: torch.Tensor  # [k]
    noise: torch.Tensor  # [k, block, vocab] from :func:`gumbel_noise`


def propose_tokens(logits: torch.Tensor, mask_id: int, sampling: Sampling | None = None):
    """Candidate token ``x0`` and its confidence (softmax probability, noise-free) per position.

    logits [rows, block, vocab], overwritten in place (MASK's column). MASK is never a candidate; the
    confidence of a candidate is its probability under the full softmax, MASK included.
    """
    compute_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(compute_dtype)
    log_normalizer = torch.logsumexp(logits, dim=-1)
    logits[..., mask_id] = float("-inf")
    candidates = logits.argmax(dim=-1)
    if sampling is not None:
        scaled = logits[sampling.rows] / sampling.temperatures.to(compute_dtype)[:, None, None] + sampling.noise
        candidates[sampling.rows] = scaled.argmax(dim=-1)
    chosen = logits.gather(-1, candidates[..., None]).squeeze(-1)
    return candidates, torch.exp(chosen - log_normalizer)


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
    Rows without masks commit nothing. At the last allowed step every masked position commits.
    """
    ranks, sorted_scores = _rank_by_confidence(confidence, masked)
    if rule.kind == "threshold":
        commit = masked & ((confidence >= rule.threshold) | (ranks == 0))
    elif rule.kind == "quota":
        quota = quota_for_step(num_masked_at_start, step, rule.steps_per_block)
        commit = masked & (ranks < quota[:, None])
    elif rule.kind == "factor":
        commit = masked & (ranks < _fast_dllm_factor_count(sorted_scores, masked.sum(-1), rule.factor)[:, None])
    elif rule.kind == "factor_prefix":
        counts = torch.arange(1, masked.shape[-1] + 1, device=masked.device, dtype=confidence.dtype)
        passes = (counts + 1) * (1 - sorted_scores) < rule.factor
        passes[:, 0] = True
        prefix = passes.long().cumprod(dim=-1).sum(dim=-1)
        commit = masked & (ranks < prefix[:, None])
    else:
        raise ValueError(f"unknown decoding rule {rule.kind!r}")
    if rule.first_step_first_position:
        first_only = torch.zeros_like(masked)
        first_only[:, 0] = masked[:, 0]
        commit = torch.where((step == 0)[:, None], first_only, commit)
    last_step = rule.steps_per_block or masked.shape[-1]
    return commit | (masked & (step + 1 >= last_step)[:, None])


def _fast_dllm_factor_count(sorted_scores: torch.Tensor, num_masked: torch.Tensor, factor: float) -> torch.Tensor:
    """[rows] how many of the top-ranked masks Fast-dLLM's factor rule commits (see the module docstring)."""
    length = sorted_scores.shape[-1]
    ranks = torch.arange(1, length + 1, device=sorted_scores.device, dtype=torch.float64)
    thresholds = 1 - factor / (ranks + 1)
    thresholds[0] = -1.0
    index = torch.arange(length, device=sorted_scores.device)
    fails = (sorted_scores.to(torch.float64) < thresholds) & (index < num_masked[:, None])
    first_fail = torch.where(fails, index, length).amin(-1)
    return torch.where(first_fail >= num_masked - 1, num_masked, first_fail)
