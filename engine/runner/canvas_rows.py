"""The canvas rows' side of a span step (DiffusionGemma): a store of each row's pending context, then its canvas.

Every running row denoises its own canvas at its own step. Its rule plans the step (``CanvasRule.plan_canvas``):
a row whose canvas is new (admitted, or its last canvas just committed) draws it from its generator, and stores
its new context, the prompt or that committed canvas, in the same forward (``DiffusionGemma.run_spans``). A
canvas that stops early completes at that step; the scheduler then lets the row leave or start its next canvas
at the next step, so no row waits.

The model returns the canvases' hidden states; the head, the sampler and the self-conditioning then run
over chunks of ``rows_per_chunk`` rows, so a step's vocabulary-sized temporaries are one chunk's,
whatever its batch. Each row draws from its own generator, so cutting a batch into chunks changes no draw.
The rule draws with those generators, as transformers' seeded generate defines the result; the shared
sampler (``engine.runner.sampler``) gives the rest. A request's logit bias is added to its logits before the
rule reads them, where transformers' generate applies a caller's ``logits_processor``: the draw, the entropies,
the stop and the self-conditioning all see it. A request that asks for log-probabilities gets, per committed
token, its log-probability under the biased logits of the step that committed the canvas, without the
temperature, over every token (its canvas may hold any).
With prefix caching a joining row's prompt starts from its cached pages, and its store fills the pages it lacks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.config import EngineConfig, SamplingParams
from engine.models.diffusion_gemma.step import CanvasStep, DecodePart, StorePart
from engine.models.kv_cache import KVCache
from engine.models.loader import DiffusionLM
from engine.rules import rule_class
from engine.rules.base import CanvasRule
from engine.rules.spans import SpanPlan
from engine.runner.logit_processors import RowBias, dense_bias
from engine.runner.memory_model import INDEX_BYTES, MemoryModel, cache_bytes, element_bytes, weight_bytes
from engine.runner.prefix_cache import PAGE_LENGTH, PrefixCache
from engine.runner.sampler import Sampler
from engine.runner.slots import SlotAllocator
from engine.runner.span_rows import Span, SpanRow, joining_row, planned_spans
from engine.scheduling.model_fit import block_length_for
from engine.scheduling.outputs import RowResult, RunnerOutput, SchedulerOutput
from engine.scheduling.request import Request, TokenLogprob, first_stop
from engine.scheduling.trace import ForwardRecord

# A chunk's float32 logits [rows, canvas, vocab] hold at most this many elements (512 MiB), at least one
# row's. At the release's canvas of 256 and vocabulary of 262,144: two rows, whose 512 positions keep the
# head's and the self-conditioning's matmuls over the 1.5 GB embedding compute-bound on an H100 (the
# ridge is near 300 positions), with 1.5 GiB of temporaries at once (the rule's vocab_copies float32 copies).
VOCAB_CHUNK_ELEMENTS = 2**27


def rows_per_chunk(canvas_length: int, vocab_size: int) -> int:
    """Rows whose vocabulary-sized temporaries a step holds at once."""
    return max(1, VOCAB_CHUNK_ELEMENTS // (canvas_length * vocab_size))


@dataclass
class CanvasLogprobs:
    """A chunk's asking rows at this step: their argmax canvases, what each commits if it completes now,
    and those tokens' log-probabilities."""

    rows: list[int]  # the asking rows, as indices into the step's rows
    tokens: torch.Tensor  # [asking, canvas] the argmax canvas
    chosen: torch.Tensor  # [asking, canvas] its tokens' log-probabilities
    top_values: torch.Tensor  # [asking, canvas, num_top] the most likely tokens' log-probabilities
    top_ids: torch.Tensor  # [asking, canvas, num_top] and their ids


