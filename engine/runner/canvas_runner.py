"""Runs one denoising step of DiffusionGemma's canvases and owns their state. No policy.

Every running row denoises its own canvas at its own step. A row that starts a canvas (admitted, or its
last canvas just committed) first stores its new context, the prompt or that committed canvas, in the
same forward (``engine.models.diffusion_gemma.step``). A canvas that stops early completes at that step;
the scheduler then lets the row leave or start its next canvas at the next step, so no row waits.

The model returns the canvases' hidden states; the head, the sampler and the self-conditioning then run
over chunks of ``rows_per_chunk`` rows, so a step's vocabulary-sized temporaries are one chunk's,
whatever its batch. Each row draws from its own generator, so cutting a batch into chunks changes no draw.
The rule draws with those generators, as transformers' seeded generate defines the result; the shared
sampler (``engine.runner.sampler``) gives the rest. A request's logit bias is added to its logits before the
rule reads them, where transformers' generate applies a caller's ``logits_processor``: the draw, the entropies,
the stop and the self-conditioning all see it. A request that asks for log-probabilities gets, per committed
token, its log-probability under the biased logits of the step that committed the canvas, without the
temperature, over every token (its canvas may hold any).
With prefix caching a joining row's prompt starts from its cached pages (``prefix_cache``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig
from engine.models.diffusion_gemma.step import CanvasStep, DecodePart, StorePart
from engine.models.kv_cache import KVCache
from engine.models.loader import DiffusionLM
from engine.rules.base import CanvasRule
from engine.runner.logit_processors import RowBias, dense_bias
from engine.runner.prefix_cache import PAGE_LENGTH, PrefixCache, pool_pages
from engine.runner.sampler import Sampler
from engine.runner.slots import SlotAllocator
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
class CanvasRow:
    """A running request's place and draws."""

    slot: int
    generator: torch.Generator
    pending: list[int] = field(default_factory=list)  # context to store before its next canvas
    pages: tuple[int, ...] = ()  # the prefix cache's pages its next store fills (StorePart.pages)
    context: int = 0  # positions stored in its cache slot
    conditioned: bool = False  # its canvas has self-conditioning from a previous step
    bias: torch.Tensor | None = None  # [vocab] float32: its request's logit_bias
    logprobs: int | None = None  # alternatives per token its request asks for (None: no log-probabilities)


@dataclass
class CanvasLogprobs:
    """A chunk's asking rows at this step: their argmax canvases, what each commits if it completes now,
    and those tokens' log-probabilities."""

    rows: list[int]  # the asking rows, as indices into the step's rows
    tokens: torch.Tensor  # [asking, canvas] the argmax canvas
    chosen: torch.Tensor  # [asking, canvas] its tokens' log-probabilities
    top_values: torch.Tensor  # [asking, canvas, num_top] the most likely tokens' log-probabilities
    top_ids: torch.Tensor  # [asking, canvas, num_top] and their ids


