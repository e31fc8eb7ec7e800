"""BlockServeActor: a Ray Data UDF class that runs one BlockServeEngine per actor.

    ds.map_batches(BlockServeActor, fn_constructor_kwargs={"model": "tiny", "engine": {...},
                   "sampling": {...}}, compute=ray.data.ActorPoolStrategy(size=N,
                   max_concurrent_calls_per_actor=4), num_gpus=1, batch_size=64)

``__call__`` is a coroutine, so Ray Data runs several batches of one actor at once on the actor's event
loop. Each call only queues its rows on the actor's :class:`~actors.batch_loop.EngineLoop` and awaits
their futures; the single loop thread keeps the engine stepping across batch boundaries. Every batch comes
back complete, in its input row order. Bad rows get ``error`` and ``finish_reason="error"``; others in the
batch are unaffected. With ``stats_actor`` set, a snapshot of this actor's stats reaches that named
:class:`~actors.stats_registry.StatsRegistry` before each batch is returned.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import time
import uuid
import warnings
from typing import Any, Literal

import pyarrow as pa
import torch

from actors.batch_loop import EngineLoop
from actors.batch_rows import Batch, column_values, is_missing, num_rows, with_columns
from actors.device_stats import UtilizationSampler, memory_peak
from engine import BlockServeEngine, EngineConfig, RequestOutput, SamplingParams

logger = logging.getLogger(__name__)

ROW_PARAM_COLUMNS = ("max_new_tokens", "temperature", "seed")  # optional per-row SamplingParams
OUTPUT_SCHEMA = pa.schema([
    ("generated_text", pa.string()), ("num_generated_tokens", pa.int64()), ("finish_reason", pa.string()),
    ("error", pa.string()), ("num_blocks", pa.int64()), ("queue_s", pa.float64()),
    ("latency_s", pa.float64()), ("actor_id", pa.string()), ("node_id", pa.string()),
    ("device", pa.string()),
])
LATENCY_SAMPLES = 2048  # per actor instance, for the driver's latency-by-length plot


class BlockServeActor:
    def __init__(self, model: str = "tiny", engine: dict | None = None, sampling: dict | None = None,
                 prompt_column: str = "prompt", chat_template: bool = True, dtype: str = "float32",
                 device: str | None = None, torch_threads: int | None = None,
                 stats_actor: str | None = None, fail_after_rows: int | None = None,
                 fail_mode: Literal["crash", "error"] = "crash"):
        """``engine``/``sampling``: EngineConfig / SamplingParams fields (unknown keys raise ValueError);
        ``sort_pending`` defaults to False here (see below).
        ``chat_template``: wrap a plain-string prompt as one user message. ``device``: None picks CUDA
        when present. ``fail_after_rows``: fault injection for tests; once that many rows are done, the
        next batch crashes the actor (``"crash"``: the process exits, once; Ray restarts it and retries
        the batch) or raises (``"error"``: the job fails)."""
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_name = str(model)
        self.prompt_column = prompt_column
        self.chat_template = chat_template
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
        self.loop = EngineLoop(self.engine, after_step=self.utilization.maybe_sample)
        self.stats_actor = stats_actor
        self.fail_after_rows = fail_after_rows
        self.fail_mode = fail_mode
        self._registry = None
        self._rows = self._error_rows = self._batches = self._sequence = 0
        self._samples: list[tuple[int, float]] = []
        self._rng = random.Random(0)

    async def __call__(self, batch: Batch) -> Batch:
        self._maybe_inject_failure()
        started = time.perf_counter()
        size = num_rows(batch)
        prompts = column_values(batch, self.prompt_column)
        overrides = {name: column_values(batch, name) for name in ROW_PARAM_COLUMNS}
        results: list[RequestOutput | str | None] = [None] * size
        pending: dict[int, Any] = {}
        for index in range(size):
            row_overrides = {name: values[index] for name, values in overrides.items() if values is not None}
            prepared = self._prepare_row(None if prompts is None else prompts[index], row_overrides)
            if isinstance(prepared, str):
                results[index] = prepared
            else:
                pending[index] = asyncio.wrap_future(self.loop.submit(*prepared))
        for index, output in zip(pending, await asyncio.gather(*pending.values())):
            results[index] = output
        self._record(results)
        await self._report_stats()
        logger.info("batch of %d rows in %.1fs; actor %s: %d rows, %d tokens", size,
                    time.perf_counter() - started, self.actor_id[:8], self._rows,
                    self.loop.stats.generated_tokens)
        return with_columns(batch, self._output_columns(results))

    # -- rows --------------------------------------------------------------------------------------
    def _prepare_row(self, prompt: Any, overrides: dict[str, Any]) -> tuple[Any, SamplingParams] | str:
        """(prompt, params) for the engine, or the error message of a row that cannot be a request.
        The engine itself rejects empty, ill-typed or too-long prompts and bad parameter values."""
        if is_missing(prompt):
            return f"missing prompt: column {self.prompt_column!r} is absent or null"
        if self.chat_template and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        values = {name: _coerce_integral(value) if name != "temperature" else value
                  for name, value in overrides.items() if not is_missing(value)}
        return prompt, dataclasses.replace(self.default_params, **values)

    def _output_columns(self, results: list[RequestOutput | str]) -> dict[str, pa.Array]:
        columns: dict[str, list] = {field.name: [] for field in OUTPUT_SCHEMA}
        for result in results:
            if isinstance(result, str):
                row = dict(generated_text="", num_generated_tokens=0, finish_reason="error", error=result,
                           num_blocks=0, queue_s=0.0, latency_s=0.0)
            else:
                row = dict(generated_text=result.text, num_generated_tokens=len(result.token_ids),
                           finish_reason=result.finish_reason, error=result.error,
                           num_blocks=result.num_blocks, queue_s=result.queue_s, latency_s=result.latency_s)
            row |= dict(actor_id=self.actor_id, node_id=self.node_id, device=str(self.device))
            for name, value in row.items():
                columns[name].append(value)
        return {field.name: pa.array(columns[field.name], field.type) for field in OUTPUT_SCHEMA}

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
            "gpu_utilization": self.utilization.mean, "engine": engine_stats,
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
            loop.close(wait=False)


def _coerce_integral(value: Any) -> Any:
    """2.0 -> 2 (numeric columns with nulls arrive as floats); anything else is left for the engine."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


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
