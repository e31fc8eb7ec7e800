"""The block rows' side of the runner's step (LLaDA, Dream, SDAR, LLaDA2.x, Fast-dLLM v2): active blocks in a
persistent batch.

Each row's span is its active block: refreshed whole with its row, or decoded in the window over its cached
context (the layout's step parts). Its rule plans which offsets need logits (``logit_offsets``) and reads the
block back (``read_block``). ``BlockRows.run`` packs the window rows, builds the step's tensors, runs one
forward, hands the proposals to the rule, and returns what the rule wrote and whether each row's block is
final, keyed by request id. The rule alone decides what is done.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from engine.config import EngineConfig, window_lookback
from engine.models.loader import DiffusionLM
from engine.models.part_attention import part_attention
from engine.rules.base import BlockRule, BlockView, RowState, RowStep
from engine.rules.proposals import NOISE_CHUNK_ELEMENTS, Sampling
from engine.runner.batch import PersistentBatch
from engine.runner.batch_inputs import StepBatch, prepare_inputs, step_parts
from engine.runner.memory_model import INDEX_BYTES, MemoryModel, cache_bytes, element_bytes, weight_bytes
from engine.runner.parts_shifted_block_causal import greedy_block_starts
from engine.runner.prefix_cache import PrefixCache, whole_prompt_blocks
from engine.runner.sampler import Sampler
from engine.runner.slots import SlotAllocator
from engine.scheduling.model_fit import block_length_for
from engine.scheduling.outputs import RowResult, RunnerOutput, SchedulerOutput
from engine.scheduling.request import Request, TokenLogprob, first_stop
from engine.structured.rows import ConstrainedRows


class BlockRows:
    """Block rows' persistent batch, step parts, rule states and constrained rows, for the runner."""

    rows_per_chunk = None  # a step's logits are its rows' logit offsets, a block each at most

    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int, rule: BlockRule,
                 slots: SlotAllocator[Request], sampler: Sampler):
        self.lm, self.rule, self.sampler = lm, rule, sampler
        # the ids whose commit ends a block, for rows that honour stops (None: every block is decoded whole)
        self.stop_ids = lm.special_ids.stop_ids if lm.layout.ends_blocks_at_stops else None
        self.row_states: dict[str, RowState] = {}  # request id -> its rule state, as the last step left it
        self.batch = PersistentBatch(lm, slots, max_row_width, config.block_length, config.cache,
                                     window_lookback=window_lookback(config, lm.logit_shift))
        self.cache = self.batch.kv_cache
        self.page_length = config.block_length  # a prefix page is a prompt block
        self.parts = step_parts(lm.layout)
        self.constrained = ConstrainedRows(lm.vocab_size, lm.special_ids.eos_id, self.sampler)

    @staticmethod
    def memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
        """The KV cache (or, without one, the key mask) and the prefix cache's pool of blocks, the tokens and
        positions; a step holds its rows' activations, masks and the active blocks' logits."""
        model_config, element = lm.model.config, element_bytes(lm)
        slots, width = config.max_batch_size, config.resolved_max_model_len(lm.max_length)
        block_length = block_length_for(config, lm)
        kv_bytes = (cache_bytes(lm, config, model_config.cache_spec(width), block_length) if config.cache != "none"
                    else slots * (width + 1))
        hidden, intermediate = model_config.hidden_size, model_config.intermediate_size
        per_token = 6 * hidden + 3 * intermediate + model_config.num_heads * width
        per_token += part_attention(lm.layout.part_block_size(block_length)).mask_entries_per_query(width)
        if model_config.moe is not None:  # each routed copy of a token: gate/up, its product, its output
            moe = model_config.moe
            per_token += moe.experts_per_token * (3 * moe.moe_intermediate_size + 2 * hidden)
        return MemoryModel(
            weight_bytes=weight_bytes(lm), arena_bytes=kv_bytes + 2 * INDEX_BYTES * slots * width,
            bytes_per_box_token=element * per_token,
            # the active blocks' logits in the model's dtype, their float32 softmax and one float32 temporary
            logit_bytes_per_row=(element + 8) * block_length * model_config.vocab_size,
            sampling_bytes_per_row=2 * 4 * block_length * model_config.vocab_size,
            sampling_scratch_bytes=3 * INDEX_BYTES * NOISE_CHUNK_ELEMENTS)

    def reusable_pages(self, request: Request) -> int:
        """The prompt blocks that hold no answer column."""
        return whole_prompt_blocks(request, self.page_length)

    def admit(self, request: Request, cached: int) -> None:
        """Write the row into its slot (its cached prompt blocks are already there) with a new rule state."""
        self.batch.place(request)
        self.row_states[request.request_id] = self.rule.new_row_state()
        self.constrained.admit(request)

    def claim_prompts(self, prefix_cache: PrefixCache, admitted: list[Request]) -> None:
        """Nothing yet: the prompt blocks are kept once the rows' first step has stored them (``run``)."""

    def run(self, scheduled: SchedulerOutput, prefix_cache: PrefixCache | None) -> RunnerOutput:
        """One denoising step of the scheduled rows; the admitted rows' prompt blocks are then kept. Its model
        time starts once the step's inputs are built."""
        whole, window = self.parts.assign(self.batch, scheduled)
        self.batch.pack_window_rows(window)
        inputs = prepare_inputs(self.batch, self.parts, whole, window, self._logit_offsets)
        started = time.perf_counter()
        rows = self._run(inputs)
        if prefix_cache is not None:
            prefix_cache.keep_prompts(scheduled.admitted)
        return RunnerOutput(rows=rows, model_time_s=time.perf_counter() - started, record=inputs.record)

    def release(self, finished: list[Request], prefix_cache: PrefixCache | None) -> None:
        """The leaving rows' answer blocks enter the prefix cache, and their rule states go."""
        if prefix_cache is not None:
            prefix_cache.keep_answers(finished)
        for request in finished:
            self.row_states.pop(request.request_id, None)
            self.constrained.release(request)

    def _logit_offsets(self, request: Request) -> list[int]:
        """The offsets of the request's active block that its rule reads logits at this step."""
        offsets = self.row_states[request.request_id].offsets
        return offsets if offsets is not None else self.rule.logit_offsets(self.batch.untouched_block(request),
                                                                           request.block_lead)

    def _run(self, inputs: StepBatch) -> dict[str, RowResult]:
        """One denoising step for every row of ``inputs``; its one host synchronisation is at the end.

        The head and the proposals run on the logit positions only, each a row of one position; their
        candidates and confidences then return to ``[rows, block]``, where the positions not computed keep
        their token and get a confidence of -inf. The rule decides what the step writes and what is final."""
        positions = inputs.positions
        hidden = self.lm.model.forward_step(inputs.refresh, inputs.window, self.batch.kv_cache)
        at = (positions.rows, positions.offsets)
        logits, (candidates, confidence) = self._propose(inputs, hidden, at)
        candidates, confidence = self.constrained.propose(inputs, logits, candidates, confidence, self._logit_offsets)
        blocks = self.batch.block_tokens(inputs.slots, inputs.block_columns)
        computed = (torch.zeros_like(blocks, dtype=torch.bool).index_put_(at, torch.ones_like(positions.rows,
                                                                                             dtype=torch.bool))
                    if self.rule.reads_unmasked else None)
        scores = confidence.new_full(blocks.shape, float("-inf")).index_put_(at, confidence.view(-1))
        view = BlockView(tokens=blocks, candidates=blocks.index_put(at, candidates.view(-1)), confidence=scores,
                         computed=computed, step_in_block=inputs.step_in_block,
                         row_inputs=self.rule.row_inputs([self.row_states[r.request_id] for r in inputs.rows],
                                                         [r.params for r in inputs.rows], blocks),
                         logits=(logits, at) if self.rule.reads_logits else None)
        update = self.constrained.keep_runs(view, self.rule.step(view))
        if inputs.logprobs is not None:
            self._record_logprobs(inputs, logits, candidates, update.written)
        self.batch.write_blocks(inputs.slots, inputs.block_columns, update.tokens)
        host = self.rule.host_columns(update).tolist()  # the one sync
        self.constrained.settle(inputs, host)
        results = {}
        for request, values, lead in zip(inputs.rows, host, inputs.leads):
            row = self.rule.read_block(values, lead, self.stop_ids if request.params.stop_at_eos else None)
            self.rule.after_step(self.row_states[request.request_id], row, lead)
            results[request.request_id] = self._row_result(row, lead)
        if inputs.logprobs is not None:
            self._attach_logprobs(inputs, results)
        return results

    def _propose(self, inputs: StepBatch, hidden: torch.Tensor, at: tuple[torch.Tensor, torch.Tensor]
                 ) -> tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        """The step's logits ``[positions, 1, vocab]`` (biased) and each position's candidate and confidence,
        from the sampler. A split model's greedy step whose rule ranks by probability joins no logits."""
        spans, sampler = inputs.positions.spans, self.sampler
        if self.lm.shard.is_split and self.rule.measure == "probability" and not self.rule.reads_logits and (
                inputs.bias is None and inputs.sampled is None and inputs.logprobs is None):
            local = self.lm.model.logits(hidden, at, spans, local=True).unsqueeze(1)
            return None, sampler.split_greedy(local, self.lm.shard, self.lm.model.lm_head.first, self.lm.vocab_size)
        logits = sampler.biased(self.lm.model.logits(hidden, at, spans).unsqueeze(1), inputs.bias)
        sampling = self._sampling(inputs, logits.shape[-1])
        candidates, confidence = sampler.propose(logits, sampling)
        if self.parts.seeds_greedily and sampling is not None:
            candidates = greedy_block_starts(inputs.positions.offsets, logits, candidates, sampler.mask_id)
        return logits, (candidates, confidence)

    def _sampling(self, inputs: StepBatch, vocab_size: int) -> Sampling | None:
        """The draws of the sampled positions (None: every row is greedy)."""
        sampled = inputs.sampled
        if sampled is None:
            return None
        return self.sampler.sampling(sampled.positions, sampled.temperatures, sampled.noise_keys, sampled.filters,
                                     vocab_size)

    def _row_result(self, row: RowStep, lead: int) -> RowResult:
        """A row's step as a RowResult: once its block is final, the block's answer tokens (after its ``lead``
        prompt tokens) and their first stop token."""
        if not row.final:
            return RowResult(False, None, None, counters=row.counters)
        tokens = row.tokens[lead:]
        return RowResult(True, first_stop(tokens, self.lm.special_ids.stop_ids), tokens, counters=row.counters)

    def _record_logprobs(self, inputs: StepBatch, logits: torch.Tensor, candidates: torch.Tensor,
                         written: torch.Tensor) -> None:
        """The log-probabilities of the positions written now, for the rows that asked (``logits`` already
        hold the rows' logit bias); a position written again (an edit) reports its last token's."""
        asked = inputs.logprobs
        chosen, top_values, top_ids = self.sampler.logprobs(logits[asked.positions], candidates[asked.positions],
                                                            asked.num_top)
        self.batch.logprob_buffer().write(inputs.slots[asked.position_rows], asked.position_offsets,
                                          written[asked.position_rows, asked.position_offsets],
                                          chosen.view(-1), top_values[:, 0], top_ids[:, 0])

    def _attach_logprobs(self, inputs: StepBatch, results: dict[str, RowResult]) -> None:
        """Completed blocks of rows that asked get their positions' log-probabilities (a second host
        copy, made only for such rows)."""
        asked = inputs.logprobs
        rows, slots, num_top = asked.rows, asked.slots, asked.num_top
        buffer = self.batch.logprob_buffer()
        chosen, values, ids = (buffer.chosen[slots].tolist(), buffer.top_values[slots, :, :num_top].tolist(),
                               buffer.top_ids[slots, :, :num_top].tolist())
        for index, row in enumerate(rows):
            request_id = inputs.request_ids[row]
            result = results[request_id]
            if result.block_tokens is None:
                continue
            wanted, lead = asked.counts[index], inputs.leads[row]
            block = [TokenLogprob(token, logprob, tuple(zip(ids[index][j][:wanted], values[index][j][:wanted])))
                     for j, (token, logprob) in enumerate(zip(result.block_tokens, chosen[index][lead:]), start=lead)]
            results[request_id] = dataclasses.replace(result, block_logprobs=block)