class CanvasRunner:
    def __init__(self, lm: DiffusionLM, config: EngineConfig, max_row_width: int, rule: CanvasRule):
        self.lm, self.model = lm, lm.model
        self.sampler = Sampler(mask_id=None)  # bias and log-probabilities; the rule draws
        self.rule = rule
        self.length = config.block_length
        slots, device = config.max_batch_size, lm.device
        self.cache = KVCache(self.model.config.cache_spec(max_row_width), slots, lm.dtype, device)
        self.prefix_cache = (PrefixCache(self.cache, pool_pages(config, max_row_width, PAGE_LENGTH), PAGE_LENGTH)
                             if config.enable_prefix_caching else None)
        self.canvas = torch.zeros((slots, self.length), dtype=torch.long, device=device)
        self.soft = torch.zeros((slots, self.length, self.model.config.hidden_size), dtype=lm.dtype, device=device)
        self.history = self.rule.empty_history(slots, self.length, device)
        self.rows_per_chunk = rows_per_chunk(self.length, lm.vocab_size)
        self.slots: SlotAllocator[str] = SlotAllocator(slots)
        self.rows: dict[str, CanvasRow] = {}

    @torch.no_grad()
    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        for request in scheduled.admitted:
            generator = torch.Generator(device=self.lm.device).manual_seed(request.seed)
            slot = self.slots.take(request.request_id)
            cached = (self.prefix_cache.reuse(request, slot, request.prompt_length // PAGE_LENGTH)
                      if self.prefix_cache is not None else 0)
            bias = (dense_bias([request.params.logit_bias], self.lm.vocab_size, torch.float32, self.lm.device)[0]
                    if request.params.logit_bias else None)
            self.rows[request.request_id] = CanvasRow(slot, generator, pending=list(request.prompt_token_ids[cached:]),
                                                      context=cached, bias=bias, logprobs=request.params.logprobs)
        if self.prefix_cache is not None and scheduled.admitted:
            for request, pages in zip(scheduled.admitted, self.prefix_cache.claim_prompts(scheduled.admitted, None)):
                self.rows[request.request_id].pages = pages
        requests = [*scheduled.starting, *scheduled.continuing]
        if not requests:
            return RunnerOutput(rows={}, model_time_s=0.0)
        for request in scheduled.starting:
            self._start_canvas(self.rows[request.request_id])
        started = time.perf_counter()
        step, record = self._inputs(requests)
        hidden = self.model.decode_hidden(step, self.cache, self.prefix_cache.pool if self.prefix_cache else None)
        rows = self._decode([self.rows[request.request_id] for request in requests], requests, hidden)
        return RunnerOutput(rows=rows, model_time_s=time.perf_counter() - started, record=record)

    def release(self, finished: list[Request]) -> None:
        for request in finished:
            row = self.rows.pop(request.request_id, None)
            if row is not None:
                self.slots.give_back(row.slot)

    def _start_canvas(self, row: CanvasRow) -> None:
        device = self.lm.device
        self.canvas[row.slot] = self.rule.initial_canvas(row.generator, self.length, self.lm.vocab_size, device)[0]
        self.history[row.slot] = -1
        row.conditioned = False

    def _inputs(self, requests: list[Request]) -> tuple[CanvasStep, ForwardRecord]:
        rows = [self.rows[request.request_id] for request in requests]
        storing = [row for row in rows if row.pending]
        store = None
        if storing:
            tokens = torch.tensor([t for row in storing for t in row.pending], device=self.lm.device)
            pages = tuple(row.pages for row in storing) if any(row.pages for row in storing) else ()
            store = StorePart(tokens, tuple(row.slot for row in storing), tuple(row.context for row in storing),
                              tuple(len(row.pending) for row in storing), pages)
            for row in storing:
                row.context, row.pending, row.pages = row.context + len(row.pending), [], ()
        slots = torch.tensor([row.slot for row in rows], device=self.lm.device)
        soft = None
        if any(row.conditioned for row in rows):
            soft = self.soft[slots] * torch.tensor([row.conditioned for row in rows], device=slots.device,
                                                   dtype=self.lm.dtype)[:, None, None]
        decode = DecodePart(self.canvas[slots], tuple(row.slot for row in rows), tuple(row.context for row in rows),
                            soft)
        record = ForwardRecord(refresh_rows=len(storing), refresh_width=max(store.counts) if store else 0,
                               window_rows=len(rows), window_tokens=self.length,
                               window_context=max(decode.contexts) + self.length,
                               logit_positions=len(rows) * self.length,
                               real_tokens=sum(decode.contexts) + len(rows) * self.length,
                               refresh_pad_tokens=len(storing) * max(store.counts) - sum(store.counts) if store else 0)
        return CanvasStep(store, decode), record

    def _decode(self, rows: list[CanvasRow], requests: list[Request], hidden: torch.Tensor) -> dict[str, RowResult]:
        size = self.rows_per_chunk
        num_top = max((row.logprobs for row in rows if row.logprobs is not None), default=None)
        # denoising steps each canvas may still take, this one included (the request counts those taken)
        steps_left = torch.tensor([self.rule.max_denoising_steps - request.step_in_block for request in requests],
                                  device=hidden.device)
        chunks = [self._denoise_chunk(rows[start:start + size], hidden[start:start + size],
                                      steps_left[start:start + size], start, num_top)
                  for start in range(0, len(rows), size)]
        host = torch.cat([tokens for tokens, _ in chunks]).tolist()  # the one host sync
        logprobs = self._committed_logprobs(rows, [part for _, part in chunks if part is not None], host)
        results = {}
        for index, (row, request, values) in enumerate(zip(rows, requests, host)):
            row.conditioned = True
            if not values[-1]:
                results[request.request_id] = RowResult(False, None, None)
                continue
            tokens = values[:-1]
            row.pending = tokens  # stored when its next canvas starts
            results[request.request_id] = RowResult(True, first_stop(tokens, self.lm.special_ids.stop_ids), tokens,
                                                    logprobs.get(index))
        return results

    def _denoise_chunk(self, rows: list[CanvasRow], hidden: torch.Tensor, steps_left: torch.Tensor, first: int,
                       num_top: int | None) -> tuple[torch.Tensor, CanvasLogprobs | None]:
        """One chunk's head, sampler and self-conditioning, written to its rows' slots: ``[rows, canvas + 1]``,
        each row's argmax canvas and whether its canvas completes, and the asking rows' log-probabilities
        (``first``: the chunk's first row in the step). Its vocabulary-sized temporaries end here."""
        slots = torch.tensor([row.slot for row in rows], device=hidden.device)
        logits = self.sampler.biased(self.model.logits(hidden), self._bias(rows))
        asking = [index for index, row in enumerate(rows) if row.logprobs is not None]
        logprobs = self._canvas_logprobs(logits, steps_left, asking, first, num_top) if asking else None
        result = self.rule.denoise(logits, self.canvas[slots], self.history[slots], steps_left,
                         [row.generator for row in rows])
        self.canvas[slots], self.history[slots] = result.canvas, result.history
        self.soft[slots] = self.model.soft_embeddings(result.processed_logits)
        complete = result.stopped | (steps_left <= 1)
        return torch.cat([result.argmax, complete[:, None]], dim=1), logprobs

    def _bias(self, rows: list[CanvasRow]) -> RowBias | None:
        """The logit bias of a chunk's rows that have one (None: no row has)."""
        biased = [index for index, row in enumerate(rows) if row.bias is not None]
        if not biased:
            return None
        return RowBias(torch.tensor(biased, device=self.lm.device), torch.stack([rows[index].bias for index in biased]))

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

    def _committed_logprobs(self, rows: list[CanvasRow], parts: list[CanvasLogprobs], host: list[list[int]]
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
            wanted = rows[asking[position]].logprobs
            out[asking[position]] = [TokenLogprob(token, logprob, tuple(zip(top_ids[:wanted], top_values[:wanted])))
                                     for token, logprob, top_values, top_ids in zip(*committed)]
        return out
