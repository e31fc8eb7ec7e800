"""Eager vs compiled steps on a model whose step cost is host cost: LLaDA's shape with tiny dimensions.

A 32-layer LLaDA-shaped model with hidden size 32 does almost no arithmetic per step, so its CPU step
time is what the host spends issuing operations: the share of a small GPU step that compilation (and
on CUDA, graph capture) exists to remove. Same workload, same weights, both modes in one process,
interleaved rounds; reported as the ratio of median step times, with the tokens compared and the
number of compiled graphs. ``--mixed`` also runs a 64-request mixed workload (arrivals, different
prompt lengths) under all four schedules on one compiled model and reports the graphs it compiled.

    python -m benchmarks compiled-step                 # 32 layers, 16 requests, 3 rounds
    python -m benchmarks compiled-step --mixed         # + the 64-request graph count
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.host_ops import FIXTURES, mixed_prompts, with_layers
from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig
from engine.config import SCHEDULES
from engine.models import load_model


def timed_run(lm, prompts, params, compile: bool) -> tuple[list[list[int]], list[float]]:
    """Tokens of every request and the wall time of every step, the workload queued at once."""
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=8, compile=compile))
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    outputs, step_times = {}, []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        finished = engine.step().finished
        step_times.append(time.perf_counter() - started)
        outputs.update({o.request_id: o.token_ids for o in finished})
    return [outputs[i] for i in ids], step_times


def eager_vs_compiled(layers: int, count: int, rounds: int) -> dict:
    lm = with_layers(load_model(FIXTURES / "tiny-llada", dtype="float32"), layers)
    prompts, params = mixed_prompts(lm, count)
    started = time.perf_counter()
    timed_run(lm, prompts, params, compile=True)  # compiles every bucket this workload meets
    compile_s = time.perf_counter() - started
    medians = {False: [], True: []}
    tokens = {}
    for _ in range(rounds):
        for compile in (False, True):
            tokens[compile], steps = timed_run(lm, prompts, params, compile)
            medians[compile].append(median(steps))
    eager, compiled = median(medians[False]), median(medians[True])
    return {"layers": layers, "requests": count, "rounds": rounds,
            "eager_step_ms": round(eager * 1e3, 2), "compiled_step_ms": round(compiled * 1e3, 2),
            "compiled_over_eager": round(compiled / eager, 3), "compile_s": round(compile_s, 1),
            "graphs": lm.model.compiled.num_graphs,
            "tokens_equal": sum(a == b for a, b in zip(tokens[False], tokens[True])), "of": count}


def mixed_graph_count(count: int = 64) -> dict:
    """Graphs a compiled model needs for a mixed run: arrivals mid-flight, prompt lengths and caps
    varied, every schedule."""
    lm = with_layers(load_model(FIXTURES / "tiny-llada", dtype="float32"), 2)
    prompts, params = mixed_prompts(lm, count)
    for schedule in SCHEDULES:
        engine = BlockServeEngine(lm, EngineConfig(max_batch_size=16, schedule=schedule, compile=True))
        for index, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request(prompt, p)
            if index % 4 == 3:
                engine.step()  # arrivals while others run
        while engine.has_unfinished_requests():
            engine.step()
    return {"requests": count, "schedules": list(SCHEDULES), "graphs": lm.model.compiled.num_graphs,
            "shapes": sorted(map(list, lm.model.compiled.shapes))}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mixed", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # host cost, not parallel arithmetic
    result = {"step": eager_vs_compiled(args.layers, args.requests, args.rounds)}
    if args.mixed:
        result["mixed"] = mixed_graph_count()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
