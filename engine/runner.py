"""Runs one denoising step of a batch on the model: tensors in, committed tokens out. No policy."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.batch import RowArena, StepBatch
from engine.config import EngineConfig
from engine.decoding import Sampling, decode_rule, gumbel_noise, propose_tokens, select_commits
from engine.models.loader import DiffusionLM


@dataclass(frozen=True)
class RowResult:
    """What a step did to one row (data only)."""

    block_complete: bool  # no mask left in its block
    stop_found: bool  # the block holds a stop token (meaningful once complete)
    block_tokens: list[int] | None  # the completed block; None while masks remain


@dataclass(frozen=True)
class StepOutput:
    rows: dict[str, RowResult]  # keyed by request id
    model_time_s: float


class ModelRunner:
    def __init__(self, lm: DiffusionLM, config: EngineConfig):
        self.lm = lm
        self.rule = decode_rule(config, lm.logit_shift)
        self.block_length = config.block_length
        self._stop_ids = torch.tensor(lm.tokens.stop_ids, device=lm.device)

    @torch.no_grad()
    def run_step(self, batch: StepBatch, arena: RowArena) -> StepOutput:
        """One denoising step for every row of ``batch``; its one host synchronisation is at the end."""
        started = time.perf_counter()
        mask_id = self.lm.tokens.mask_id
        hidden = self.lm.model.forward_step(batch.refresh, batch.window, arena.kv)
        logits = self.lm.model.logits(hidden)  # [rows, block_length, vocab]: the active blocks only
        blocks = arena.block_tokens(batch)
        masked = blocks == mask_id
        sampling = None
        if batch.sampled_rows is not None:
            sampling = Sampling(rows=batch.sampled_rows, temperatures=batch.temperatures,
                                noise=gumbel_noise(*batch.noise_keys, logits.shape[-1]), filters=batch.filters)
        candidates, confidence = propose_tokens(logits, mask_id, sampling, measure=self.rule.measure,
                                                bias=batch.bias)
        masks_at_start = torch.full_like(batch.steps, self.block_length)  # a block starts all masks
        commit = select_commits(self.rule, confidence, masked, batch.steps, masks_at_start)
        blocks = torch.where(commit, candidates, blocks)
        arena.write_blocks(batch, blocks)
        complete = ~(blocks == mask_id).any(-1)
        stopped = torch.isin(blocks, self._stop_ids).any(-1)
        host = torch.cat([blocks, complete[:, None], stopped[:, None]], dim=1).tolist()  # the one sync
        results = {request_id: RowResult(bool(row[-2]), bool(row[-1]), row[:-2] if row[-2] else None)
                   for request_id, row in zip(batch.request_ids, host)}
        return StepOutput(rows=results, model_time_s=time.perf_counter() - started)
