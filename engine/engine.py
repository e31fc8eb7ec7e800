"""BlockServeEngine: the loop. schedule -> execute one denoising step of the mixed batch -> update."""
from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.config import EngineConfig, SamplingParams
from engine.executor import SingleProcessExecutor, executor_for
from engine.models.loader import DiffusionLM, load_model
from engine.models.prompts import Prompt, PromptTooLongError, encode_prompt
from engine.rules import rule_for
from engine.runner.memory import check_arena_fits
from engine.runner.runner import Runner
from engine.scheduling.admission import AdmissionError, AdmissionLimits
from engine.scheduling.model_fit import config_for_model
from engine.scheduling.outputs import RunnerOutput, SchedulerOutput, StepReport
from engine.scheduling.request import Request, RequestOutput, RequestStatus, TokenLogprob
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.stats import EngineStats, StatsCollector
from engine.structured.grammars import Grammars


class BlockServeEngine:
    def __init__(self, lm: DiffusionLM, config: EngineConfig | None = None):
        self.lm = lm
        self.config = config_for_model(config or EngineConfig(), lm)
        self.token_budget = self.config.resolved_token_budget(lm.max_length)
        self.max_row_width = self.config.resolved_max_model_len(lm.max_length)
        self.rule = rule_for(self.config, lm.special_ids.mask_id, lm.logit_shift)
        self.scheduled_block = self.rule.scheduled_block(self.config.block_length)  # one scheduler block's tokens
        self.grammars = Grammars(lm, self.rule)
        self.limits = AdmissionLimits(self.scheduled_block, lm.vocab_size, lm.max_length,
                                      self.token_budget, self.max_row_width, lm.layout, self._request_problem,
                                      self.config.gen_length)
        check_arena_fits(lm, self.config)  # before allocating: a batch that cannot fit fails by name
        self.runner = Runner(lm, self.config, self.max_row_width, self.rule)
        prefix_cache = self.runner.prefix_cache
        self.scheduler = Scheduler(self.config, self.token_budget, self.max_row_width,
                                   prefix_cache.index if prefix_cache is not None else None)
        self.stats_collector = StatsCollector(self.config.max_batch_size)
        self._requests: dict[str, Request] = {}
        self._early_outputs: list[RequestOutput] = []  # rejected or aborted while pending
        self._sequence = itertools.count()
        self._seed_source = random.Random(0)
        # rank 0 of a split model starts the other ranks, each building this class on its share
        self.executor: SingleProcessExecutor = executor_for(lm, config or EngineConfig(), type(self))

    def close(self) -> None:
        """Stop the worker ranks of a split engine and leave its process group (nothing to do on one device)."""
        self.executor.close()

    def __enter__(self) -> BlockServeEngine:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @classmethod
    def from_pretrained(cls, model: str | Path, config: EngineConfig | None = None,
                        device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                        compile: bool = False, batch_invariant: bool = False) -> BlockServeEngine:
        """An engine on a model loaded with :func:`load_model`'s options ``compile`` and ``batch_invariant``
        (rank 0's share of it when ``config.tensor_parallel_size`` > 1: the engine starts the other ranks)."""
        size = config.tensor_parallel_size if config is not None else 1
        quantization = config.quantization if config is not None else None
        return cls(load_model(model, device=device, dtype=dtype, compile=compile, batch_invariant=batch_invariant,
                              tensor_parallel_size=size, quantization=quantization), config)

    # -- requests ----------------------------------------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a request. Bad input does not raise: the request finishes with finish_reason "error"
        and the message of the :class:`AdmissionError` that ``tokenize`` / ``check`` raise.
        ``arrival_time``: when the caller received it (default: now), the start of its queue time."""
        number = next(self._sequence)
        request_id = str(request_id) if request_id is not None else f"req-{number}"
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = params if params is not None else SamplingParams()
        request = Request(request_id=request_id, prompt_token_ids=[], params=params,
                          block_length=self.scheduled_block,
                          arrival_time=arrival_time if arrival_time is not None else time.time(),
                          sequence_number=number)
        self._requests[request_id] = request
        try:
            self._prepare(request, prompt)
        except AdmissionError as error:
            request.error = str(error)
            request.status = RequestStatus.FINISHED_ERROR
            if error.param.startswith("structured_outputs"):
                self.stats_collector.count("constraints_refused")
            self._early_outputs.append(self._finish(request))
        else:
            self.scheduler.add(request)
        self.executor.add_request(prompt, params, request_id, request.arrival_time)
        return request_id

    def tokenize(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """The prompt's token ids; AdmissionError if the settings are invalid or the prompt cannot be
        one or cannot fit beside its canvas (a text too long is refused before it is tokenized)."""
        self.limits.check_params(params)
        self.limits.check_canvas(params)
        room = self.limits.prompt_room(params)
        try:
            return encode_prompt(self.lm.tokenizer, prompt, self.lm.vocab_size, max_tokens=room)
        except PromptTooLongError as error:
            raise AdmissionError(f"{error} beside a canvas of {self.limits.canvas_tokens(params)} tokens in a "
                                 f"row of at most {self.max_row_width}", "prompt", too_long=True) from None
        except ValueError as error:
            raise AdmissionError(str(error), "prompt") from None
        except Exception as error:  # a tokenizer failure on odd input is still this request's problem
            raise AdmissionError(f"could not tokenize prompt: {type(error).__name__}: {error}", "prompt") from None

    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise the AdmissionError this engine gives a request of these tokens and settings that could
        never run (invalid settings, a row wider than the model, the token budget or max_model_len)."""
        self.limits.check_params(params)
        self.limits.check_canvas(params)
        self.limits.check_width(len(prompt_ids), params)
        images = sorted(set(prompt_ids) & set(self.lm.image_token_ids))
        if images:
            raise AdmissionError(f"the prompt holds image token(s) {images}: {self.lm.layout.family} is served text "
                                 "only (its vision tower is not loaded)", "prompt")

    def _prepare(self, request: Request, prompt: Prompt) -> None:
        """Tokenize and size the request; AdmissionError if it can never run."""
        request.prompt_token_ids = self.tokenize(prompt, request.params)
        canvas = self.limits.canvas_length(request.params)
        layout, prompt_length, block = self.lm.layout, request.prompt_length, self.scheduled_block
        request.lead, request.own_canvas_blocks = layout.answer_blocks(prompt_length, canvas, block)
        _, request.cap_blocks = layout.answer_blocks(prompt_length, min(canvas, request.params.max_new_tokens), block)
        request.canvas_blocks = request.own_canvas_blocks
        request.seed = request.params.seed if request.params.seed is not None else (
            self._seed_source.getrandbits(31))
        self.check(request.prompt_token_ids, request.params)
        request.grammar = self.grammars.compiled(request.params)  # compiled by the check above: a cache hit

    def _request_problem(self, params: SamplingParams) -> str | None:
        """Why the engine's rule or its grammars cannot run ``params``, naming the field (None: they can)."""
        return self.rule.request_problem(params) or self.grammars.problem(params)

    def abort_request(self, request_id: str) -> None:
        """A pending request leaves now; a running one leaves when its current block is complete
        (at the next block boundary for the block-cycle schedules)."""
        request = self._requests.get(request_id)
        if request is None or request.is_finished:
            return
        self.executor.abort_request(request_id)
        if self.scheduler.remove_pending(request_id) is not None:
            request.abort_requested = True
            request.status = RequestStatus.FINISHED_ABORT
            self._early_outputs.append(self._finish(request))
        else:
            request.abort_requested = True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work() or bool(self._early_outputs)

    @property
    def num_pending(self) -> int:
        return self.scheduler.num_pending

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- the loop ----------------------------------------------------------------------------------
    def step(self) -> StepReport:
        """Run ONE denoising step; return what it did: the requests that finished at its end (and any
        rejected), and the new output tokens of each row whose block it completed. A split engine's step
        raises TensorParallelError when another rank has died or stopped answering."""
        return self.executor.step(time.time(), self.step_at)

    def step_at(self, now: float) -> StepReport:
        """:meth:`step` as if the clock read ``now`` (every rank of a split engine schedules at rank 0's)."""
        started = time.perf_counter()
        scheduled = self.scheduler.schedule(now)
        output = self.runner.execute(scheduled)
        self._account(scheduled, output)
        update = self.scheduler.update(output)
        self.runner.release(update.finished)
        finished, self._early_outputs = self._early_outputs, []
        finished += [self._finish(request) for request in update.finished]
        self.stats_collector.add_elapsed(time.perf_counter() - started)
        return StepReport(finished=finished, new_token_ids=update.new_token_ids,
                          admitted=tuple(request.request_id for request in scheduled.admitted), scheduled_time=now,
                          num_rows=output.record.rows, bounding_box_tokens=output.record.bounding_box_tokens)

    def wait_s(self, now: float) -> float:
        """Seconds to hold the next step back: positive only while a static batch is still collecting."""
        return self.scheduler.wait_s(now)

    def _account(self, scheduled: SchedulerOutput, output: RunnerOutput) -> None:
        """Stats of a step that ran rows, taken before its results change the requests."""
        if not scheduled.num_rows:
            return
        rows = (*scheduled.starting, *scheduled.continuing)
        self.stats_collector.record_step(
            output.record, useful_rows=sum(request.adds_to_output for request in rows),
            unfinished_requests=sum(request.adds_to_output for request in self.scheduler.running),
            pending_requests=self.scheduler.num_pending,
            blocks_completed=sum(result.block_complete for result in output.rows.values()),
            model_time_s=output.model_time_s, row_forwards=len(output.rows),
            counters=[result.counters for result in output.rows.values() if result.counters])

    def _finish(self, request: Request) -> RequestOutput:
        request.finish_time = time.time()
        token_ids = request.output_token_ids
        if request.status != RequestStatus.FINISHED_ERROR:
            self.stats_collector.record_finished(len(token_ids), request.prompt_length, request.cached_prefix)
            if request.grammar is not None:
                self.stats_collector.count("constrained_requests")
        del self._requests[request.request_id]
        return RequestOutput(
            request_id=request.request_id, prompt_token_ids=list(request.prompt_token_ids),
            token_ids=list(token_ids),
            text=self.lm.tokenizer.decode(token_ids, skip_special_tokens=True) if token_ids else "",
            finish_reason=request.status.finish_reason, error=request.error,
            num_blocks=request.output_blocks, num_steps=request.num_steps,
            arrival_time=request.arrival_time, first_scheduled_time=request.first_scheduled_time,
            finish_time=request.finish_time, logprobs=self._output_logprobs(request),
            num_cached_tokens=request.cached_prefix)

    @staticmethod
    def _output_logprobs(request: Request) -> list[TokenLogprob] | None:
        """One per output token, when the request asked for them."""
        if request.params.logprobs is None or request.status == RequestStatus.FINISHED_ERROR:
            return None
        return list(request.output_logprobs)

    # -- conveniences ------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in input order."""
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        ids = [self.add_request(prompt, p) for prompt, p in zip(prompts, params)]
        outputs: dict[str, RequestOutput] = {}
        progress = None
        if use_tqdm:
            from tqdm.auto import tqdm

            progress = tqdm(total=len(ids), desc="generating", unit="req")
        while len(outputs) < len(ids):
            finished = self.step().finished
            for output in finished:
                outputs[output.request_id] = output
            if progress is not None:
                progress.update(len(finished))
        if progress is not None:
            progress.close()
        return [outputs[request_id] for request_id in ids]

    def stats(self) -> EngineStats:
        return self.stats_collector.snapshot()

    def reset_stats(self) -> None:
        self.stats_collector = StatsCollector(self.config.max_batch_size)
