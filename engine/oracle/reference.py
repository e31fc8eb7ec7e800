"""The single-request decoding loop, written for clarity: the oracle every batched path is tested against.

Semi-autoregressive block decoding (LLaDA / Fast-dLLM):

    canvas = prompt + [MASK] * (num_blocks * block_length)
    for each block, left to right:
        step 0:  full forward over the whole canvas (refreshes the cache in "prefix"/"dual" mode)
        step k:  "none"   -> full forward again
                 "prefix" -> forward of [block start, canvas end), cached prefix before it
                 "dual"   -> forward of the block only, cached keys/values before and after it
        commit tokens of the current block by the decoding rule, until it holds no mask
        stop after this block if it committed EOS / end-of-turn (unless stop_at_eos is False)

For a family with a logit shift (Dream) the hidden state at column c predicts column c + 1. By default
(Fast-dLLM's Dream block decoding) a block's first step commits only its first position, and later
cached windows start at the block, their position j - 1 predicting block position j;
``shifted_decoding="lookback"`` instead starts windows one column before the block and applies the
rule at every step.

Dream's own sampler (``diffusion_generate``, alg maskgit_plus / topk_margin / entropy, greedy) is
``rule=make_rule("dream", steps_per_block=steps, dream_alg=alg)`` with ``block_length = max_new_tokens``
(its schedule spans the whole canvas), ``cache="none"`` (it runs a full forward every step) and
``shifted_decoding="lookback"``.
"""
from __future__ import annotations

import dataclasses

import torch

from engine.models.kv_cache import KVCache
from engine.models.layout import blocks_needed
from engine.models.loader import DiffusionLM
from engine.models.step_inputs import RefreshPart, WindowPart
from engine.oracle.reference_block_causal import block_causal_generate
from engine.oracle.reference_steps import (
    ReferenceResult,
    RowDraws,
    block_stops,
    denoise_step,
    finished_result,
    row_bias,
)
from engine.rules.base import BlockRule
from engine.rules.threshold import Threshold
from engine.rules.unmasking import first_position_first
from engine.scheduling.request import TokenLogprob

THRESHOLD_RULE = Threshold()


