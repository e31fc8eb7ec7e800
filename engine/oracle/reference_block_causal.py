"""The single-request oracle of the block-causal families (SDAR, LLaDA2), written for clarity.

It follows the structure of SDAR's own loop (``block_diffusion_generate``), not the engine's:

    canvas = prompt + [MASK] up to a multiple of block_length (blocks at absolute positions)
    prefill: the prompt's whole blocks, keys/values stored
    for each block from the one holding the prompt's end:
        each step: a forward of the block over the cached keys/values before it, its own keys/values
                   written in place (the next step rewrites them); write what the decoding rule decides
        when the rule makes the block final: one more forward of the block writes its final keys/values
        stop after this block if its answer tokens hold a stop token (unless stop_at_eos is False)

A block is always decoded whole here, so the tokens check the engine's, which ends a block once a stop token has
no mask before it (``BlockRule.read_block``). A rule that never rewrites a token keeps that answer to the end of
the block, and the block's steps count up to that step, as the engine's do.

With ``cache="none"`` every step is a forward of the whole canvas up to the block's end instead
(LLaDA2's ``generate``). The engine fuses the prefill with the first block's first step and a finished
block's store with the next block's first step; both orders compute the same numbers up to float
rounding, which the golden tests pin down.
"""
from __future__ import annotations

import dataclasses

import torch

from engine.config import SamplingParams
from engine.models.kv_cache import KVCache
from engine.models.loader import DiffusionLM
from engine.models.step_inputs import RefreshPart, WindowPart
from engine.oracle.reference_steps import (
    ReferenceResult,
    RowDraws,
    block_stops,
    denoise_step,
    finished_result,
    row_bias,
)
from engine.rules.base import BlockRule
from engine.scheduling.request import TokenLogprob


@torch.no_grad()
def block_causal_generate(
    lm: DiffusionLM, prompt_ids: list[int], *, max_new_tokens: int, block_length: int, rule: BlockRule,
    cache: str = "dual", temperature: float = 0.0, seed: int = 0, stop_at_eos: bool = True, top_k: int = 0,
    top_p: float = 1.0, logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
    params: SamplingParams | None = None,
) -> ReferenceResult:
    prompt_length, mask_id, device = len(prompt_ids), lm.special_ids.mask_id, lm.device
    rule = dataclasses.replace(rule, mask_id=mask_id)
    if not prompt_ids or max_new_tokens <= 0:
        raise ValueError("the prompt must be non-empty and max_new_tokens positive")
    lead, num_blocks = lm.layout.answer_blocks(prompt_length, max_new_tokens, block_length)
    first = prompt_length - lead  # column of the first answer block
    width = first + num_blocks * block_length
    if width > lm.max_length:
        raise ValueError(f"prompt ({prompt_length}) + canvas exceeds the model's maximum {lm.max_length}")
    canvas = torch.full((1, width), mask_id, dtype=torch.long, device=device)
    canvas[0, :prompt_length] = torch.tensor(prompt_ids, device=device)
    forward = (CachedBlockForward if cache != "none" else FullBlockForward)(lm, canvas, block_length)
    forward.prefill(first)
    draws = RowDraws(torch.tensor([seed], dtype=torch.long, device=device), temperature, top_k, top_p,
                     row_bias(logit_bias, lm.vocab_size, device) if logit_bias else None,
                     params or SamplingParams())
    total_steps, blocks_run = 0, 0
    stop_ids = lm.special_ids.stop_ids if stop_at_eos and rule.commits_once else None
    logprobs_at: dict[int, TokenLogprob] = {}  # output position -> at its commit step
    for block in range(num_blocks):
        start, end = first + block * block_length, first + (block + 1) * block_length
        step, final, state, stop_step = 0, False, rule.new_row_state(), None
        while not final:
            logits = lm.model.logits(forward.step(start, end))
            final = denoise_step(lm, rule, canvas, (start, end), logits, step, block * block_length, draws, logprobs,
                                 logprobs_at, logprob_offset=block * block_length - lead, state=state,
                                 lead=lead if block == 0 else 0)
            step += 1
            answer = canvas[0, max(start, prompt_length):end].tolist()
            if stop_step is None and stop_ids is not None and rule.ends_at_stop(answer, stop_ids):
                stop_step = step  # the answer is whole up to its stop token: the engine's block ends here
        forward.store(start, end)
        total_steps += stop_step or step
        blocks_run += 1
        if stop_at_eos and block_stops(lm, canvas, max(start, prompt_length), end):
            break
    return finished_result(lm, canvas, prompt_length, first + blocks_run * block_length, max_new_tokens, stop_at_eos,
                           blocks_run, total_steps, None if logprobs is None else logprobs_at)


class CachedBlockForward:
    """SDAR's order: the prompt's whole blocks stored once, each step a window of the block over the
    cache, each finished block stored by one more forward of its final tokens."""

    def __init__(self, lm: DiffusionLM, canvas: torch.Tensor, block_length: int):
        self.lm, self.canvas, self.block_length = lm, canvas, block_length
        width = canvas.shape[1]
        self.positions = torch.arange(width, device=canvas.device)[None]
        self.kv_cache = KVCache(lm.model.config.cache_spec(width), 1, lm.dtype, canvas.device)
        self.kv_cache.key_mask[0, :width] = True

    def prefill(self, end: int) -> None:
        if end == 0:
            return
        read = torch.zeros((1, 1), dtype=torch.long, device=self.canvas.device)
        part = RefreshPart(self.canvas[:, :end], self.positions[:, :end], self.kv_cache.key_mask[:, :end], read,
                           slots=torch.zeros(1, dtype=torch.long, device=self.canvas.device),
                           block_size=self.block_length)
        self.lm.model.forward_step(part, None, self.kv_cache)

    def step(self, start: int, end: int) -> torch.Tensor:
        columns = torch.arange(start, end, device=self.canvas.device)[None]
        part = WindowPart(self.canvas[:, start:end], self.positions[:, start:end], columns, context_start=0,
                          num_read=end - start, block_size=self.block_length, context_end=end,
                          key_positions=self.positions[:, :end])
        return self.lm.model.forward_step(None, part, self.kv_cache)

    def store(self, start: int, end: int) -> None:
        self.step(start, end)


class FullBlockForward:
    """LLaDA2's order: every step a forward of the canvas up to the block's end, nothing cached."""

    def __init__(self, lm: DiffusionLM, canvas: torch.Tensor, block_length: int):
        self.lm, self.canvas, self.block_length = lm, canvas, block_length

    def prefill(self, end: int) -> None:
        pass

    def step(self, start: int, end: int) -> torch.Tensor:
        device = self.canvas.device
        positions = torch.arange(end, device=device)[None]
        hidden = self.lm.model.forward_full(self.canvas[:, :end], positions,
                                            torch.ones((1, end), dtype=torch.bool, device=device),
                                            block_size=self.block_length)
        return hidden[:, start:end]

    def store(self, start: int, end: int) -> None:
        pass
