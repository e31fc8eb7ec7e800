"""BlockServeActor: a Ray Data UDF class that runs one BlockServeEngine per actor.

    ds.map_batches(BlockServeActor, fn_constructor_kwargs={"model": "tiny", "engine": {...},
                   "sampling": {...}}, compute=ray.data.ActorPoolStrategy(size=N,
                   max_concurrent_calls_per_actor=4), num_gpus=1, batch_size=64)

Rows follow Ray's LLM processors (``ray.data.llm``): a ``messages`` column (a chat) gets the model's
chat template; a ``prompt`` column is raw text, tokenized as is, exactly like ``engine.generate`` (set
``chat_template=True`` to wrap it as one user message, as the tiny model's configs do), or token ids;
an optional ``sampling_params`` dict per row takes vLLM's names (``max_tokens``, ``temperature``,
``seed``, ``ignore_eos``) or ours. Output columns are named like Ray's vLLM stage where the meaning is
the same (:data:`OUTPUT_SCHEMA`), plus ours. A row that cannot be served gets ``__inference_error__``
and ``finish_reason="error"`` while the others are unaffected; with ``should_continue_on_error=False``
(Ray's default in its processors) such a row fails the batch instead.

``__call__`` is a coroutine, so Ray Data runs several batches of one actor at once on the actor's event
loop. Each call only queues its rows on the actor's :class:`~actors.engine_loop.EngineLoop` (the same
driver Serve uses) and awaits their results; the single loop thread keeps the engine stepping across
batch boundaries. Every batch comes back complete, in its input row order. With ``stats_actor`` set, a
snapshot of this actor's stats reaches that named :class:`~actors.stats_registry.StatsRegistry` before
each batch is returned. :mod:`actors.processor` runs the same rows through ``build_processor``.

In a Ray actor, an engine loop that dies (a step raised, e.g. a CUDA error) or stalls ends the actor's
process: Ray restarts the actor (Ray Data's default ``max_restarts=-1``) and retries the batches it
held, so the job still writes every row once. A process left alive would fail every later batch, and
Ray only retries batches whose actor died. Outside Ray, the batch raises instead.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import uuid
import warnings
from typing import Any, Literal

import pyarrow as pa
import torch

from actors.batch_rows import Batch, column_values, is_missing, num_rows, with_columns
from actors.device_stats import UtilizationSampler, memory_peak
from actors.engine_loop import EngineLoop
from actors.row_params import sampling_params_for_row
from engine import BlockServeEngine, EngineConfig, RequestOutput, SamplingParams

logger = logging.getLogger(__name__)

INPUT_COLUMNS = ("messages", "prompt", "sampling_params")
OUTPUT_SCHEMA = pa.schema([
    # named as Ray's vLLM stage names them
    ("generated_text", pa.string()), ("generated_tokens", pa.list_(pa.int64())),
    ("num_generated_tokens", pa.int64()), ("num_input_tokens", pa.int64()),
    ("time_taken_llm", pa.float64()), ("__inference_error__", pa.string()),
    # ours
    ("finish_reason", pa.string()), ("num_blocks", pa.int64()), ("queue_s", pa.float64()),
    ("actor_id", pa.string()), ("node_id", pa.string()), ("device", pa.string()),
])
HEALTH_CHECK_S = 5.0  # how often a waiting batch asks whether the engine loop still steps
LATENCY_SAMPLES = 2048  # per actor instance, for the driver's latency-by-length plot


class RowError(RuntimeError):
    """A row could not be served and ``should_continue_on_error`` is False."""


class BlockServeActor:
    def __init__(self, model: str = "tiny", engine: dict | None = None, sampling: dict | None = None,
                 prompt_column: str = "prompt", messages_column: str = "messages",
                 chat_template: bool = False, should_continue_on_error: bool = True,
                 dtype: str = "float32", device: str | None = None, torch_threads: int | None = None,
                 stall_timeout_s: float = 600.0, stats_actor: str | None = None,
                 fail_after_rows: int | None = None, fail_mode: Literal["crash", "error"] = "crash"):
        """``engine``/``sampling``: EngineConfig / SamplingParams fields (unknown keys raise ValueError);
        ``sort_pending`` defaults to False here (see below).
        ``chat_template``: wrap a raw ``prompt`` string as one user message (``messages`` always gets
        the template). ``device``: None picks CUDA when present. ``stall_timeout_s``: an engine that
        has not completed a step for this long ends the actor's process (Ray restarts it, Ray Data
        retries its batches); outside Ray the batch raises.
        ``fail_after_rows``: fault injection for tests; once that many rows are done, the next batch
        crashes the actor (``"crash"``: the process exits, once; Ray restarts it and retries the batch)
        or raises (``"error"``: the job fails)."""
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_name = str(model)
        self.prompt_column, self.messages_column = prompt_column, messages_column
        self.chat_template = chat_template
        self.should_continue_on_error = should_continue_on_error
        self.default_params = SamplingParams.from_dict(sampling or {})
        # Admission in arrival order unless told otherwise: with length-sorted admission, rows of every
        # in-flight batch interleave and all those batches finish together, leaving the engine empty
        # while Ray Data hands over the next ones. In arrival order batches finish one by one, and the
        # next batch is queued long before the engine runs dry. (The pipeline's batches each hold rows
        # of similar length already.)
        engine_config = EngineConfig.from_dict({"sort_pending": False, **(engine or {})})
        self.engine = BlockServeEngine.from_pretrained(model, engine_config, device=self.device, dtype=dtype)
        self.actor_id, self.node_id, self.restarted = _placement()
        self.instance_id = uuid.uuid4().hex
        self.utilization = UtilizationSampler(self.device)
        self.loop = EngineLoop(self.engine, max_pending=None, stall_timeout_s=stall_timeout_s,
                               on_cycle=lambda _: self.utilization.maybe_sample(),
                               on_death=self._end_process if self.in_ray_actor else None).start()
        self.stats_actor = stats_actor
        self.fail_after_rows = fail_after_rows
        self.fail_mode = fail_mode
        self._registry = None
        self._rows = self._error_rows = self._batches = self._sequence = 0
        self._samples: list[tuple[int, float]] = []
        self._rng = random.Random(0)

    async def __call__(self, batch: Batch) -> Batch:
        columns = {name: column_values(batch, column) for name, column in (
            ("messages", self.messages_column), ("prompt", self.prompt_column),
            ("sampling_params", "sampling_params"))}
        rows = [{name: values[index] for name, values in columns.items() if values is not None}
                for index in range(num_rows(batch))]
        outputs = await self.generate_rows(rows)
        return with_columns(batch, {field.name: pa.array([o[field.name] for o in outputs], field.type)
                                    for field in OUTPUT_SCHEMA})

    async def generate_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One output dict (the :data:`OUTPUT_SCHEMA` columns) per row dict, in order. A row holds
        ``messages`` or ``prompt``, and optionally ``sampling_params``."""
        self._maybe_inject_failure()
        started = time.perf_counter()
        results: list[RequestOutput | str | None] = [None] * len(rows)
        pending: dict[int, asyncio.Future] = {}
        for index, row in enumerate(rows):
            prepared = self._prepare_row(row)
            if isinstance(prepared, str):
                results[index] = prepared
            else:
                pending[index] = asyncio.wrap_future(self.loop.submit(*prepared, stream=False).result)
        for index, output in zip(pending, await self._results(list(pending.values()))):
            results[index] = output
        self._record(results)
        if not self.should_continue_on_error:
            self._raise_first_error(results)
        await self._report_stats()
        logger.info("batch of %d rows in %.1fs; actor %s: %d rows, %d tokens", len(rows),
                    time.perf_counter() - started, self.actor_id[:8], self._rows,
                    self.loop.stats.generated_tokens)
        return [self._output_row(result) for result in results]

    async def _results(self, futures: list[asyncio.Future]) -> list[RequestOutput]:
        """Await the rows; if the engine loop stalls, end the process (in Ray) or fail the batch."""
        waiting = set(futures)
        while waiting:
            _, waiting = await asyncio.wait(waiting, timeout=HEALTH_CHECK_S)
            if waiting and (problem := self.loop.health_problem()) is not None:
                if self.in_ray_actor:
                    self._end_process(problem)
                raise RuntimeError(f"BlockServeActor {self.actor_id}: {problem}")
        return [future.result() for future in futures]

    @property
    def in_ray_actor(self) -> bool:
        return self.actor_id != "local"

    def _end_process(self, problem: BaseException | str) -> None:
        """Exit so that Ray restarts this actor and retries its batches (the engine cannot recover:
        after a CUDA error the device context is unusable). Called on the loop thread when it dies,
        before any batch hears of it, so no batch returns an error that would fail the job."""
        logger.error("BlockServeActor %s: engine loop is dead or stuck (%s): exiting so that Ray "
                     "restarts the actor and retries its batches", self.actor_id, problem)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)

    # -- rows --------------------------------------------------------------------------------------
    def _prepare_row(self, row: dict[str, Any]) -> tuple[Any, SamplingParams] | str:
        """(prompt, params) for the engine, or the error message of a row that cannot be a request.
        The engine itself rejects empty, ill-typed or too-long prompts and bad parameter values."""
        messages, prompt = row.get("messages"), row.get("prompt")
        if not is_missing(messages):
            prompt = messages
        elif is_missing(prompt):
            return (f"missing prompt: neither {self.messages_column!r} nor {self.prompt_column!r} "
                    "is present and non-null")
        elif self.chat_template and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        params = sampling_params_for_row(self.default_params, row.get("sampling_params"))
        return params if isinstance(params, str) else (prompt, params)

    def _output_row(self, result: RequestOutput | str) -> dict[str, Any]:
        placement = dict(actor_id=self.actor_id, node_id=self.node_id, device=str(self.device))
        if isinstance(result, str):
            return dict(generated_text="", generated_tokens=[], num_generated_tokens=0, num_input_tokens=0,
                        time_taken_llm=0.0, __inference_error__=result, finish_reason="error",
                        num_blocks=0, queue_s=0.0, **placement)
        return dict(generated_text=result.text, generated_tokens=list(result.token_ids),
                    num_generated_tokens=len(result.token_ids),
                    num_input_tokens=len(result.prompt_token_ids), time_taken_llm=result.latency_s,
                    __inference_error__=result.error or "", finish_reason=result.finish_reason,
                    num_blocks=result.num_blocks, queue_s=result.queue_s, **placement)

    def _raise_first_error(self, results: list[RequestOutput | str]) -> None:
        for index, result in enumerate(results):
            message = result if isinstance(result, str) else result.error
            if message:
                raise RowError(f"row {index} of the batch failed: {message} "
                               "(should_continue_on_error=False)")

    # -- stats -------------------------------------------------------------------------------------
    def _record(self, results: list[RequestOutput | str]) -> None:
        self._batches += 1
        for result in results:
            self._rows += 1
            if isinstance(result, str) or result.finish_reason == "error":
                self._error_rows += 1
                continue
            sample = (len(result.token_ids), result.latency_s)
            if len(self._samples) < LATENCY_SAMPLES:  # reservoir sampling keeps an unbiased subset
                self._samples.append(sample)
            elif (slot := self._rng.randrange(self._rows)) < LATENCY_SAMPLES:
                self._samples[slot] = sample

    def stats_snapshot(self) -> dict:
        """Everything the driver aggregates for this actor instance (plain JSON-able values)."""
        peak, peak_kind = memory_peak(self.device)
        engine_stats = self.loop.stats.to_dict()
        self._sequence += 1
        return {
            "actor_id": self.actor_id, "instance_id": self.instance_id, "node_id": self.node_id,
            "device": str(self.device), "model": self.model_name, "restarted": self.restarted,
            "sequence": self._sequence, "reported_at": time.time(),
            "rows": self._rows, "error_rows": self._error_rows, "batches": self._batches,
            "busy_s": engine_stats["elapsed_s"], "active_s": self.loop.active_s, "idle_s": self.loop.idle_s,
            "memory_peak_bytes": peak, "memory_peak_kind": peak_kind,
            "gpu_utilization": self.utilization.mean,
            "gpu_utilization_unavailable": self.utilization.unavailable, "engine": engine_stats,
            "samples": {"num_generated_tokens": [s[0] for s in self._samples],
                        "latency_s": [s[1] for s in self._samples]},
        }

    async def _report_stats(self) -> None:
        if self.stats_actor is None:
            return
        import ray

        if self._registry is None:
            self._registry = ray.get_actor(self.stats_actor)
        await asyncio.wrap_future(self._registry.report.remote(self.stats_snapshot()).future())

    def _maybe_inject_failure(self) -> None:
        """Fail a batch that starts after ``fail_after_rows`` rows were returned (those get written)."""
        if self.fail_after_rows is None or self._rows < self.fail_after_rows:
            return
        if self.fail_mode == "error":
            raise RuntimeError(f"injected failure after {self._rows} rows (fail_after_rows)")
        if not self.restarted and self.actor_id != "local":
            logger.error("injected crash after %d rows (fail_after_rows)", self._rows)
            os._exit(1)

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop(timeout_s=0)


def _placement() -> tuple[str, str, bool]:
    """(actor id, node id, whether Ray restarted this actor); ("local", "local", False) outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            context = ray.get_runtime_context()
            actor_id = context.get_actor_id()
            if actor_id is not None:
                with warnings.catch_warnings():  # Ray 2.60 warns from inside its own property
                    warnings.simplefilter("ignore", DeprecationWarning)
                    restarted = bool(context.was_current_actor_reconstructed)
                return actor_id, context.get_node_id(), restarted
            return "local", context.get_node_id(), False
    except ImportError:
        pass
    return "local", "local", False
