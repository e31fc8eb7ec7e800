"""Runs one denoising step of a batch on the model: tensors in, committed tokens out. No policy."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from engine.batch import RowArena, StepBatch
from engine.batch_invariance import configure_cuda_batch_invariance
from engine.config import EngineConfig
from engine.decoding import Sampling, decode_rule, gumbel_noise, propose_tokens, select_commits
from engine.logit_processors import LogprobBuffer, token_logprobs
from engine.models.loader import DiffusionLM
from engine.request import TokenLogprob, first_stop


@dataclass(frozen=True)
class RowResult:
    """What a step did to one row (data only)."""

    block_complete: bool  # no mask left in its block
    stop_index: int | None  # the completed block's first stop token (None: none, or not complete)
    block_tokens: list[int] | None  # the completed block; None while masks remain
    block_logprobs: list[TokenLogprob] | None = None  # the completed block's, if its request asked


@dataclass(frozen=True)
class StepOutput:
    rows: dict[str, RowResult]  # keyed by request id
    model_time_s: float


class ModelRunner:
    def __init__(self, lm: DiffusionLM, config: EngineConfig):
        self.lm = lm
        self.rule = decode_rule(config, lm.logit_shift)
        lm.model.use_compiled(config.compile, config.max_batch_size)
        lm.model.use_batch_invariant(config.batch_invariant)
        if config.batch_invariant and lm.device.type == "cuda":
            configure_cuda_batch_invariance()
        self.block_length = config.block_length
        self._stop_ids = torch.tensor(lm.tokens.stop_ids, device=lm.device)
        self.max_rows = config.max_batch_size
        self._logprobs: LogprobBuffer | None = None  # allocated when a request first asks for them

    @torch.no_grad()
    def run_step(self, batch: StepBatch, arena: RowArena) -> StepOutput:
        """One denoising step for every row of ``batch``; its one host synchronisation is at the end."""
        started = time.perf_counter()
        mask_id = self.lm.tokens.mask_id
        if batch.moved_slots and self._logprobs is not None:
            self._logprobs.move(batch.moved_slots)
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
        commit = select_commits(self.rule, confidence, masked, batch.steps)
        blocks = torch.where(commit, candidates, blocks)
        if batch.logprob_rows is not None:
            self._record_logprobs(batch, logits, candidates, commit)
        arena.write_blocks(batch, blocks)
        complete = ~(blocks == mask_id).any(-1)
        stopped = torch.isin(blocks, self._stop_ids).any(-1)
        host = torch.cat([blocks, complete[:, None], stopped[:, None]], dim=1).tolist()  # the one sync
        results = {request_id: self._row_result(row) for request_id, row in zip(batch.request_ids, host)}
        if batch.logprob_rows is not None:
            self._attach_logprobs(batch, results)
        return StepOutput(rows=results, model_time_s=time.perf_counter() - started)

    def _row_result(self, row: list[int]) -> RowResult:
        """A host row ``[block tokens..., complete, stop found]`` as a RowResult."""
        tokens, complete, stopped = row[:-2], bool(row[-2]), bool(row[-1])
        if not complete:
            return RowResult(False, None, None)
        return RowResult(True, first_stop(tokens, self.lm.tokens.stop_ids) if stopped else None, tokens)

    def _record_logprobs(self, batch: StepBatch, logits: torch.Tensor, candidates: torch.Tensor,
                         commit: torch.Tensor) -> None:
        """The log-probabilities of the positions committed now, for the rows that asked."""
        if self._logprobs is None:
            self._logprobs = LogprobBuffer(self.max_rows, self.block_length, logits.device)
        rows = batch.logprob_rows
        bias = None
        if batch.bias is not None:
            dense = logits.new_zeros((batch.num_rows, logits.shape[-1]), dtype=batch.bias.values.dtype)
            dense[batch.bias.rows] = batch.bias.values
            bias = dense[rows]
        chosen, top_values, top_ids = token_logprobs(logits[rows], self.lm.tokens.mask_id, candidates[rows],
                                                     batch.num_top_logprobs, bias)
        self._logprobs.write(batch.slots[rows], commit[rows], chosen, top_values, top_ids)

    def _attach_logprobs(self, batch: StepBatch, results: dict[str, RowResult]) -> None:
        """Completed blocks of rows that asked get their positions' log-probabilities (a second host
        copy, made only for such rows)."""
        rows = batch.logprob_rows.tolist()
        slots = batch.slots[batch.logprob_rows]
        num_top = batch.num_top_logprobs
        chosen, values, ids = (self._logprobs.chosen[slots].tolist(),
                               self._logprobs.top_values[slots, :, :num_top].tolist(),
                               self._logprobs.top_ids[slots, :, :num_top].tolist())
        for index, row in enumerate(rows):
            request_id = batch.request_ids[row]
            result = results[request_id]
            if result.block_tokens is None:
                continue
            wanted = batch.logprob_counts[index]
            block = [TokenLogprob(token, logprob, tuple(zip(ids[index][j][:wanted], values[index][j][:wanted])))
                     for j, (token, logprob) in enumerate(zip(result.block_tokens, chosen[index]))]
            results[request_id] = dataclasses.replace(result, block_logprobs=block)
