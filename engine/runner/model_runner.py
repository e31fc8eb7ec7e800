"""Runs one denoising step on the model and owns the persistent batch it runs on. No policy.

``ModelRunner.execute`` applies the scheduler's decisions to the batch (places admitted rows, packs
window rows), builds the step's tensors, runs the forward and the decoding rule, and returns the
committed tokens keyed by request id. ``ModelRunner.release`` frees the slots of rows that left.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from engine.config import EngineConfig, window_lookback
from engine.models.loader import DiffusionLM
from engine.runner.batch import PersistentBatch
from engine.runner.batch_inputs import StepBatch, prepare_inputs, step_parts
from engine.runner.decoding import Sampling, decode_rule, gumbel_noise, propose_tokens, select_commits
from engine.runner.logit_processors import token_logprobs
from engine.runner.prefix_cache import PrefixCache, prefix_cache_blocks
from engine.scheduling.outputs import RowResult, RunnerOutput, SchedulerOutput
from engine.scheduling.request import Request, TokenLogprob, first_stop


class ModelRunner:
    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int):
        self.lm = lm
        self.rule = decode_rule(config, lm.logit_shift)
        self.batch = PersistentBatch(lm, config.max_batch_size, max_row_width, config.block_length, config.cache,
                                     window_lookback=window_lookback(config, lm.logit_shift))
        self.parts = step_parts(lm.layout)
        self.prefix_cache = (PrefixCache(self.batch.kv_cache, prefix_cache_blocks(config, max_row_width),
                                         config.block_length)
                             if config.enable_prefix_caching and self.batch.kv_cache is not None else None)
        self._stop_ids = torch.tensor(lm.special_ids.stop_ids, device=lm.device)

    @torch.no_grad()
    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        """Apply ``scheduled`` to the persistent batch and run its rows for one denoising step."""
        for request in scheduled.admitted:
            self.batch.place(request)
            if self.prefix_cache is not None:
                self.prefix_cache.reuse(request)
        if not scheduled.num_rows:
            return RunnerOutput(rows={}, model_time_s=0.0)
        whole, window = self.parts.assign(self.batch, scheduled)
        self.batch.pack_window_rows(window)
        inputs = prepare_inputs(self.batch, self.parts, whole, window)
        started = time.perf_counter()
        rows = self._run(inputs)
        if self.prefix_cache is not None:
            self.prefix_cache.keep_prompts(scheduled.admitted)
        return RunnerOutput(rows=rows, model_time_s=time.perf_counter() - started, record=inputs.record)

    def release(self, finished: list[Request]) -> None:
        """The rows that left give their slots back at once, so an idle engine holds no row (their answers
        enter the prefix cache first)."""
        if self.prefix_cache is not None:
            self.prefix_cache.keep_answers(finished)
        for request in finished:
            self.batch.release(request)

    def _run(self, inputs: StepBatch) -> dict[str, RowResult]:
        """One denoising step for every row of ``inputs``; its one host synchronisation is at the end."""
        mask_id = self.lm.special_ids.mask_id
        hidden = self.lm.model.forward_step(inputs.refresh, inputs.window, self.batch.kv_cache)
        logits = self.lm.model.logits(hidden)  # [rows, block_length, vocab]: the active blocks only
        blocks = self.batch.block_tokens(inputs.slots, inputs.block_columns)
        masked = blocks == mask_id
        sampling = None
        if inputs.sampled_rows is not None:
            sampling = Sampling(rows=inputs.sampled_rows, temperatures=inputs.temperatures,
                                noise=gumbel_noise(*inputs.noise_keys, logits.shape[-1]), filters=inputs.filters)
        candidates, confidence = propose_tokens(logits, mask_id, sampling, measure=self.rule.measure,
                                                bias=inputs.bias)
        commit = select_commits(self.rule, confidence, masked, inputs.step_in_block)
        blocks = torch.where(commit, candidates, blocks)
        if inputs.logprob_rows is not None:
            self._record_logprobs(inputs, logits, candidates, commit)
        self.batch.write_blocks(inputs.slots, inputs.block_columns, blocks)
        complete = ~(blocks == mask_id).any(-1)
        stop_hits = torch.isin(blocks, self._stop_ids)
        if inputs.answer_starts is not None:  # the prompt's tokens in a first block never stop a request
            stop_hits &= self.batch.block_offsets >= inputs.answer_starts[:, None]
        stopped = stop_hits.any(-1)
        host = torch.cat([blocks, complete[:, None], stopped[:, None]], dim=1).tolist()  # the one sync
        results = {request_id: self._row_result(row, lead)
                   for request_id, row, lead in zip(inputs.request_ids, host, inputs.leads)}
        if inputs.logprob_rows is not None:
            self._attach_logprobs(inputs, results)
        return results

    def _row_result(self, row: list[int], lead: int) -> RowResult:
        """A host row ``[block tokens..., complete, stop found]`` as a RowResult: the block's answer
        tokens (after its ``lead`` prompt tokens)."""
        tokens, complete, stopped = row[lead:-2], bool(row[-2]), bool(row[-1])
        if not complete:
            return RowResult(False, None, None)
        return RowResult(True, first_stop(tokens, self.lm.special_ids.stop_ids) if stopped else None, tokens)

    def _record_logprobs(self, inputs: StepBatch, logits: torch.Tensor, candidates: torch.Tensor,
                         commit: torch.Tensor) -> None:
        """The log-probabilities of the positions committed now, for the rows that asked."""
        rows = inputs.logprob_rows
        bias = None
        if inputs.bias is not None:
            dense = logits.new_zeros((inputs.num_rows, logits.shape[-1]), dtype=inputs.bias.values.dtype)
            dense[inputs.bias.rows] = inputs.bias.values
            bias = dense[rows]
        chosen, top_values, top_ids = token_logprobs(logits[rows], self.lm.special_ids.mask_id, candidates[rows],
                                                     inputs.num_top_logprobs, bias)
        self.batch.logprob_buffer().write(inputs.slots[rows], commit[rows], chosen, top_values, top_ids)

    def _attach_logprobs(self, inputs: StepBatch, results: dict[str, RowResult]) -> None:
        """Completed blocks of rows that asked get their positions' log-probabilities (a second host
        copy, made only for such rows)."""
        rows = inputs.logprob_rows.tolist()
        slots = inputs.slots[inputs.logprob_rows]
        num_top = inputs.num_top_logprobs
        buffer = self.batch.logprob_buffer()
        chosen, values, ids = (buffer.chosen[slots].tolist(), buffer.top_values[slots, :, :num_top].tolist(),
                               buffer.top_ids[slots, :, :num_top].tolist())
        for index, row in enumerate(rows):
            request_id = inputs.request_ids[row]
            result = results[request_id]
            if result.block_tokens is None:
                continue
            wanted, lead = inputs.logprob_counts[index], inputs.leads[row]
            block = [TokenLogprob(token, logprob, tuple(zip(ids[index][j][:wanted], values[index][j][:wanted])))
                     for j, (token, logprob) in enumerate(zip(result.block_tokens, chosen[index][lead:]), start=lead)]
            results[request_id] = dataclasses.replace(result, block_logprobs=block)
