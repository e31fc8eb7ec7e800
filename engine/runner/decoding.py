"""One denoising step as pure, batched tensor functions.

Everything here works on the active blocks of a batch: ``[rows, block_length]`` tensors. The logits
``[rows, n, vocab]`` that :func:`propose_tokens` reads may be a block's, or (the runner's) each masked
position as a row of one. Rows are independent: nothing a row computes depends on another row, which
is what makes batched decoding equal solo decoding.

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
* ``dream`` (Dream's ``diffusion_generate`` with ``alg`` maskgit_plus / topk_margin / entropy): S steps
  per block; with t_k > s_k consecutive points of ``linspace(1, eps, S + 1)``, step k commits
  ``int(m * (1 - s_k / t_k))`` of the m positions still masked (float32, truncated, so a step may commit
  nothing), highest score first, and the last step commits the rest. The score is Dream's measure:
  the candidate's probability (maskgit_plus), top-1 minus top-2 probability (topk_margin) or the negative
  entropy ``sum p log(p + 1e-10)`` (entropy), all over the full softmax, MASK included. Dream runs this
  over its whole canvas at once: one block of ``max_new_tokens``.
Rules of the block-causal families (SDAR, LLaDA2, SGLang):
* ``low_confidence`` (SGLang's ``LowConfidence``): commit every masked position whose confidence is
  strictly above tau, or, if none is, the single most confident one. This is ``threshold`` with ``>``.
* ``low_confidence_dynamic`` (SDAR's ``low_confidence_dynamic``, LLaDA2's ``generate``): with S steps
  per block, step k's quota q is ``quota``'s share of the whole block (not of its masks). If at least q
  masked positions are strictly above tau, commit all of them; else commit the q most confident.
* ``low_confidence_static`` (SDAR's ``low_confidence_static``): the q most confident, as ``quota``.
A first block that starts inside the prompt holds fewer masks than the block length; the quota
rules then commit at most the masks left, as the references do.
A family with shifted logits decoded as Fast-dLLM does (``first_step_first_position``) commits only the
block's first position at a block's first step, whatever Fast-dLLM rule (Dream's own sampler has no such
step, so ``dream`` needs the "lookback" windows there).
Every rule ends: MASK is never a candidate token, each step commits at least one position (``dream``
excepted, as Dream's schedule does), and the last allowed step (``steps_per_block``, or
``block_length`` at most) commits whatever is still masked, each with its best non-MASK token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import DREAM_ALGS, dream_alg_problem
from engine.runner.logit_processors import RowBias, TokenFilters, apply_logit_bias, filter_top_k_top_p

_HASH_MULTIPLIER = 0x45D9F3B
_UINT32 = 0xFFFFFFFF
# Dream's alg -> the score its positions are ranked by (see propose_tokens)
DREAM_MEASURES = dict(zip(DREAM_ALGS, ("probability", "margin", "neg_entropy")))
_ENTROPY_EPSILON = 1e-10  # Dream's: log(p + eps) keeps p = 0 finite


@dataclass(frozen=True)
class DecodeRule:
    kind: str  # one of engine.config.DECODING_RULES
    threshold: float = 0.9
    factor: float = 1.0
    steps_per_block: int | None = None
    first_step_first_position: bool = False
    dream_alg: str = "maskgit_plus"  # kind "dream": one of DREAM_ALGS
    dream_eps: float = 1e-3  # kind "dream": the schedule's last timestep

    def __post_init__(self) -> None:
        if self.kind == "dream":
            if (problem := dream_alg_problem(self.dream_alg)) is not None:
                raise ValueError(f"dream_alg {problem}")
            if self.steps_per_block is None:
                raise ValueError("decoding 'dream' needs steps_per_block (Dream's steps)")

    @property
    def measure(self) -> str:
        """The per-position score the rule ranks by (the argument ``propose_tokens`` needs)."""
        return DREAM_MEASURES[self.dream_alg] if self.kind == "dream" else "probability"


def commits_first_position_first(kind: str, logit_shift: int, shifted_decoding: str) -> bool:
    """Whether a block's first step commits only its first position (Fast-dLLM's Dream block decoding)."""
    if logit_shift == 0 or shifted_decoding == "lookback":
        return False
    if kind == "dream":
        raise ValueError("decoding 'dream' on a family with shifted logits needs shifted_decoding='lookback': "
                         "Dream's sampler applies its rule at every step, and Fast-dLLM's windows cannot "
                         "predict a block's first position")
    return True


def decode_rule(config, logit_shift: int) -> DecodeRule:
    """The rule an engine config asks for, on a family with this logit shift."""
    first_only = commits_first_position_first(config.decoding, logit_shift, config.shifted_decoding)
    return DecodeRule(config.decoding, config.threshold, config.factor, config.steps_per_block,
                      first_step_first_position=first_only, dream_alg=config.dream_alg,
                      dream_eps=config.dream_eps)


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


def quota_for_step(block_length: int | torch.Tensor, step: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to commit at ``step`` (0-based) of a block (all masks at its start): an even split,
    remainder first."""
    base, remainder = block_length // steps, block_length % steps
    return base + (step < remainder).long()


