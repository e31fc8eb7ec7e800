"""A greedy step's candidates from a split vocabulary, without joining the logits.

A rule that ranks positions by the candidate's probability needs, per position, the most probable token but
MASK and that probability over the whole vocabulary. Each rank computes both over its own columns (its best
logit and token, and the log-sum-exp of all its logits); one all-gather of those three numbers per position
replaces the all-gather of ``[positions, vocab / N]`` logits. The ranks' best tokens are compared in rank order,
so a tie goes to the lowest id, as one argmax over the whole vocabulary does.
"""
from __future__ import annotations

import torch

from engine.parallel.shard import TensorShard, all_gather


def split_candidates(local_logits: torch.Tensor, shard: TensorShard, first: int, vocab_size: int,
                     mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates and their probabilities ``[...]`` from this rank's logits ``[..., rows]`` over ids
    ``first .. first + rows`` (ids past ``vocab_size`` are the last rank's padding)."""
    compute_dtype = torch.float64 if local_logits.dtype == torch.float64 else torch.float32
    logits = local_logits.to(compute_dtype)
    real = vocab_size - first
    if real < logits.shape[-1]:
        logits = logits.clone()
        logits[..., max(real, 0):] = float("-inf")
    log_total = torch.logsumexp(logits, dim=-1)  # MASK included: the probabilities are over every token
    if first <= mask_id < first + logits.shape[-1]:
        logits = logits.clone()
        logits[..., mask_id - first] = float("-inf")
    best, index = logits.max(dim=-1)
    state = torch.stack([best, (index + first).to(compute_dtype), log_total], dim=-1)
    joined = torch.stack(all_gather(state, shard))  # [ranks, ..., 3]
    winner = joined[..., 0].argmax(dim=0, keepdim=True)  # the first rank holding the largest logit
    best = joined[..., 0].gather(0, winner).squeeze(0)
    tokens = joined[..., 1].gather(0, winner).squeeze(0).to(torch.int64)
    return tokens, torch.exp(best - torch.logsumexp(joined[..., 2], dim=0))
