"""Pieces the single-request oracles share (``engine.oracle.reference``, ``engine.oracle.reference_block_causal``): the
result type, one row's sampling inputs and logit bias, and the log-probabilities a step commits."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import SamplingParams
from engine.rules.base import BlockRule, BlockView, RowState
from engine.rules.proposals import Sampling, gumbel_noise, propose_tokens
from engine.runner.logit_processors import RowBias, TokenFilters, dense_bias, token_logprobs
from engine.scheduling.request import TokenLogprob, first_stop


@dataclass(frozen=True)
class ReferenceResult:
    token_ids: list[int]  # generated tokens, up to the first stop token when the request honours stops
    finish_reason: str  # "eos" | "length"
    num_blocks: int
    num_steps: int
    logprobs: list[TokenLogprob] | None = None  # per output token, at the step it was committed


def row_sampling(seeds: torch.Tensor, temperature: float, top_k: int, top_p: float, block_offset: int, step: int,
              block_length: int, vocab_size: int) -> Sampling:
    """The one row's sampling inputs at ``step`` of the block starting at output position ``block_offset``."""
    device = seeds.device
    canvas_positions = torch.arange(block_offset, block_offset + block_length, device=device)[None]
    global_step = torch.tensor([block_offset + step], device=device)
    filters = None
    if top_k > 0 or top_p < 1.0:
        filters = TokenFilters(top_k=torch.tensor([top_k], device=device),
                               top_p=torch.tensor([float(top_p)], dtype=torch.float64, device=device))
    return Sampling(rows=torch.tensor([0], device=device),
                    temperatures=torch.tensor([float(temperature)], device=device),
                    noise=gumbel_noise(seeds, global_step, canvas_positions, vocab_size), filters=filters)


def row_bias(logit_bias: dict[int, float], vocab_size: int, device: torch.device) -> RowBias:
    return RowBias(rows=torch.tensor([0], device=device),
                   values=dense_bias([logit_bias], vocab_size, torch.float64, device))


def committed_logprobs(logits: torch.Tensor, mask_id: int, candidates: torch.Tensor, commit: torch.Tensor,
                        count: int, bias: RowBias | None, offset: int) -> dict[int, TokenLogprob]:
    """Output position -> logprob of each token this step committed (``offset``: the block's start)."""
    chosen, values, ids = token_logprobs(logits, mask_id, candidates, count, None if bias is None else bias.values)
    return {offset + j: TokenLogprob(int(candidates[0, j]), float(chosen[0, j]),
                                     tuple(zip(ids[0, j].tolist(), values[0, j].tolist())))
            for j in commit[0].nonzero().flatten().tolist()}


def finished_result(lm, canvas: torch.Tensor, prompt_length: int, end: int, max_new_tokens: int, stop_at_eos: bool,
                    num_blocks: int, num_steps: int, logprobs_at: dict[int, TokenLogprob] | None) -> ReferenceResult:
    """The oracle's result: the canvas's answer columns ``[prompt_length, end)``, at most ``max_new_tokens``
    of them and, when the request honours stops, up to the first stop token, with the log-probabilities of
    those tokens when recorded. It finishes with "eos" when a stop token it honours comes within
    ``max_new_tokens``; a request that ignores stops keeps them, as vLLM's ``ignore_eos`` does."""
    answer = canvas[0, prompt_length:end].tolist()
    stop = first_stop(answer, lm.special_ids.stop_ids)
    token_ids = (answer[:stop] if stop_at_eos else answer)[:max_new_tokens]
    stopped = stop is not None and stop < max_new_tokens and stop_at_eos
    return ReferenceResult(token_ids=token_ids, finish_reason="eos" if stopped else "length",
                           num_blocks=num_blocks, num_steps=num_steps,
                           logprobs=None if logprobs_at is None else [logprobs_at[i] for i in range(len(token_ids))])


def block_stops(lm, canvas: torch.Tensor, start: int, end: int) -> bool:
    """Whether canvas columns ``[start, end)`` hold a stop token."""
    return any(int(token) in lm.special_ids.stop_ids for token in canvas[0, start:end])


@dataclass(frozen=True)
class RowDraws:
    """What the oracle's one row draws with: its seed, temperature, filters and logit bias."""

    seeds: torch.Tensor
    temperature: float
    top_k: int
    top_p: float
    bias: RowBias | None
    params: SamplingParams = SamplingParams()  # the request's own settings of its rule (rule_settings)


def denoise_step(lm, rule: BlockRule, canvas: torch.Tensor, span: tuple[int, int], logits: torch.Tensor,
                 step: int, block_offset: int, draws: RowDraws, logprobs: int | None,
                 logprobs_at: dict[int, TokenLogprob], logprob_offset: int, state: RowState, lead: int = 0) -> bool:
    """One denoising step of the oracle's row: propose tokens for the block at canvas columns ``span`` from
    its ``logits`` at the offsets ``rule`` reads, write what it decides, and record the written tokens'
    log-probabilities at output positions from ``logprob_offset`` (``block_offset``: the block's first
    output position). Returns whether the rule made the block final."""
    start, end = span
    mask_id, block_length, device = lm.special_ids.mask_id, end - start, canvas.device
    sampling = (row_sampling(draws.seeds, draws.temperature, draws.top_k, draws.top_p, block_offset, step,
                             block_length, logits.shape[-1]) if draws.temperature > 0 else None)
    candidates, confidence = propose_tokens(logits, mask_id, sampling, measure=rule.measure, bias=draws.bias)
    block = canvas[:, start:end]
    offsets = state.offsets if state.offsets is not None else rule.logit_offsets(block[0].tolist(), lead)
    computed = torch.zeros_like(block, dtype=torch.bool)
    computed[0, offsets] = True
    view = BlockView(block, torch.where(computed, candidates, block),
                     torch.where(computed, confidence, torch.full_like(confidence, float("-inf"))), computed,
                     torch.tensor([step], device=device), rule.row_inputs([state], [draws.params], block))
    update = rule.step(view)
    canvas[:, start:end] = update.tokens
    if logprobs is not None:
        logprobs_at |= committed_logprobs(logits, mask_id, candidates, update.written, logprobs, draws.bias,
                                          offset=logprob_offset)
    row = rule.read_row(rule.host_columns(update)[0].tolist())
    rule.after_step(state, row, lead)
    return row.final
