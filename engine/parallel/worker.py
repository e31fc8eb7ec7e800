"""A worker rank's process: join the group, load this rank's share, build the engine, repeat rank 0's calls.

The engine it builds is the one its spec names (rank 0's engine class, given by rank 0's executor), so this
package never imports the engine module."""
from __future__ import annotations

import os
import pickle
import sys
import traceback
from multiprocessing.connection import Client, Connection

import torch
import torch.distributed as dist

from engine.parallel.ranks import RankSpec, join_group

CALLS = ("add_request", "abort_request", "step_at")


def worker_main(rank: int, host: str, port: int) -> None:
    """Connect to rank 0, then serve as rank ``rank`` until told to stop."""
    from engine.models.loader import load_model

    connection = Client((host, port), authkey=bytes.fromhex(os.environ["BLOCKSERVE_RANK_KEY"]))
    connection.send(rank)
    spec: RankSpec = connection.recv()
    try:
        torch.set_num_threads(spec.threads)
        join_group(rank, spec)
        source = spec.source
        lm = load_model(source.model, device=spec.device(rank), dtype=source.dtype, compile=source.options.compile,
                        batch_invariant=source.options.batch_invariant, tensor_parallel_size=spec.size, rank=rank,
                        quantization=source.quantization)
        engine = spec.engine(lm, spec.config)
    except BaseException:
        connection.send(("failed", traceback.format_exc()))
        return
    connection.send(("ready", None))
    try:
        repeat_calls(engine, connection)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def repeat_calls(engine, connection: Connection) -> None:
    """Make rank 0's engine calls until it says stop or goes away (its connection closes)."""
    while True:
        try:
            command, args = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError):
            return
        if command == "stop":
            return
        if command not in CALLS:
            raise ValueError(f"unknown call {command!r} from rank 0")
        getattr(engine, command)(*args)


if __name__ == "__main__":
    worker_main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
