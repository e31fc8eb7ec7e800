"""Executors: how an engine's calls reach every process that holds a share of its model.

A process holding the whole model, or a worker rank (which only follows rank 0), has a
:class:`SingleProcessExecutor`: it runs each step here and tells no other process. Rank 0 of a split model has a
:class:`MultiRankExecutor`: it starts ranks 1 to N-1 (``engine.parallel.ranks``), each a process that builds the
same engine on its share of the model, and sends them every call that changes the engine's state before running
it here. ``add_request`` carries rank 0's request id and arrival time and ``step`` rank 0's clock, so every rank
decides the same. A step that fails because a rank died or hung raises ``TensorParallelError`` and ends the ranks.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig, SamplingParams
from engine.models.loader import DiffusionLM, ModelSource
from engine.models.prompts import Prompt
from engine.parallel.ranks import TensorParallelError, WorkerRanks
from engine.scheduling.outputs import StepReport

EngineFactory = Callable[[DiffusionLM, EngineConfig], Any]  # what each worker rank builds on its share


class SingleProcessExecutor:
    """The whole engine in this process: a step runs here, and no other process hears of a call."""

    @property
    def pids(self) -> list[int]:
        """The worker ranks' process ids (none)."""
        return []

    @property
    def bytes_sent(self) -> int:
        """Bytes of calls sent to worker ranks (none)."""
        return 0

    def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str, arrival_time: float) -> None:
        """Tell the other ranks of a request rank 0 queued (nothing to tell here)."""

    def abort_request(self, request_id: str) -> None:
        """Tell the other ranks of an abort (nothing to tell here)."""

    def step(self, now: float, step_at: Callable[[float], StepReport]) -> StepReport:
        """Run one step as if the clock read ``now`` (``step_at``: the engine's own step)."""
        return step_at(now)

    def close(self) -> None:
        """Stop what the executor started (nothing here)."""


class MultiRankExecutor(SingleProcessExecutor):
    """Rank 0 of a split model: ranks 1 to N-1 started on ``source``'s other shares, each building ``engine`` and
    repeating the calls this executor sends them."""

    def __init__(self, source: ModelSource, config: EngineConfig, engine: EngineFactory):
        self.ranks = WorkerRanks(source, config, engine)

    @property
    def pids(self) -> list[int]:
        return self.ranks.pids

    @property
    def bytes_sent(self) -> int:
        return self.ranks.bytes_sent

    def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str, arrival_time: float) -> None:
        self.ranks.send("add_request", prompt, params, request_id, arrival_time)

    def abort_request(self, request_id: str) -> None:
        self.ranks.send("abort_request", request_id)

    def step(self, now: float, step_at: Callable[[float], StepReport]) -> StepReport:
        """Have every rank step at ``now``, then step here; a rank's death or hang raises TensorParallelError."""
        self.ranks.send("step_at", now)
        try:
            return step_at(now)
        except Exception as error:
            failure = self.ranks.failure(error)
            if isinstance(failure, TensorParallelError):
                self.ranks.kill()
                raise failure from error
            raise

    def close(self) -> None:
        """Stop the worker ranks (killing any that do not stop) and leave the process group."""
        self.ranks.close()


def executor_for(lm: DiffusionLM, config: EngineConfig, engine: EngineFactory) -> SingleProcessExecutor:
    """The executor of an engine over ``lm``: multi-rank on rank 0 of a split model, else single-process.
    ``config``: the engine's as given (before the model's fit), checked against how ``lm`` was loaded."""
    if config.tensor_parallel_size != lm.shard.size:
        raise ValueError(f"EngineConfig.tensor_parallel_size={config.tensor_parallel_size} but the model was "
                         f"loaded as {lm.shard.size} share(s): load it with load_model(..., tensor_parallel_size="
                         f"{config.tensor_parallel_size}), or use BlockServeEngine.from_pretrained")
    if config.quantization is not None and lm.quantization != config.quantization:
        raise ValueError(f"EngineConfig.quantization={config.quantization!r} but the model was loaded with "
                         f"{lm.quantization!r} weights: load it with load_model(..., quantization="
                         f"{config.quantization!r}), or use BlockServeEngine.from_pretrained")
    if lm.shard.rank != 0 or not lm.shard.is_split:
        return SingleProcessExecutor()
    if lm.source is None:
        raise ValueError("a split model's other ranks load it as load_model did: pass a model from load_model")
    return MultiRankExecutor(lm.source, config, engine)
