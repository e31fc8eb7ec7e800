"""The anchored rows' side of a span step (Nemotron-Labs-Diffusion): one span per row, logits at its rule's offsets.

Each row's rule plans one span a step (``engine.rules.spans``); ``AnchoredRows`` runs every row's span in one
forward (``AnchoredTransformer.run_spans``) and carries out what the rule reads back:

* a **store** writes its pending tokens' keys and values: the prompt when it joins, then each finished
  block. Causally (``causal_context``), its last position's argmax seeds the next block; an
  autoregressive row's store is its whole step, its argmax the next token;
* a **denoising** step runs the active block bidirectionally over the stored context, and the decoding
  rule (``threshold``) commits its masks. A block is complete when the rule makes it final, or once it
  holds a stop token with no mask before it (the checkpoint's own loop stops there);
* under ``linear_spec`` a row **drafts** its next block bidirectionally, then **verifies** it with one causal
  store, accepts the run the rule counts and keeps the cache up to it (its context ends there).

The scheduler sees a completed block per finished block, per autoregressive token, or per accepted run.
"""
from __future__ import annotations

import time

import torch

from engine.config import EngineConfig
from engine.models.anchored.spans import SpanStep
from engine.models.kv_cache import KVCache
from engine.models.loader import DiffusionLM
from engine.rules.base import BlockView, DecodingRule
from engine.rules.spans import SpanPlan
from engine.runner.memory_model import MemoryModel, cache_bytes, element_bytes, weight_bytes
from engine.runner.prefix_cache import PAGE_LENGTH, PrefixCache
from engine.runner.sampler import Sampler, spans_bias
from engine.runner.slots import SlotAllocator
from engine.runner.span_rows import Span, SpanRow, joining_row, planned_spans
from engine.scheduling.model_fit import block_length_for
from engine.scheduling.outputs import RowResult, RunnerOutput, SchedulerOutput
from engine.scheduling.request import Request, TokenLogprob, first_stop
from engine.scheduling.trace import ForwardRecord