class CanvasRows:
    """Canvas rows' cache, canvases, plans, forward and reading, for the runner. A slot's canvas, its
    self-conditioning and its rule's history of argmax canvases live in ``[slots, ...]`` device tensors."""

    page_length = PAGE_LENGTH

    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int, rule: CanvasRule,
                 slots: SlotAllocator[Request], sampler: Sampler):
        self.lm, self.model, self.rule = lm, lm.model, rule
        self.sampler = sampler  # bias and log-probabilities; the rule draws
        self.length = config.block_length
        num_slots, device = slots.num_slots, lm.device
        self.cache = KVCache(self.model.config.cache_spec(max_row_width), num_slots, lm.dtype, device)
        self.canvas = torch.zeros((num_slots, self.length), dtype=torch.long, device=device)
        self.soft = torch.zeros((num_slots, self.length, self.model.config.hidden_size), dtype=lm.dtype,
                                device=device)
        self.history = self.rule.empty_history(num_slots, self.length, device)
        self.rows_per_chunk = rows_per_chunk(self.length, lm.vocab_size)
        self.rows: dict[str, SpanRow] = {}

    @staticmethod
    def memory_model(lm: DiffusionLM, config: EngineConfig) -> MemoryModel:
        """Sliding layers keep a ring of ``sliding_window - 1`` columns, global layers every column, and each slot
        its canvas, history and self-conditioning; a step holds one chunk of rows' canvas logits at a time
        (``rows_per_chunk``). The prefix cache's pages keep every layer's columns."""
        model_config, element = lm.model.config, element_bytes(lm)
        slots, width = config.max_batch_size, config.resolved_max_model_len(lm.max_length)
        canvas = block_length_for(config, lm)
        state = slots * canvas * (model_config.hidden_size * element + 2 * INDEX_BYTES)
        widest_head = max(shape.num_kv_heads * shape.head_dim for shape in model_config.layers)
        hidden, heads = model_config.hidden_size, model_config.num_heads
        per_token = 8 * hidden + 3 * model_config.intermediate_size + heads * width + 4 * widest_head
        per_token += model_config.experts_per_token * (3 * model_config.moe_intermediate_size + 2 * hidden)
        return MemoryModel(
            weight_bytes=weight_bytes(lm),
            arena_bytes=cache_bytes(lm, config, model_config.cache_spec(width), PAGE_LENGTH) + state,
            bytes_per_box_token=element * per_token,
            # the family's sampler's float32 copies of the vocabulary per canvas position, for one chunk of rows
            logit_bytes_per_row=rule_class(lm.layout.own_rule).vocab_copies * 4 * canvas * model_config.vocab_size,
            logit_rows=rows_per_chunk(canvas, model_config.vocab_size))

    def reusable_pages(self, request: Request) -> int:
        return request.prompt_length // PAGE_LENGTH

    def admit(self, request: Request, cached: int) -> None:
        """Its row stores the prompt past its cached pages, with its rule's state (the generator seeded by the
        request) and its request's dense logit bias."""
        row = self.rows[request.request_id] = joining_row(request, cached)
        row.state = self.rule.new_canvas_row(request.seed, self.lm.device)
        if request.params.logit_bias:
            row.bias = dense_bias([request.params.logit_bias], self.lm.vocab_size, torch.float32, self.lm.device)[0]

    def claim_prompts(self, prefix_cache: PrefixCache, admitted: list[Request]) -> None:
        """The pages are filled by the rows' stores, in the forward (``StorePart.pages``)."""
        for request, pages in zip(admitted, prefix_cache.claim_prompts(admitted, None)):
            self.rows[request.request_id].pages = pages

    def run(self, scheduled: SchedulerOutput, prefix_cache: PrefixCache | None) -> RunnerOutput:
        started = time.perf_counter()
        spans = planned_spans(self.rows, scheduled, self._plan)
        for span in spans:
            if span.plan.draws:
                self._draw(span.row)
        step, record = self._inputs(spans)
        hidden = self.model.run_spans(step, self.cache, prefix_cache.pool if prefix_cache is not None else None)
        results = self._decode(spans, hidden)
        return RunnerOutput(rows=results, model_time_s=time.perf_counter() - started, record=record)

    def release(self, finished: list[Request], prefix_cache: PrefixCache | None) -> None:
        for request in finished:
            self.rows.pop(request.request_id, None)

    def _plan(self, row: SpanRow) -> SpanPlan:
        return self.rule.plan_canvas(row.pending, row.state)

    def _draw(self, row: SpanRow) -> None:
        """A new canvas in the row's slot, from its generator, with no history and no self-conditioning."""
        device, state = self.lm.device, row.state
        self.canvas[row.slot] = self.rule.initial_canvas(state.generator, self.length, self.lm.vocab_size, device)[0]
        self.history[row.slot] = -1
        state.conditioned = False

    def _inputs(self, spans: list[Span]) -> tuple[CanvasStep, ForwardRecord]:
        rows = [span.row for span in spans]
        storing = [span for span in spans if span.plan.stores]
        store = None
        if storing:
            tokens = torch.tensor([t for span in storing for t in span.tokens], device=self.lm.device)
            pages = tuple(span.row.pages for span in storing) if any(span.row.pages for span in storing) else ()
            store = StorePart(tokens, tuple(span.row.slot for span in storing),
                              tuple(span.row.context for span in storing), tuple(len(span.tokens) for span in storing),
                              pages)
            for span in storing:  # a store fills its prompt's pages once
                span.row.pages = ()
        contexts = tuple(span.row.context + (len(span.tokens) if span.plan.stores else 0) for span in spans)
        slots = torch.tensor([row.slot for row in rows], device=self.lm.device)
        soft = None
        if any(row.state.conditioned for row in rows):
            soft = self.soft[slots] * torch.tensor([row.state.conditioned for row in rows], device=slots.device,
                                                   dtype=self.lm.dtype)[:, None, None]
        decode = DecodePart(self.canvas[slots], tuple(row.slot for row in rows), contexts, soft)
        record = ForwardRecord(refresh_rows=len(storing), refresh_width=max(store.counts) if store else 0,
                               window_rows=len(rows), window_tokens=self.length,
                               window_context=max(decode.contexts) + self.length,
                               logit_positions=len(rows) * self.length,
                               real_tokens=sum(decode.contexts) + len(rows) * self.length,
                               refresh_pad_tokens=len(storing) * max(store.counts) - sum(store.counts) if store else 0)
        return CanvasStep(store, decode), record

    def _decode(self, spans: list[Span], hidden: torch.Tensor) -> dict[str, RowResult]:
        """Each row's result as its rule reads it, with one host copy for the whole step."""
        size, params = self.rows_per_chunk, [span.request.params for span in spans]
        num_top = max((p.logprobs for p in params if p.logprobs is not None), default=None)
        # denoising steps each canvas may still take, this one included (the request counts those taken)
        steps_left = torch.tensor([self.rule.max_denoising_steps - span.request.step_in_block for span in spans],
                                  device=hidden.device)
        chunks = [self._denoise_chunk(spans[start:start + size], hidden[start:start + size],
                                      steps_left[start:start + size], start, num_top)
                  for start in range(0, len(spans), size)]
        host = torch.cat([tokens for tokens, _ in chunks]).tolist()  # the one host sync
        logprobs = self._committed_logprobs(params, [part for _, part in chunks if part is not None], host)
        results = {}
        for index, (span, values) in enumerate(zip(spans, host)):
            row = span.row
            reading = self.rule.read_canvas(span.plan, row.state, span.tokens, values)
            row.context, row.pending = row.context + reading.kept, reading.pending or []
            if reading.emitted is None:
                results[span.request.request_id] = RowResult(False, None, None)
                continue
            tokens = reading.emitted  # stored before its next canvas
            results[span.request.request_id] = RowResult(True, first_stop(tokens, self.lm.special_ids.stop_ids),
                                                         tokens, logprobs.get(index))
        return results

    def _denoise_chunk(self, spans: list[Span], hidden: torch.Tensor, steps_left: torch.Tensor, first: int,
                       num_top: int | None) -> tuple[torch.Tensor, CanvasLogprobs | None]:
        """One chunk's head, sampler and self-conditioning, written to its rows' slots: ``[rows, canvas + 1]``,
        each row's argmax canvas and whether its canvas completes, and the asking rows' log-probabilities
        (``first``: the chunk's first row in the step). Its vocabulary-sized temporaries end here."""
        rows = [span.row for span in spans]
        slots = torch.tensor([row.slot for row in rows], device=hidden.device)
        logits = self.sampler.biased(self.model.logits(hidden), self._bias(spans))
        asking = [index for index, span in enumerate(spans) if span.request.params.logprobs is not None]
        logprobs = self._canvas_logprobs(logits, steps_left, asking, first, num_top) if asking else None
        result = self.rule.denoise(logits, self.canvas[slots], self.history[slots], steps_left,
                                  [row.state.generator for row in rows])
        self.canvas[slots], self.history[slots] = result.canvas, result.history
        self.soft[slots] = self.model.soft_embeddings(result.processed_logits)
        complete = result.stopped | (steps_left <= 1)
        return torch.cat([result.argmax, complete[:, None]], dim=1), logprobs

    def _bias(self, spans: list[Span]) -> RowBias | None:
        """The logit bias of a chunk's rows that have one (None: no row has)."""
        biased = [index for index, span in enumerate(spans) if span.row.bias is not None]
        if not biased:
            return None
        return RowBias(torch.tensor(biased, device=self.lm.device), torch.stack([spans[i].row.bias for i in biased]))

    def _canvas_logprobs(self, logits: torch.Tensor, steps_left: torch.Tensor, asking: list[int], first: int,
                         num_top: int) -> CanvasLogprobs:
        """The asking rows' argmax canvases, as the sampler will take them (``scale``, then argmax), with their
        tokens' log-probabilities under the biased logits, before the sampler scales those in place. At most
        three copies of the logits at once (the rule's ``vocab_copies``)."""
        index = torch.tensor(asking, device=logits.device)
        picked = logits if len(asking) == logits.shape[0] else logits[index]
        tokens = self.rule.scale(picked.clone(), steps_left[index]).argmax(dim=-1)
        chosen, top_values, top_ids = self.sampler.logprobs(picked, tokens, num_top)
        return CanvasLogprobs([first + index for index in asking], tokens, chosen, top_values, top_ids)

    def _committed_logprobs(self, params: list[SamplingParams], parts: list[CanvasLogprobs], host: list[list[int]]
                            ) -> dict[int, list[TokenLogprob]]:
        """Each asking row whose canvas completed (by index into the step's rows): its committed tokens'
        log-probabilities and alternatives, copied to the host only at a step where such a canvas completes."""
        asking = [index for part in parts for index in part.rows]
        completed = [position for position, index in enumerate(asking) if host[index][-1]]
        if not completed:
            return {}
        at = torch.tensor(completed, device=self.lm.device)
        tokens, chosen, values, ids = (torch.cat([getattr(part, name) for part in parts])[at].tolist()
                                       for name in ("tokens", "chosen", "top_values", "top_ids"))
        out = {}
        for position, *committed in zip(completed, tokens, chosen, values, ids):
            wanted = params[asking[position]].logprobs
            out[asking[position]] = [TokenLogprob(token, logprob, tuple(zip(top_ids[:wanted], top_values[:wanted])))
                                     for token, logprob, top_values, top_ids in zip(*committed)]
        return out
