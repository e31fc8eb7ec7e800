"""BlockServeEngine: the loop. schedule -> build the mixed batch -> run one block cycle -> evict."""
from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.batch import build_block_batch
from engine.config import EngineConfig, SamplingParams
from engine.models.loader import DiffusionLM, load_model
from engine.prompts import Prompt, encode_prompt
from engine.reference import trim_at_stop
from engine.request import Request, RequestOutput, RequestStatus
from engine.runner import ModelRunner
from engine.scheduler import Scheduler
from engine.stats import EngineStats, StatsCollector


@dataclass(frozen=True)
class BlockCycle:
    """What the last ``step()``'s block cycle did (data only): for streaming and monitoring."""

    new_token_ids: dict[str, list[int]] = field(default_factory=dict)  # request id -> tokens its
    # block added to its output (trimmed at a stop token; empty past one or past its own cap)
    num_rows: int = 0
    bounding_box_tokens: int = 0


class BlockServeEngine:
    def __init__(self, lm: DiffusionLM, config: EngineConfig | None = None):
        self.lm = lm
        self.config = config or EngineConfig()
        self.token_budget = self.config.resolved_token_budget(lm.max_length)
        self.scheduler = Scheduler(self.config, self.token_budget)
        self.runner = ModelRunner(lm, self.config)
        self.stats_collector = StatsCollector(self.config.max_batch_size)
        self._requests: dict[str, Request] = {}
        self._early_outputs: list[RequestOutput] = []  # rejected or aborted while pending
        self._sequence = itertools.count()
        self._seed_source = random.Random(0)
        self.last_cycle = BlockCycle()

    @classmethod
    def from_pretrained(cls, model: str | Path, config: EngineConfig | None = None,
                        device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                        ) -> BlockServeEngine:
        return cls(load_model(model, device=device, dtype=dtype), config)

    # -- requests ----------------------------------------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request. Bad input does not raise: the request finishes with finish_reason "error"."""
        number = next(self._sequence)
        request_id = str(request_id) if request_id is not None else f"req-{number}"
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = params if params is not None else SamplingParams()
        request = Request(request_id=request_id, prompt_token_ids=[], params=params,
                          block_length=self.config.block_length, arrival_time=time.time(),
                          sequence_number=number)
        self._requests[request_id] = request
        error = self._prepare(request, prompt)
        if error is not None:
            request.error = error
            request.status = RequestStatus.FINISHED_ERROR
            self._early_outputs.append(self._finish(request))
        else:
            self.scheduler.add(request)
        return request_id

    def _prepare(self, request: Request, prompt: Prompt) -> str | None:
        """Tokenize and size the request; return an error message if it can never run."""
        if not isinstance(request.params, SamplingParams):
            return f"params must be SamplingParams, got {type(request.params).__name__}"
        problem = request.params.validation_error()
        if problem:
            return problem
        try:
            request.prompt_token_ids = encode_prompt(self.lm.tokenizer, prompt, self.lm.vocab_size)
        except ValueError as error:
            return str(error)
        except Exception as error:  # a tokenizer failure on odd input is still this request's problem
            return f"could not tokenize prompt: {type(error).__name__}: {error}"
        request.cap_blocks = -(-request.params.max_new_tokens // self.config.block_length)
        request.canvas_blocks = request.cap_blocks
        request.seed = request.params.seed if request.params.seed is not None else (
            self._seed_source.getrandbits(31))
        if request.own_width > self.lm.max_length:
            return (f"prompt ({request.prompt_length} tokens) + canvas ({request.cap_blocks} blocks of "
                    f"{self.config.block_length}) exceeds the model's maximum length {self.lm.max_length}")
        if request.own_width > self.token_budget:
            return (f"request needs a row of {request.own_width} tokens, more than the whole token "
                    f"budget ({self.token_budget}); it can never be scheduled")
        return None

    def abort_request(self, request_id: str) -> None:
        """A pending request leaves now; a running one is evicted at the next block boundary."""
        request = self._requests.get(request_id)
        if request is None or request.is_finished:
            return
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
    def step(self) -> list[RequestOutput]:
        """Run ONE block cycle; return the requests that finished at its end (and any rejected)."""
        started = time.perf_counter()
        finished, self._early_outputs = self._early_outputs, []
        self.last_cycle = BlockCycle()
        plan = self.scheduler.schedule(time.time())
        for request in plan.admitted:
            self._allocate_row(request)
        if plan.rows:
            finished += self._run_cycle(plan.rows)
        self.stats_collector.add_elapsed(time.perf_counter() - started)
        return finished

    def _allocate_row(self, request: Request) -> None:
        row = torch.full((request.width,), self.lm.tokens.mask_id, dtype=torch.long, device=self.lm.device)
        row[:request.prompt_length] = torch.tensor(request.prompt_token_ids, device=self.lm.device)
        request.row_tokens = row

    def _run_cycle(self, rows: list[Request]) -> list[RequestOutput]:
        batch = build_block_batch(rows, self.lm.tokens.pad_id, self.lm.device)
        unfinished = torch.tensor([r.is_decoding_own_output for r in rows], device=self.lm.device)
        result = self.runner.run_block_cycle(batch)
        self.stats_collector.record_cycle(
            has_masks=result.has_masks, unfinished=unfinished, box_tokens=batch.bounding_box_tokens,
            real_tokens=batch.num_real_tokens, model_time_s=result.model_time_s)
        stop_ids = torch.tensor(self.lm.tokens.stop_ids, device=self.lm.device)
        stop_found = torch.isin(result.block_tokens, stop_ids).any(-1).tolist()
        for request, block, steps in zip(rows, result.block_tokens, result.steps_per_row):
            request.row_tokens[request.block_start:request.block_start + self.config.block_length] = block
            request.num_steps += steps
        self.last_cycle = BlockCycle(
            new_token_ids={request.request_id: self._output_part(request, block)
                           for request, block in zip(rows, result.block_tokens.tolist())},
            num_rows=batch.num_rows, bounding_box_tokens=batch.bounding_box_tokens)
        return [self._finish(request) for request in self.scheduler.finish_boundary(stop_found)]

    def _output_part(self, request: Request, block: list[int]) -> list[int]:
        """The part of the block just decoded that belongs to the request's output (see ``_finish``)."""
        if request.stop_block is not None or request.block_index >= request.cap_blocks:
            return []
        return trim_at_stop(block, self.lm.tokens.stop_ids)[0]

    def _finish(self, request: Request) -> RequestOutput:
        request.finish_time = time.time()
        token_ids: list[int] = []
        if request.row_tokens is not None:
            own_end = request.prompt_length + min(request.block_index, request.cap_blocks) * request.block_length
            generated = request.row_tokens[request.prompt_length:own_end].tolist()
            token_ids, _ = trim_at_stop(generated, self.lm.tokens.stop_ids)
            request.row_tokens = None  # the row's memory goes back with it
        if request.status != RequestStatus.FINISHED_ERROR:
            self.stats_collector.record_finished(len(token_ids))
        del self._requests[request.request_id]
        return RequestOutput(
            request_id=request.request_id, prompt_token_ids=list(request.prompt_token_ids),
            token_ids=token_ids,
            text=self.lm.tokenizer.decode(token_ids, skip_special_tokens=True) if token_ids else "",
            finish_reason=request.status.finish_reason, error=request.error,
            num_blocks=request.block_index, num_steps=request.num_steps,
            arrival_time=request.arrival_time, first_scheduled_time=request.first_scheduled_time,
            finish_time=request.finish_time)

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
            finished = self.step()
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
