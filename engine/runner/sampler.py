"""The one sampler of the runners: logit bias, seeded draws, top-k / top-p, log-probabilities, split greedy.

Every runner turns a step's logits into tokens through a :class:`Sampler`, in this order:

1. **logit bias** (OpenAI's ``logit_bias``) is added first, in the compute dtype (float64 stays float64, any
   other dtype becomes float32), so candidates, confidences, draws and log-probabilities see one distribution;
2. **proposals**: a greedy position takes its most likely token but MASK; a sampled position (temperature > 0)
   scales its logits, keeps its top-k / top-p tokens and adds counter-based Gumbel noise, a pure function of
   (seed, step, position, token) (``engine.rules.proposals``), so a row draws as it would alone in any batch;
3. **log-probabilities** of the chosen tokens, with their most likely alternatives, under the biased logits
   without temperature or filters (``engine.runner.logit_processors.token_logprobs``);
4. **the split-vocabulary greedy path**: a tensor-parallel greedy step whose rule ranks by probability takes
   each position's candidate from every rank's best token without joining the logits
   (``engine.parallel.candidates``).

A block row's and an anchored row's denoising step propose with confidences (:meth:`Sampler.propose`); an
anchored store's or verify's next tokens need no confidence (:meth:`Sampler.greedy_tokens`,
:meth:`Sampler.sampled_tokens`). DiffusionGemma's canvas draws with its rule's own per-row generators, as
transformers' seeded ``generate`` does, and takes only bias and log-probabilities from here (``mask_id`` None:
its canvas may hold any token).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from engine.config import SamplingParams
from engine.parallel.candidates import split_candidates
from engine.parallel.shard import TensorShard
from engine.rules.proposals import Sampling, gumbel_noise, propose_tokens
from engine.runner.logit_processors import (
    RowBias,
    TokenFilters,
    apply_logit_bias,
    dense_bias,
    filter_top_k_top_p,
    token_logprobs,
)

Logprobs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (chosen, top values, top ids), token_logprobs'


def compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """The dtype a step's sampling runs in: float64 logits stay float64, any other becomes float32."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def token_filters(params: Sequence[SamplingParams], device: torch.device) -> TokenFilters | None:
    """Top-k / top-p of rows ``params`` (None: none of them filters)."""
    if not any(p.filters_tokens for p in params):
        return None
    return TokenFilters(top_k=torch.tensor([p.top_k for p in params], device=device),
                        top_p=torch.tensor([p.top_p for p in params], device=device))


def spans_bias(biases: Sequence[Mapping[int, float] | None], counts: Sequence[int], vocab_size: int,
               device: torch.device) -> RowBias | None:
    """The logit bias of every position of consecutive spans (``counts`` positions each) whose request has
    one (None: none has)."""
    biased = [index for index, bias in enumerate(biases) if bias]
    if not biased:
        return None
    firsts = [sum(counts[:index]) for index in biased]
    values = dense_bias([biases[index] for index in biased], vocab_size, torch.float64, device)
    repeats = torch.tensor([counts[index] for index in biased], device=device)
    rows = [first + offset for first, index in zip(firsts, biased) for offset in range(counts[index])]
    return RowBias(rows=torch.tensor(rows, dtype=torch.long, device=device),
                   values=values.repeat_interleave(repeats, dim=0))


@dataclass(frozen=True)
class Sampler:
    """Turns a step's logits into tokens, scores and log-probabilities, the same way for every runner."""

    mask_id: int | None  # never proposed, and outside the log-probabilities' distribution (None: any token)
    measure: str = "probability"  # the confidence a proposal carries (engine.rules.proposals.propose_tokens)

    def biased(self, logits: torch.Tensor, bias: RowBias | None) -> torch.Tensor:
        """``logits`` [rows, block, vocab] with ``bias`` added to its rows in the compute dtype (a new tensor);
        the logits themselves when no row has a bias."""
        if bias is None:
            return logits
        return apply_logit_bias(logits.to(compute_dtype(logits)), bias.rows, bias.values)

    @staticmethod
    def sampling(rows: torch.Tensor, temperatures: torch.Tensor, noise_keys: Sequence[torch.Tensor],
                 filters: TokenFilters | None, vocab_size: int) -> Sampling:
        """The draws of the sampled ``rows``: their temperatures, filters and Gumbel noise keyed by
        ``noise_keys`` (seeds [k], steps [k], positions [k, block]; ``engine.rules.proposals.gumbel_noise``)."""
        return Sampling(rows=rows, temperatures=temperatures, noise=gumbel_noise(*noise_keys, vocab_size),
                        filters=filters)

    def rows_sampling(self, params: Sequence[SamplingParams], seeds: Sequence[int], steps: Sequence[int],
                      positions: torch.Tensor, vocab_size: int) -> Sampling | None:
        """The draws of the rows of a stack of blocks that sample, from host settings (``steps``: each row's
        noise step; ``positions`` [rows, block]: each position's); None when every row is greedy."""
        rows = [index for index, p in enumerate(params) if p.temperature > 0]
        if not rows:
            return None
        device = positions.device
        index = torch.tensor(rows, device=device)
        chosen = [params[row] for row in rows]
        keys = (torch.tensor([seeds[row] for row in rows], device=device),
                torch.tensor([steps[row] for row in rows], device=device), positions[index])
        return self.sampling(index, torch.tensor([p.temperature for p in chosen], device=device), keys,
                             token_filters(chosen, device), vocab_size)

    def propose(self, logits: torch.Tensor, sampling: Sampling | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's candidate (drawn where ``sampling`` says) and its confidence, ``[rows, block]``
        each from logits ``[rows, block, vocab]``."""
        return propose_tokens(logits, self.mask_id, sampling, measure=self.measure)

    def greedy_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """Each position's most likely token but MASK, ``[positions]`` from ``[positions, vocab]``."""
        scores = logits.clone()
        scores[:, self.mask_id] = float("-inf")
        return scores.argmax(dim=-1)

    def sampled_tokens(self, logits: torch.Tensor, params: SamplingParams, seed: int, positions: torch.Tensor
                       ) -> torch.Tensor:
        """One sampled row's next tokens ``[positions]`` from its logits ``[positions, vocab]``, each drawn with
        noise step 0 at the position it is for (``positions``)."""
        scores = logits.clone()
        scores[:, self.mask_id] = float("-inf")
        scaled = scores / params.temperature
        filters = token_filters([params], logits.device)
        if filters is not None:
            scaled = filter_top_k_top_p(scaled[None], filters)[0]
        seeds = torch.tensor([seed], device=logits.device)
        noise = gumbel_noise(seeds, torch.zeros_like(seeds), positions[None], logits.shape[-1])[0]
        return (scaled + noise.to(scaled.dtype)).argmax(dim=-1)

    def logprobs(self, logits: torch.Tensor, tokens: torch.Tensor, num_top: int) -> Logprobs:
        """Of ``tokens`` [r, block] under logits [r, block, vocab] (already biased): their log-probabilities,
        and the ``num_top`` most likely tokens' log-probabilities and ids."""
        return token_logprobs(logits, self.mask_id, tokens, num_top)

    def split_greedy(self, local_logits: torch.Tensor, shard: TensorShard, first: int, vocab_size: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy candidates and their probabilities from this rank's logits over ids ``first ..``, joined
        across ranks without the logits (``engine.parallel.candidates``)."""
        return split_candidates(local_logits, shard, first, vocab_size, self.mask_id)
