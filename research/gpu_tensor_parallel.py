"""The ``tensor-parallel`` stage of ``research.gpu_checks``: each family's fixture split over 2 GPUs against one.

Each fixture (``tests/fixtures``) is loaded twice in bf16 by ``BlockServeEngine.from_pretrained``: with
``tensor_parallel_size=2`` (rank 0 on this process's first GPU, the engine starts rank 1 on the second) and with
1. Both engines take the same requests and step in turn until done. Reported per family: the answers equal
(bf16 sums the ranks' partial products in another order, so a few may differ as batching makes them differ),
the median step of each, and their ratio. On a machine with fewer than 2 GPUs the stage records that it skips.
"""
from __future__ import annotations

import time
import traceback

import torch

from benchmarks.host_ops import FIXTURES
from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig
from research.compiled_step import Workload

FAMILIES = ("tiny-llada", "tiny-sdar", "tiny-llada2", "tiny-diffusion_gemma")
SIZES = (1, 2)  # tensor_parallel_size of the engines compared


def skip_reason() -> str | None:
    """Why this machine cannot run the stage, or None."""
    count = torch.cuda.device_count()
    return None if count >= 2 else f"this machine has {count} GPU(s); tensor parallel needs 2 or more"


def in_turn(engines: dict, prompts, params, stop_at: float) -> dict:
    """Each engine's step seconds and answers (by the engines' keys), stepping them in turn until done or
    ``stop_at``; ``cut`` says whether the deadline stopped them."""
    ids = {size: [engine.add_request(p, q) for p, q in zip(prompts, params)] for size, engine in engines.items()}
    answers: dict = {size: {} for size in engines}
    steps: dict = {size: [] for size in engines}
    while any(engine.has_unfinished_requests() for engine in engines.values()):
        if time.perf_counter() > stop_at:
            return {"steps": steps, "answers": None, "cut": True}
        for size, engine in engines.items():
            if engine.has_unfinished_requests():
                started = time.perf_counter()
                finished = engine.step().finished
                steps[size].append(time.perf_counter() - started)
                answers[size].update({o.request_id: o.token_ids for o in finished})
    return {"steps": steps, "answers": {size: [answers[size][i] for i in ids[size]] for size in engines},
            "cut": False}


def split_against_whole(fixture: str, requests: int, new_tokens: int, batch: int, stop_at: float) -> dict:
    engines: dict[int, BlockServeEngine] = {}
    try:
        for size in SIZES:
            config = EngineConfig(tensor_parallel_size=size, max_batch_size=batch, max_model_len=256)
            engines[size] = BlockServeEngine.from_pretrained(FIXTURES / fixture, config, device="cuda",
                                                             dtype="bfloat16")
        prompts, params = Workload(requests=requests, new_tokens=new_tokens).prompts(engines[1].lm)
        run = in_turn(engines, prompts, params, stop_at)
    finally:
        for engine in engines.values():
            if hasattr(engine, "close"):
                engine.close()
    step_ms = {size: median(times) * 1e3 if times else None for size, times in run["steps"].items()}
    equal = None if run["answers"] is None else sum(a == b for a, b in zip(run["answers"][1], run["answers"][2]))
    return {"requests": requests, "new_tokens": new_tokens, "batch": batch, "cut": run["cut"],
            "steps": {f"tp{size}": len(times) for size, times in run["steps"].items()},
            "tp1_step_ms": step_ms[1], "tp2_step_ms": step_ms[2],
            "tp2_over_tp1": step_ms[2] / step_ms[1] if step_ms[1] and step_ms[2] else None,
            "tokens_equal": equal, "of": requests}


def tensor_parallel(device: str, smoke: bool, stop_at: float) -> dict:
    """The stage: every family's fixture at ``tensor_parallel_size`` 2 against 1, or why it skips."""
    if reason := skip_reason():
        print(f"tensor-parallel: skipped: {reason}", flush=True)
        return {"skipped": reason, "gpus": torch.cuda.device_count()}
    out: dict = {"gpus": torch.cuda.device_count(), "dtype": "bfloat16", "families": {}}
    for fixture in FAMILIES:
        if time.perf_counter() > stop_at:
            out["families"][fixture] = "skipped: time budget"
            continue
        try:
            out["families"][fixture] = split_against_whole(fixture, 4 if smoke else 16, 8 if smoke else 64,
                                                           4 if smoke else 16, stop_at)
        except Exception as error:  # the next family still runs
            out["families"][fixture] = {"error": f"{type(error).__name__}: {error}",
                                        "traceback": traceback.format_exc()[-4000:]}
        print(f"tensor-parallel {fixture}: {out['families'][fixture]}", flush=True)
    return out
