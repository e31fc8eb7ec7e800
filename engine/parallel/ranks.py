"""The worker ranks of a split engine: started by rank 0 (the engine's own process), fed every engine call.

Each worker process loads its share of the model, builds the same engine (scheduler, runner, rule) and then
repeats rank 0's calls in rank 0's order: ``add_request`` with the id and arrival time rank 0 gave it,
``abort_request``, and ``step_at`` with rank 0's clock. Every decision is then the same on every rank, because
the collectives give every rank the same sums and logits; rank 0 alone answers its callers. Calls travel over
one local socket connection per worker, so an idle worker waits without a timeout; a forward's collectives
time out after ``tensor_parallel_timeout_s``. Closing stops the workers, and kills any that do not stop.
"""
from __future__ import annotations

import os
import pickle
import secrets
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, Listener

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.models.loader import DiffusionLM, ModelSource

READY_POLL_S = 1.0
STOP_WAIT_S = 10.0


class TensorParallelError(RuntimeError):
    """A worker rank died, hung past the collective timeout, or could not start: the engine cannot go on."""


@dataclass(frozen=True)
class RankSpec:
    """What a worker needs to become rank ``rank`` of the engine rank 0 built. ``engine``: what the worker builds
    on its share of the model (rank 0's engine class, given by its executor, ``engine.executor``)."""

    source: ModelSource
    config: EngineConfig
    engine: Callable[[DiffusionLM, EngineConfig], object]
    size: int
    address: str  # the process group's rendezvous, tcp://host:port
    threads: int  # intra-op threads on a CPU rank (rank 0's)

    @property
    def backend(self) -> str:
        return "nccl" if self.source.device.startswith("cuda") else "gloo"

    def device(self, rank: int) -> str:
        """Rank ``rank``'s device: the next CUDA device after rank 0's, or the CPU."""
        if self.backend == "gloo":
            return self.source.device
        return f"cuda:{(torch.device(self.source.device).index or 0) + rank}"


def join_group(rank: int, spec: RankSpec) -> None:
    """Join the engine's process group (every rank calls it; it returns when all have)."""
    if spec.backend == "nccl":
        torch.cuda.set_device(spec.device(rank))
    dist.init_process_group(spec.backend, init_method=spec.address, rank=rank, world_size=spec.size,
                            timeout=timedelta(seconds=spec.config.tensor_parallel_timeout_s))


class WorkerRanks:
    """Ranks 1 to N-1 of one engine, each a local process (``python -m engine.parallel.worker``) on its own
    device. A fresh interpreter, not a fork: the caller's main module and threads stay out of the workers."""

    def __init__(self, source: ModelSource, config: EngineConfig,
                 engine: Callable[[DiffusionLM, EngineConfig], object]):
        if dist.is_initialized():
            raise TensorParallelError("this process already runs a tensor-parallel engine (or another process "
                                      "group); close it before starting another")
        self.spec = RankSpec(source, config, engine, config.tensor_parallel_size,
                             f"tcp://127.0.0.1:{_free_port()}", torch.get_num_threads())
        self.bytes_sent = 0  # pickled calls sent to the workers, all of them together
        key = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        environment = os.environ | {"BLOCKSERVE_RANK_KEY": key.hex()}
        host, port = listener.address
        self.processes = [subprocess.Popen([sys.executable, "-m", "engine.parallel.worker", str(rank), host, str(port)],
                                           env=environment) for rank in range(1, self.spec.size)]
        self.connections: list[Connection] = []
        self._finalizer = weakref.finalize(self, _stop, self.processes, self.connections)
        try:
            self._connect(listener)
            join_group(0, self.spec)
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()

    def _connect(self, listener: Listener) -> None:
        """Accept each worker's connection (in rank order) and send it its spec; give up if one exits first."""
        accepted: dict[int, Connection] = {}

        def accept() -> None:
            for _ in self.processes:
                connection = listener.accept()
                accepted[connection.recv()] = connection
        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(READY_POLL_S)
            self.check("while starting")
        self.connections.extend(accepted[rank] for rank in range(1, self.spec.size))
        for connection in self.connections:
            connection.send(self.spec)

    def _wait_ready(self) -> None:
        for rank, connection in enumerate(self.connections, start=1):
            while not connection.poll(READY_POLL_S):
                self.check("while loading its share of the model")
            status, detail = connection.recv()
            if status != "ready":
                raise TensorParallelError(f"tensor-parallel rank {rank} could not start:\n{detail}")

    def send(self, command: str, *args) -> None:
        """Have every worker make the engine call ``command(*args)``."""
        self.check()
        message = pickle.dumps((command, args), protocol=pickle.HIGHEST_PROTOCOL)
        for connection in self.connections:
            connection.send_bytes(message)
        self.bytes_sent += len(message) * len(self.connections)

    def check(self, when: str = "") -> None:
        """Raise TensorParallelError if a worker has exited."""
        for rank, process in enumerate(self.processes, start=1):
            if process.poll() is not None:
                raise TensorParallelError(f"tensor-parallel rank {rank} (pid {process.pid}) exited with code "
                                          f"{process.returncode}{' ' + when if when else ''}; the engine cannot go on")

    def failure(self, error: BaseException) -> BaseException:
        """The error to raise for ``error`` from a step: which rank failed, or ``error`` itself if none did."""
        for rank, process in enumerate(self.processes, start=1):
            try:
                process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
            return TensorParallelError(f"tensor-parallel rank {rank} (pid {process.pid}) exited with code "
                                       f"{process.returncode} during a step: {error}")
        if isinstance(error, dist.DistError) or "timed out" in str(error).lower() or "gloo" in str(error).lower():
            timeout = self.spec.config.tensor_parallel_timeout_s
            return TensorParallelError(f"a collective between the tensor-parallel ranks failed or waited over "
                                       f"tensor_parallel_timeout_s={timeout}: {error}")
        return error

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def close(self) -> None:
        """Stop the workers (killing any that do not stop) and leave the process group."""
        self._finalizer()

    def kill(self) -> None:
        """End the workers at once (a failed engine's: a hung rank would not answer a stop) and leave the group."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        self._finalizer()


def _stop(processes: list[subprocess.Popen], connections: list[Connection]) -> None:
    for connection in connections:
        try:
            connection.send_bytes(pickle.dumps(("stop", ())))
        except (OSError, ValueError):
            pass
    for process in processes:
        try:
            process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for connection in connections:
        connection.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