def dream_transfer_count(num_masked: torch.Tensor, step: torch.Tensor, steps: int, eps: float) -> torch.Tensor:
    """[rows] positions Dream's schedule commits at ``step`` (0-based) of ``steps``, m masks left.

    With t = ts[step], s = ts[step + 1] of ``ts = linspace(1, eps, steps + 1)`` (float32, as Dream):
    ``int(m * (1 - s / t))``, truncated, so early steps of a long schedule may commit nothing; the last
    step commits all m.
    """
    timesteps = torch.linspace(1, eps, steps + 1, device=num_masked.device, dtype=torch.float32)
    index = step.clamp(max=steps - 1)
    ratio = 1 - timesteps[index + 1] / timesteps[index]
    count = (num_masked.to(torch.float32) * ratio).long()
    return torch.where(step + 1 >= steps, num_masked, count)


def _rank_by_confidence(confidence: torch.Tensor, masked: torch.Tensor):
    """Ranks (0 = most confident) of masked positions; ties go to the leftmost position."""
    # -inf, not -1: Dream's negative entropy is below -1 for any flat distribution
    scores = torch.where(masked, confidence, torch.full_like(confidence, float("-inf")))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    sorted_scores = scores.gather(-1, order)
    return ranks, sorted_scores


def select_commits(rule: DecodeRule, confidence: torch.Tensor, masked: torch.Tensor,
                   step: torch.Tensor) -> torch.Tensor:
    """Which masked positions to commit now: bool ``[rows, block]``.

    step [rows]: 0-based denoising step within the current block (which starts all masks).
    Rows without masks commit nothing. At the last allowed step every masked position commits.
    """
    if rule.kind in ("threshold", "low_confidence"):  # no ranking: the most confident mask, leftmost on a tie
        best = torch.where(masked, confidence, float("-inf")).argmax(dim=-1, keepdim=True)
        passes = confidence > rule.threshold if rule.kind == "low_confidence" else confidence >= rule.threshold
        commit = (masked & passes).scatter_(-1, best, masked.gather(-1, best))
        return _finish_commits(rule, commit, masked, step)
    ranks, sorted_scores = _rank_by_confidence(confidence, masked)
    if rule.kind in ("quota", "low_confidence_static", "low_confidence_dynamic"):
        quota = quota_for_step(masked.shape[-1], step, rule.steps_per_block)
        commit = masked & (ranks < quota[:, None])
        if rule.kind == "low_confidence_dynamic":
            confident = masked & (confidence > rule.threshold)
            commit = torch.where((confident.sum(-1) >= quota)[:, None], confident, commit)
    elif rule.kind == "factor":
        commit = masked & (ranks < _fast_dllm_factor_count(sorted_scores, masked.sum(-1), rule.factor)[:, None])
    elif rule.kind == "factor_prefix":
        counts = torch.arange(1, masked.shape[-1] + 1, device=masked.device, dtype=confidence.dtype)
        passes = (counts + 1) * (1 - sorted_scores) < rule.factor
        passes[:, 0] = True
        prefix = passes.long().cumprod(dim=-1).sum(dim=-1)
        commit = masked & (ranks < prefix[:, None])
    elif rule.kind == "dream":
        count = dream_transfer_count(masked.sum(-1), step, rule.steps_per_block, rule.dream_eps)
        commit = masked & (ranks < count[:, None])
    else:
        raise ValueError(f"unknown decoding rule {rule.kind!r}")
    return _finish_commits(rule, commit, masked, step)


def _finish_commits(rule: DecodeRule, commit: torch.Tensor, masked: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The rule-independent end of a step: Fast-dLLM's Dream first step, and the last allowed step."""
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
