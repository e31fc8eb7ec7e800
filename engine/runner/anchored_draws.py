"""How an anchored row draws its tokens: the argmax, or at a temperature a Gumbel-max draw keyed by position.

A greedy row takes each position's most likely token but MASK. A row with ``temperature > 0`` scales its
logits, keeps its ``top_k`` / ``top_p`` tokens (``engine.runner.logit_processors``) and adds counter-based
Gumbel noise (``engine.rules.proposals.gumbel_noise``), a pure function of its seed, a draw counter and the
position the token is for. So a row draws as it would alone, in any batch. A next-token draw (a store's, an
autoregressive step's, a verify's) is keyed by the position it predicts and draw 0: a verified speculative
token is drawn with the noise its autoregressive step would use, from the same distribution, so sampled
``linear_spec`` gives sampled ``autoregressive``'s tokens too. A denoising or drafting step's candidates use
the row's own count of such steps, from 1.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import SamplingParams
from engine.rules.proposals import Sampling, gumbel_noise
from engine.runner.logit_processors import TokenFilters, filter_top_k_top_p


def _filters(params: Sequence[SamplingParams], device: torch.device) -> TokenFilters | None:
    if not any(p.filters_tokens for p in params):
        return None
    return TokenFilters(top_k=torch.tensor([p.top_k for p in params], device=device),
                        top_p=torch.tensor([p.top_p for p in params], device=device))


def greedy_tokens(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Each position's most likely token but MASK, ``[positions]`` from ``[positions, vocab]`` (any rows')."""
    scores = logits.clone()
    scores[:, mask_id] = float("-inf")
    return scores.argmax(dim=-1)


def sampled_tokens(logits: torch.Tensor, mask_id: int, params: SamplingParams, seed: int,
                   positions: torch.Tensor) -> torch.Tensor:
    """One sampled row's next tokens ``[positions]`` from its logits ``[positions, vocab]``; ``positions``:
    the position each token is for."""
    scores = logits.clone()
    scores[:, mask_id] = float("-inf")
    scaled = scores / params.temperature
    filters = _filters([params], logits.device)
    if filters is not None:
        scaled = filter_top_k_top_p(scaled[None], filters)[0]
    seeds = torch.tensor([seed], device=logits.device)
    noise = gumbel_noise(seeds, torch.zeros_like(seeds), positions[None], logits.shape[-1])[0]
    return (scaled + noise.to(scaled.dtype)).argmax(dim=-1)


def block_sampling(params: Sequence[SamplingParams], seeds: Sequence[int], draws: Sequence[int],
                   positions: torch.Tensor, vocab_size: int) -> Sampling | None:
    """The sampled rows of a stack of blocks (``positions`` ``[rows, block]``: each position's), for
    :func:`engine.rules.proposals.propose_tokens`; None when every row is greedy."""
    rows = [index for index, p in enumerate(params) if p.temperature > 0]
    if not rows:
        return None
    device = positions.device
    index = torch.tensor(rows, device=device)
    chosen = [params[row] for row in rows]
    noise = gumbel_noise(torch.tensor([seeds[row] for row in rows], device=device),
                         torch.tensor([draws[row] for row in rows], device=device), positions[index], vocab_size)
    return Sampling(rows=index, temperatures=torch.tensor([p.temperature for p in chosen], device=device),
                    noise=noise, filters=_filters(chosen, device))