class AnchoredRows:
    """Anchored rows' cache, plans, forward and reading, for the runner."""

    rows_per_chunk = None  # a step's logits are its rows' offsets, a block each at most
    page_length = PAGE_LENGTH

    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int, rule: DecodingRule,
                 slots: SlotAllocator[Request], sampler: Sampler):
        self.lm, self.model, self.rule, self.sampler = lm, lm.model, rule, sampler
        self.block_length = config.block_length
        self.causal_context = config.causal_context
        self.mask_id, self.stop_ids = lm.special_ids.mask_id, lm.special_ids.stop_ids
        self.cache = KVCache(self.model.config.cache_spec(max_row_width + 1), slots.num_slots, lm.dtype, lm.device)
        self.rows: dict[str, SpanRow] = {}

    @staticmethod
    def memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
        """Every layer's keys and values for each slot's columns; a step holds its spans' activations, their
        attention box and the float32 logits of the positions its rows read (a block each)."""
        model_config, element = lm.model.config, element_bytes(lm)
        width = config.resolved_max_model_len(lm.max_length)
        per_token = 6 * model_config.hidden_size + 3 * model_config.intermediate_size + model_config.num_heads * width
        return MemoryModel(
            weight_bytes=weight_bytes(lm),
            arena_bytes=cache_bytes(lm, config, model_config.cache_spec(width + 1), PAGE_LENGTH),
            bytes_per_box_token=element * per_token,
            logit_bytes_per_row=(element + 8) * block_length_for(config, lm) * model_config.vocab_size)

    def reusable_pages(self, request: Request) -> int:
        """Every whole page but the prompt's last token's: a store of at least one token seeds the first block."""
        return (request.prompt_length - 1) // PAGE_LENGTH

    def admit(self, request: Request, cached: int) -> None:
        """Its row stores the prompt past its cached pages; its rule keeps no state, its bias is built per step."""
        self.rows[request.request_id] = joining_row(request, cached)

    def claim_prompts(self, prefix_cache: PrefixCache, admitted: list[Request]) -> None:
        """The pages are copied from the rows' slots after the step (``PrefixCache.fill``)."""
        prefix_cache.claim_prompts(admitted, [request.slot for request in admitted])

    def run(self, scheduled: SchedulerOutput, prefix_cache: PrefixCache | None) -> RunnerOutput:
        started = time.perf_counter()
        spans = planned_spans(self.rows, scheduled, self._plan)
        logits = self.model.run_spans(self._step(spans), self.cache, None)
        if prefix_cache is not None:
            prefix_cache.fill()
        results = self._results(spans, logits)
        return RunnerOutput(rows=results, model_time_s=time.perf_counter() - started, record=self._record(spans))

    def release(self, finished: list[Request], prefix_cache: PrefixCache | None) -> None:
        for request in finished:
            self.rows.pop(request.request_id, None)

    def _plan(self, row: SpanRow) -> SpanPlan:
        return self.rule.plan_span(row.pending, row.block, self.causal_context)

    # -- the step's inputs -----------------------------------------------------------------------------
    def _step(self, spans: list[Span]) -> SpanStep:
        logit_index, offset = [], 0
        for span in spans:
            logit_index += [offset + index for index in span.logit_offsets]
            offset += len(span.tokens)
        device = self.lm.device
        return SpanStep(torch.tensor([t for span in spans for t in span.tokens], device=device),
                        tuple(span.row.slot for span in spans), tuple(span.row.context for span in spans),
                        tuple(len(span.tokens) for span in spans), tuple(span.causal for span in spans),
                        torch.tensor(logit_index, dtype=torch.long, device=device))

    # -- what the step did ------------------------------------------------------------------------------
    def _results(self, spans: list[Span], logits: torch.Tensor) -> dict[str, RowResult]:
        """Each row's new tokens from its (biased) logits, with one host copy for the whole step, and one more
        for the log-probabilities of rows that ask for them."""
        bias = spans_bias([span.request.params.logit_bias for span in spans],
                          [len(span.logit_offsets) for span in spans], logits.shape[-1], logits.device)
        if bias is not None:  # before everything: every decision sees the biased logits
            logits = self.sampler.biased(logits[:, None], bias)[:, 0]
        pieces, start = [], 0
        for span in spans:
            pieces.append(logits[start:start + len(span.logit_offsets)])
            start += len(span.logit_offsets)
        host = self._decide(spans, pieces)
        logprobs = self._logprobs(spans, pieces, host)
        return {span.request.request_id: self._advance(span, values, row_logprobs)
                for span, values, row_logprobs in zip(spans, host, logprobs)}

    def _logprobs(self, spans: list[Span], pieces: list[torch.Tensor], host: list[list[int]]
                  ) -> list[list[TokenLogprob] | None]:
        """Per row that asks: each computed position's token's log-probability and its top alternatives."""
        asked = [i for i, span in enumerate(spans)
                 if span.request.params.logprobs is not None and host[i] and span.kind != "draft"]
        out: list[list[TokenLogprob] | None] = [None] * len(spans)
        for i in asked:
            span, num_top = spans[i], spans[i].request.params.logprobs
            computed = host[i] if span.kind != "denoise" else [host[i][offset] for offset in span.logit_offsets]
            tokens = torch.tensor(computed, device=pieces[i].device)
            chosen, values, ids = (t[0].tolist() for t in self.sampler.logprobs(pieces[i][None], tokens[None],
                                                                                num_top))
            out[i] = [TokenLogprob(token, logprob, tuple(zip(top_ids, top_values)))
                      for token, logprob, top_ids, top_values in zip(computed, chosen, ids, values)]
        return out

    def _decide(self, spans: list[Span], pieces: list[torch.Tensor]) -> list[list[int]]:
        """Per row on the device, then copied once: a store's next token, a verify's argmax run, a denoising
        or drafting step's block.

        A next token (a store's, a verify's) is drawn at the position it predicts with noise step 0: a verified
        speculative token gets the noise its autoregressive step would use, from the same distribution, so
        sampled ``linear_spec`` gives sampled ``autoregressive``'s tokens too."""
        denoising = [i for i, span in enumerate(spans) if span.kind in ("denoise", "draft")]
        decided: dict[int, torch.Tensor] = {}
        nexts = [i for i, span in enumerate(spans) if span.kind in ("store", "verify") and span.logit_offsets]
        greedy = [i for i in nexts if spans[i].request.params.temperature == 0.0]
        if greedy:  # one argmax for every greedy row's next tokens
            tokens = self.sampler.greedy_tokens(torch.cat([pieces[i] for i in greedy]))
            for i, row_tokens in zip(greedy, tokens.split([len(pieces[i]) for i in greedy])):
                decided[i] = row_tokens
        for i in nexts:
            if i not in decided:  # the positions its tokens are for
                span = spans[i]
                after = span.row.context + 1 + torch.tensor(span.logit_offsets, device=self.lm.device)
                decided[i] = self.sampler.sampled_tokens(pieces[i], span.request.params, span.request.seed, after)
        if denoising:
            for i, row_tokens in zip(denoising, self._denoise([spans[i] for i in denoising],
                                                              [pieces[i] for i in denoising])):
                decided[i] = row_tokens[:len(spans[i].tokens)]
        flat = [decided.get(i, torch.empty(0, dtype=torch.long, device=self.lm.device)) for i in range(len(spans))]
        lengths = [len(piece) for piece in flat]
        values = torch.cat(flat).tolist() if flat else []
        out, start = [], 0
        for length in lengths:
            out.append(values[start:start + length])
            start += length
        return out

    def _denoise(self, spans: list[Span], pieces: list[torch.Tensor]) -> torch.Tensor:
        """The denoising and drafting rows' blocks after this step, ``[rows, widest block]``.

        Each row's logits are its rule's offsets only (``logit_positions`` rows of one position each); their
        candidates and confidences return to ``[rows, block]``, where the positions not computed keep their
        token and get a confidence of -inf, and the rule decides what the step writes. A sampled row's draws
        are keyed by its count of denoising and drafting steps, from 1, and each position's place in the row."""
        device = self.lm.device
        width = max(len(span.tokens) for span in spans)  # drafts near an answer's end are shorter
        padding = self.stop_ids[0]  # a token the rule never rewrites: a padded position commits nothing
        blocks = torch.tensor([span.tokens + [padding] * (width - len(span.tokens)) for span in spans], device=device)
        owners = [row for row, span in enumerate(spans) for _ in span.logit_offsets]
        at = (torch.tensor(owners, dtype=torch.long, device=device),
              torch.tensor([offset for span in spans for offset in span.logit_offsets], dtype=torch.long,
                           device=device))
        logits = torch.cat(pieces)[:, None]  # [positions, 1, vocab]
        contexts = torch.tensor([span.row.context for span in spans], device=device)
        owning = [spans[row] for row in owners]
        sampling = self.sampler.rows_sampling([span.request.params for span in owning],
                                              [span.request.seed for span in owning],
                                              [span.row.block_draws + 1 for span in owning],
                                              (contexts[at[0]] + at[1])[:, None], logits.shape[-1])
        candidates, confidence = self.sampler.propose(logits, sampling)
        candidates = blocks.index_put(at, candidates.view(-1))
        confidence = confidence.new_full(blocks.shape, float("-inf")).index_put(at, confidence.view(-1))
        steps = torch.tensor([span.request.step_in_block for span in spans], device=device)
        return self.rule.step(BlockView(blocks, candidates, confidence, None, steps)).tokens

    def _advance(self, span: Span, values: list[int], logprobs: list[TokenLogprob] | None) -> RowResult:
        """Carry out what the row's rule reads from its step (``SpanReading``)."""
        row, denoised = span.row, span.kind in ("denoise", "draft")
        stop_ids = self.stop_ids if span.request.params.stop_at_eos else None
        reading = self.rule.read_span(span.plan, span.tokens, values, stop_ids)
        emitted_logprobs = logprobs[:len(reading.emitted)] if logprobs and reading.emitted is not None else None
        if denoised:
            if logprobs and span.kind == "denoise":  # a position's log-probability is the one it was written at
                computed = dict(zip(span.logit_offsets, logprobs))
                row.block_logprobs = [computed[j] if j in computed and values[j] != token else kept
                                      for j, (token, kept) in enumerate(zip(span.tokens, row.block_logprobs))]
                emitted_logprobs = row.block_logprobs
            row.block_draws += 1
        row.context, row.pending, row.block = row.context + reading.kept, reading.pending or [], reading.block
        result = (self._report(row, reading.emitted, emitted_logprobs, denoised) if reading.emitted is not None
                  else RowResult(False, None, None, denoised=denoised))
        if reading.seed is not None:
            self._start_block(row, reading.seed)
            if reading.emitted is None:  # the seed's log-probability opens the block's
                row.block_logprobs = (logprobs or [None])[:1] + [None] * (len(row.block) - 1)
        return result

    def _start_block(self, row: SpanRow, seed: list[int]) -> None:
        """The next active block: its seed, then masks. A row that drafts to its budget drafts no further than
        its answer can use (greedy speculation is lossless, so a shorter draft changes no token)."""
        length = self.block_length
        if self.rule.drafts_to_budget:
            length = max(1, min(length, row.max_new_tokens - row.generated + len(seed)))
        row.block = seed + [self.mask_id] * (length - len(seed))

    def _report(self, row: SpanRow, tokens: list[int], logprobs: list[TokenLogprob] | None,
                denoised: bool) -> RowResult:
        row.generated += len(tokens)
        return RowResult(True, first_stop(tokens, self.stop_ids), tokens, logprobs, denoised=denoised)

    @staticmethod
    def _record(spans: list[Span]) -> ForwardRecord:
        stores = [span for span in spans if span.kind == "store"]
        others = [span for span in spans if span.kind != "store"]
        store_width = max((len(span.tokens) for span in stores), default=0)
        other_width = max((len(span.tokens) for span in others), default=0)
        return ForwardRecord(
            refresh_rows=len(stores), refresh_width=store_width, window_rows=len(others), window_tokens=other_width,
            window_context=max((span.row.context + len(span.tokens) for span in others), default=0),
            logit_positions=sum(len(span.logit_offsets) for span in spans),
            real_tokens=sum(span.row.context + len(span.tokens) for span in spans),
            refresh_pad_tokens=sum(store_width - len(span.tokens) for span in stores),
            window_pad_tokens=sum(other_width - len(span.tokens) for span in others))
