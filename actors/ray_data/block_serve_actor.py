"""BlockServeActor: a Ray Data UDF class that runs one BlockServeEngine per actor.

    ds.map_batches(BlockServeActor, fn_constructor_kwargs={"model": "tiny", "engine": {...},
                   "sampling": {...}}, compute=ray.data.ActorPoolStrategy(size=N,
                   max_concurrent_calls_per_actor=4), num_gpus=1, batch_size=64)

Rows follow Ray's LLM processors (``ray.data.llm``): a ``messages`` column (a chat) gets the model's
chat template; a ``prompt`` column is raw text, tokenized as is, exactly like ``engine.generate`` (set
``chat_template=True`` to wrap it as one user message, as the tiny model's configs do), or token ids;
an optional ``sampling_params`` dict per row takes vLLM's names (``max_tokens``, ``temperature``,
``seed``, ``ignore_eos``) or ours. Output columns are named like Ray's vLLM stage where the meaning is
the same (:data:`~actors.ray_data.row_outputs.OUTPUT_SCHEMA`), plus ours; ``sampling_params`` comes back as a
JSON object in a string column, so any mix of keys reads without Ray. A row that cannot be served gets
``__inference_error__`` and ``finish_reason="error"`` while the others are unaffected; with
``should_continue_on_error=False`` (Ray's default in its processors) such a row fails the batch instead.

``__call__`` (``map_batches``) and :mod:`actors.ray_data.processor`'s stage (``build_processor``) are two doors
to one method, :meth:`BlockServeActor.generate_rows`. It is a coroutine, so Ray Data runs several
batches of one actor at once on the actor's event loop. Each call only queues its rows on the actor's
:class:`~actors.engine_loop.EngineLoop` (the same driver Serve uses) and awaits their results; the
single loop thread keeps the engine stepping across batch boundaries. Every batch comes back complete,
in its input row order. With ``stats_actor`` set, a snapshot of this actor's stats
(:mod:`actors.ray_data.actor_stats`) reaches that named registry before each batch is returned.

In a Ray actor, an engine loop that dies (a step raised, e.g. a CUDA error) or stalls ends the actor's
process: Ray restarts the actor (up to the processor's ``max_restarts``) and retries the batches it
held, so the job still writes every row once. A process left alive would fail every later batch, and
Ray only retries batches whose actor died. Outside Ray, the batch raises instead. With ``stats_actor``
set, the registry also learns of each death and its cause. A batch that was running in
``max_batch_deaths`` of them has its rows retried in smaller groups, so that only the rows that kill the
actor are flagged (:mod:`actors.ray_data.batch_deaths`, :mod:`actors.ray_data.batch_isolation`). Each
door records its batch, or group, before any code of the actor runs on it, a subclass's override of the
door included (:mod:`actors.ray_data.batch_admission`), so a death anywhere in the actor is charged to it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from typing import Any

import torch

from actors.engine_loop import EngineDeadError, EngineLoop
from actors.ray_data.actor_config import ActorConfig
from actors.ray_data.actor_stats import ActorStats
from actors.ray_data.batch_admission import Door, admitting, wrap_overridden_doors
from actors.ray_data.batch_deaths import BatchGate
from actors.ray_data.batch_rows import Batch, input_rows, is_missing, rows_of_columns, take_rows, with_columns
from actors.ray_data.device_stats import UtilizationSampler, memory_peak
from actors.ray_data.placement import current_placement
from actors.ray_data.row_outputs import OUTPUT_SCHEMA, RowError, output_columns, output_row, raise_first_error
from actors.ray_data.row_params import sampling_params_for_row
from actors.ray_data.stats_registry import RegistryClient
from engine import BlockServeEngine, RequestOutput, SamplingParams

__all__ = ["BlockServeActor", "RowError"]

logger = logging.getLogger(__name__)

HEALTH_CHECK_S = 5.0  # how often a waiting batch asks whether the engine loop still steps

# the entry points of a batch, each admitted to the death ledger before its code runs (batch_admission)
CALL_DOOR = Door(rows=lambda actor, batch: input_rows(batch, actor.columns),
                 answer=lambda actor, batch, outputs: with_columns(batch, output_columns(outputs)),
                 part=lambda actor, batch, start, end: take_rows(batch, start, end),
                 outputs=lambda actor, result: rows_of_columns(result, OUTPUT_SCHEMA.names))
ROWS_DOOR = Door(rows=lambda actor, rows: rows, answer=lambda actor, rows, outputs: outputs,
                 part=lambda actor, rows, start, end: rows[start:end], outputs=lambda actor, result: result)
DOORS = {"__call__": CALL_DOOR, "generate_rows": ROWS_DOOR}


class BlockServeActor:
    def __init__(self, config: ActorConfig | None = None, **settings: Any):
        """``config``, or its fields as keyword arguments (``model="tiny", engine={...}``): see
        :class:`~actors.ray_data.actor_config.ActorConfig`. A setting that does not validate raises ValueError."""
        if config is None or settings:
            config = ActorConfig.model_validate({**(config.model_dump() if config else {}), **settings})
        self.config = config
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(auto if config.device == "auto" else config.device)
        self.model_name = config.model
        self.columns = {"messages": config.messages_column, "prompt": config.prompt_column,
                        "sampling_params": "sampling_params"}
        self.engine = BlockServeEngine.from_pretrained(config.model, config.engine, device=self.device,
                                                       dtype=config.dtype, compile=config.compile,
                                                       batch_invariant=config.batch_invariant)
        self.placement = current_placement()
        self.instance_id = uuid.uuid4().hex
        self.gate = BatchGate()
        self._ending = threading.Lock()  # held by the thread that ends the process
        self.registry = None
        if config.stats_actor is not None:
            self.registry = RegistryClient(config.stats_actor, self.actor_id, self.instance_id)
            self.registry.instance_started(self.restarted)
        self.utilization = UtilizationSampler(self.device)
        self.loop = EngineLoop(self.engine, max_pending=None, stall_timeout_s=config.stall_timeout_s,
                               on_step=lambda _: self.utilization.maybe_sample(),
                               on_death=self._end_process if self.in_ray_actor else None).start()
        self.stats = ActorStats()

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        wrap_overridden_doors(cls, DOORS)  # so a subclass's door cannot end the process unrecorded

    @property
    def actor_id(self) -> str:
        return self.placement.actor_id

    @property
    def restarted(self) -> bool:
        return self.placement.restarted

    @property
    def in_ray_actor(self) -> bool:
        return self.placement.in_ray_actor

    @property
    def devices(self) -> list[str]:
        """The devices the engine's ranks run on: this actor's, and one more per rank on a GPU."""
        ranks = self.engine.config.tensor_parallel_size
        if self.device.type != "cuda":
            return [str(self.device)] * ranks
        return [f"cuda:{(self.device.index or 0) + rank}" for rank in range(ranks)]

    @property
    def row_placement(self) -> dict[str, str]:
        """Where a row ran: the ``actor_id``, ``node_id`` and ``device`` columns."""
        return dict(actor_id=self.actor_id, node_id=self.placement.node_id, device=str(self.device))

    @admitting(CALL_DOOR)
    async def __call__(self, batch: Batch) -> Batch:
        """``map_batches``: the batch (any Ray Data format) plus the output columns."""
        outputs = await self.generate_rows(input_rows(batch, self.columns))
        return with_columns(batch, output_columns(outputs))

    @admitting(ROWS_DOOR)
    async def generate_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One output dict (the ``OUTPUT_SCHEMA`` columns) per row dict, in order. A row holds
        ``messages`` or ``prompt``, and optionally ``sampling_params``."""
        started = time.perf_counter()
        return await self._finish(rows, await self._serve(rows, self.row_placement), started)

    async def refuse(self, rows: list[dict[str, Any]], messages: list[str]) -> list[dict[str, Any]]:
        """The output rows of rows that are not run: each one's error is its message."""
        for message in dict.fromkeys(messages):
            logger.error("%s", message)
        outputs = [output_row(message, self.row_placement, row.get("sampling_params"))
                   for row, message in zip(rows, messages)]
        return await self._finish(rows, outputs, time.perf_counter())

    async def _finish(self, rows: list[dict[str, Any]], outputs: list[dict[str, Any]],
                      started: float) -> list[dict[str, Any]]:
        """Count the batch, fail it on a bad row if told to, and report the stats before it returns."""
        self.stats.record(outputs)
        if not self.config.should_continue_on_error:
            raise_first_error(outputs)
        if self.registry is not None:
            await self.registry.report(self.stats_snapshot())
        logger.info("batch of %d rows in %.1fs; actor %s: %d rows, %d tokens", len(rows),
                    time.perf_counter() - started, self.actor_id[:8], self.stats.rows,
                    self.loop.stats.generated_tokens)
        return outputs

    async def _serve(self, rows: list[dict[str, Any]], placement: dict[str, str]) -> list[dict[str, Any]]:
        requests = [self._request_of(row) for row in rows]
        await asyncio.to_thread(self._compile_grammars, requests)
        pending = {index: self._submit(request) for index, request in enumerate(requests)
                   if not isinstance(request, str)}
        served = dict(zip(pending, await self._results(list(pending.values()))))
        return [output_row(served.get(index, request), placement, row.get("sampling_params"))
                for index, (row, request) in enumerate(zip(rows, requests))]

    def stats_snapshot(self) -> dict:
        """Everything the driver aggregates for this actor instance (plain JSON-able values)."""
        peak, peak_kind = memory_peak(self.device)
        engine_stats = self.loop.stats.to_dict()
        identity = {"actor_id": self.actor_id, "instance_id": self.instance_id,
                    "node_id": self.placement.node_id, "device": str(self.device), "model": self.model_name,
                    "restarted": self.restarted, "block_length": self.engine.config.block_length,
                    "tensor_parallel_size": self.engine.config.tensor_parallel_size, "devices": self.devices}
        compiled = self.engine.lm.model.compiled
        return self.stats.snapshot(
            identity, busy_s=engine_stats["elapsed_s"], active_s=self.loop.active_s, idle_s=self.loop.idle_s,
            memory_peak_bytes=peak, memory_peak_kind=peak_kind, gpu_utilization=self.utilization.mean,
            gpu_utilization_unavailable=self.utilization.unavailable, engine=engine_stats,
            compiled_graphs=compiled.num_graphs if compiled is not None else None,
            compile_failures=compiled.compile_failures if compiled is not None else {})

    def _request_of(self, row: dict[str, Any]) -> tuple[Any, SamplingParams] | str:
        """(prompt, params) for the engine, or the error message of a row that cannot be a request.
        The engine itself rejects empty, ill-typed or too-long prompts and bad parameter values."""
        messages, prompt = row.get("messages"), row.get("prompt")
        if not is_missing(messages):
            prompt = messages
        elif is_missing(prompt):
            return (f"missing prompt: neither {self.columns['messages']!r} nor {self.columns['prompt']!r} "
                    "is present and non-null")
        elif self.config.chat_template and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        params = sampling_params_for_row(self.config.sampling, row.get("sampling_params"))
        return params if isinstance(params, str) else (prompt, params)

    def _compile_grammars(self, requests: list[tuple[Any, SamplingParams] | str]) -> None:
        """Compile the rows' structured_outputs here, in a worker thread, so the engine loop that admits them
        finds them compiled (a constraint that does not compile is found again there, as the row's error)."""
        for request in requests:
            if not isinstance(request, str) and request[1].structured_outputs is not None:
                self.engine.grammars.problem(request[1])

    def _submit(self, request: tuple[Any, SamplingParams]) -> asyncio.Future:
        """The request's result. A loop that died before it could take the request ends the process here
        in Ray, as its own ``on_death`` does, so that the batch never hears of the death."""
        try:
            return asyncio.wrap_future(self.loop.submit(*request, stream=False).result)
        except EngineDeadError as error:
            if self.in_ray_actor:
                self._end_process(self.loop.failure or error)
            raise

    async def _results(self, futures: list[asyncio.Future]) -> list[RequestOutput]:
        """Await the rows; if the engine loop stalls, end the process (in Ray) or fail the batch."""
        waiting = set(futures)
        while waiting:
            _, waiting = await asyncio.wait(waiting, timeout=HEALTH_CHECK_S)
            if waiting and (problem := self.loop.health_problem()) is not None:
                if self.in_ray_actor:
                    self._end_process(self.loop.failure or problem)
                raise RuntimeError(f"BlockServeActor {self.actor_id}: {problem}")
        return [future.result() for future in futures]

    def _end_process(self, problem: BaseException | str) -> None:
        """Exit so that Ray restarts this actor and retries its batches (the engine cannot recover:
        after a CUDA error the device context is unusable). Called on the loop thread when it dies,
        before any batch hears of it, so no batch returns an error that would fail the job. The first
        caller reports and exits; a batch's thread that comes second waits on the lock until the exit."""
        self._ending.acquire()  # never released: the process ends below
        logger.error("BlockServeActor %s: engine loop is dead or stuck (%s): exiting so that Ray "
                     "restarts the actor and retries its batches", self.actor_id, problem)
        if self.registry is not None:
            self.registry.instance_died(death_cause(problem))
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop(timeout_s=0)


def death_cause(problem: BaseException | str) -> str:
    """One line for the job's summary: the error's type and the first line of its message."""
    if isinstance(problem, str):
        return problem
    first_line = next(iter(str(problem).splitlines()), "")
    return f"{type(problem).__name__}: {first_line}" if first_line else type(problem).__name__
