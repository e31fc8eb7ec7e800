"""What every block rule reads: each computed position's candidate token and its confidence.

:func:`propose_tokens` turns logits ``[positions, 1, vocab]`` (or a block's ``[rows, block, vocab]``) into a
candidate per position, MASK never among them, and the score a rule ranks positions by. Rows that sample
(temperature > 0) draw their candidates with counter-based Gumbel noise (:func:`gumbel_noise`), a pure
function of (seed, step, position, token), so a row's draws do not depend on the batch it runs in.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.runner.logit_processors import RowBias, TokenFilters, apply_logit_bias, filter_top_k_top_p

_HASH_MULTIPLIER = 0x45D9F3B
_UINT32 = 0xFFFFFFFF
_ENTROPY_EPSILON = 1e-10  # Dream's: log(p + eps) keeps p = 0 finite


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (int64 tensors holding values < 2**32)."""
    x = ((x >> 16) ^ x) * _HASH_MULTIPLIER & _UINT32
    x = ((x >> 16) ^ x) * _HASH_MULTIPLIER & _UINT32
    return (x >> 16) ^ x


NOISE_CHUNK_ELEMENTS = 1 << 22  # int64 hash temporaries are built this many (position, token) pairs at a time


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, positions: torch.Tensor,
                 vocab_size: int) -> torch.Tensor:
    """Counter-based Gumbel noise ``[rows, block, vocab]`` in float32.

    The noise of a (request seed, denoising step, canvas position, token) is a pure function of those
    four numbers, so it does not depend on which other requests share the batch.
    seeds/steps: [rows]; positions: [rows, block] (position within the request's canvas).
    The integer hashing runs over chunks of positions, so its int64 temporaries stay within
    ``NOISE_CHUNK_ELEMENTS`` elements each however many rows sample (LLaDA's vocabulary is 126k).
    """
    vocab = _hash32(torch.arange(vocab_size, device=positions.device, dtype=torch.int64) + 0x9E3779B9 & _UINT32)
    keys = _hash32(_hash32((seeds & _UINT32)[:, None] ^ _hash32(steps[:, None] & _UINT32)) ^ positions)
    flat_keys = keys.reshape(-1)
    noise = torch.empty((flat_keys.shape[0], vocab_size), dtype=torch.float32, device=positions.device)
    chunk = max(1, NOISE_CHUNK_ELEMENTS // vocab_size)
    for start in range(0, flat_keys.shape[0], chunk):
        bits = _hash32(flat_keys[start:start + chunk, None] ^ vocab)
        uniform = ((bits >> 8).to(torch.float32) + 0.5) / 2.0**24  # 24 bits: exact in float32, never 0 or 1
        noise[start:start + chunk] = -torch.log(-torch.log(uniform))
    return noise.view(*positions.shape, vocab_size)


@dataclass(frozen=True)
class Sampling:
    """The rows of a step that sample (temperature > 0), with their noise."""

    rows: torch.Tensor  # [k] row indices
    temperatures: torch.Tensor  # [k]
    noise: torch.Tensor  # [k, block, vocab] from :func:`gumbel_noise`
    filters: TokenFilters | None = None  # top-k / top-p of these rows (None: no row asks for them)


def propose_tokens(logits: torch.Tensor, mask_id: int, sampling: Sampling | None = None,
                   measure: str = "probability", bias: RowBias | None = None):
    """Candidate token ``x0`` and its confidence per position.

    logits [rows, block, vocab] (not modified). MASK is never a candidate.
    Confidence (``measure``), always noise-free and over the full softmax, MASK included:
    "probability" of the candidate; "margin": top-1 minus top-2 probability; "neg_entropy":
    ``sum p log(p + 1e-10)`` (0 for a certain position, lower the flatter the distribution).
    One softmax over the logits gives every greedy row both its candidate (the largest probability
    but MASK's) and its confidence; sampled rows draw their candidate from their own scaled logits.
    """
    compute_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if bias is not None:  # before everything: candidates, confidence and draws see the biased logits
        logits = apply_logit_bias(logits.to(compute_dtype), bias.rows, bias.values)
    probabilities = torch.softmax(logits, dim=-1, dtype=compute_dtype)
    scores = None if measure == "probability" else distribution_scores(probabilities, measure)
    probabilities.select(-1, mask_id).fill_(-1.0)  # below every probability: never the candidate
    confidence, candidates = probabilities.max(dim=-1)
    if sampling is not None:
        scaled = logits[sampling.rows].to(compute_dtype) / sampling.temperatures.to(compute_dtype)[:, None, None]
        scaled.select(-1, mask_id).fill_(float("-inf"))
        if sampling.filters is not None:
            scaled = filter_top_k_top_p(scaled, sampling.filters)
        drawn = (scaled + sampling.noise).argmax(dim=-1)
        candidates[sampling.rows] = drawn
        confidence[sampling.rows] = probabilities[sampling.rows].gather(-1, drawn[..., None]).squeeze(-1)
    return candidates, (confidence if scores is None else scores)


def distribution_scores(probabilities: torch.Tensor, measure: str) -> torch.Tensor:
    """Dream's two distribution-shape scores ``[rows, block]`` of probabilities ``[rows, block, vocab]``."""
    if measure == "margin":
        top_two = probabilities.topk(2, dim=-1).values
        return top_two[..., 0] - top_two[..., 1]
    if measure == "neg_entropy":
        return (probabilities * torch.log(probabilities + _ENTROPY_EPSILON)).sum(dim=-1)
    raise ValueError(f"unknown confidence measure {measure!r}; known: probability, margin, neg_entropy")