@torch.no_grad()
def reference_generate(
    lm: DiffusionLM, prompt_ids: list[int], *, max_new_tokens: int = 256, block_length: int = 32,
    rule: BlockRule = THRESHOLD_RULE, cache: str = "dual", temperature: float = 0.0,
    seed: int = 0, stop_at_eos: bool = True, shifted_decoding: str = "fast-dllm", top_k: int = 0,
    top_p: float = 1.0, logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
    gen_length: int | None = None,
) -> ReferenceResult:
    """One request decoded alone. A whole-sequence family's canvas spans ``gen_length`` tokens (None:
    ``max_new_tokens``) and decoding stops once the blocks ``max_new_tokens`` spans are final."""
    if lm.layout.stores_finished_blocks:  # blocks at absolute positions, each stored once: its own loop
        settings = dict(rule=rule, cache=cache, temperature=temperature, seed=seed, stop_at_eos=stop_at_eos,
                        top_k=top_k, top_p=top_p, logit_bias=logit_bias, logprobs=logprobs)
        return block_causal_generate(lm, prompt_ids, max_new_tokens=max_new_tokens, block_length=block_length,
                                     **settings)
    canvas_length = gen_length if gen_length is not None else max_new_tokens
    _, width = _canvas_size(lm, prompt_ids, canvas_length, block_length)
    num_blocks = blocks_needed(min(max_new_tokens, canvas_length), block_length)
    prompt_length = len(prompt_ids)
    device, shift = lm.device, lm.logit_shift
    # a shifted family (Dream): Fast-dLLM's windows start at the block and a block's first step commits
    # only its first position; "lookback" windows start one column earlier and apply the rule throughout
    lookback = shift if shifted_decoding == "lookback" else 0
    rule = dataclasses.replace(
        rule, first_step_first_position=first_position_first(rule.name, shift, shifted_decoding),
        mask_id=lm.special_ids.mask_id)
    canvas, positions, key_mask, kv_cache = _blank_canvas(lm, prompt_ids, width, cache)
    draws = RowDraws(torch.tensor([seed], dtype=torch.long, device=device), temperature, top_k, top_p,
                     row_bias(logit_bias, lm.vocab_size, device) if logit_bias else None)
    slot = torch.zeros(1, dtype=torch.long, device=device)
    total_steps, blocks_run = 0, 0
    logprobs_at: dict[int, TokenLogprob] = {}  # canvas position -> at its commit step
    for block in range(num_blocks):
        start, end = prompt_length + block * block_length, prompt_length + (block + 1) * block_length
        step, final, state = 0, False, rule.new_row_state()
        while not final:
            if step == 0 or cache == "none":
                read = torch.arange(start - shift, end - shift, device=device)[None]
                refresh = RefreshPart(canvas, positions, key_mask, read, slot if kv_cache is not None else None)
                hidden = lm.model.forward_step(refresh, None, kv_cache)
            else:
                hidden = _window_forward(lm, canvas, positions, kv_cache,
                                         (start - lookback, end if cache == "dual" else width), block_length,
                                         read_shift=shift - lookback)
            logits = lm.model.logits(hidden)
            final = denoise_step(lm, rule, canvas, (start, end), logits, step, block * block_length, draws,
                                 logprobs, logprobs_at, logprob_offset=block * block_length, state=state)
            step += 1
        total_steps += step
        blocks_run += 1
        if stop_at_eos and block_stops(lm, canvas, start, end):
            break
    return finished_result(lm, canvas, prompt_length, prompt_length + blocks_run * block_length, max_new_tokens,
                           stop_at_eos, blocks_run, total_steps, None if logprobs is None else logprobs_at)


def _canvas_size(lm: DiffusionLM, prompt_ids: list[int], max_new_tokens: int,
                 block_length: int) -> tuple[int, int]:
    """(blocks, canvas width) of a request, or the ValueError the engine would raise for it."""
    if not prompt_ids:
        raise ValueError("prompt is empty")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    num_blocks = blocks_needed(max_new_tokens, block_length)
    width = len(prompt_ids) + num_blocks * block_length
    if width > lm.max_length:
        raise ValueError(f"prompt ({len(prompt_ids)}) + canvas exceeds the model's maximum {lm.max_length}")
    return num_blocks, width


def _blank_canvas(lm: DiffusionLM, prompt_ids: list[int], width: int,
                  cache: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, KVCache | None]:
    """The prompt then masks up to ``width``, its positions and key mask, and a one-row KV cache (None
    without a cache)."""
    device = lm.device
    canvas = torch.full((1, width), lm.special_ids.mask_id, dtype=torch.long, device=device)
    canvas[0, :len(prompt_ids)] = torch.tensor(prompt_ids, device=device)
    positions = torch.arange(width, device=device)[None]
    key_mask = torch.ones(1, width, dtype=torch.bool, device=device)
    kv_cache = KVCache(lm.model.config.cache_spec(width), 1, lm.dtype, device) if cache != "none" else None
    if kv_cache is not None:
        kv_cache.key_mask[0, :width] = True
    return canvas, positions, key_mask, kv_cache


def _window_forward(lm: DiffusionLM, canvas: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache,
                    window: tuple[int, int], block_length: int, read_shift: int) -> torch.Tensor:
    """Hidden states of canvas columns [window[0], window[1]) over the cached keys/values of the rest."""
    columns = torch.arange(*window, device=canvas.device)[None]
    part = WindowPart(canvas[:, columns[0]], positions[:, columns[0]], columns, context_start=0,
                      num_read=block_length, read_shift=read_shift)
    return lm.model.forward_step(None, part, kv_cache)
