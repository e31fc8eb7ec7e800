"""Windows whose attention reads a multiple of 16 keys, against their rows' exact bounding box.

On this CPU, flash attention's time depends on the key count's remainder modulo 16, not on its size:
over 106 keys a call takes about 1.6x the time of 112 (``engine.models.step_inputs.KEY_ALIGNMENT``).
This runs four engines on one workload, stepped alternately: eager and compiled, each with windows
aligned (the engine's behaviour) and unaligned (``KEY_ALIGNMENT`` set to 1 around its steps). It reports
the median step times, their ratios and each engine's tokens against the unaligned eager engine's.

    python -m research key-alignment                          # LLaDA's 32-layer copy, 3 rounds
    python -m research key-alignment --family tiny-dream --rounds 2
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch

import engine.models.step_inputs as step_inputs
from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig
from engine.models.compiled import CompiledForward
from research.compiled_step import Workload, llada_shaped, timed_run

ENGINES = [(compiled, aligned) for compiled in (False, True) for aligned in (True, False)]
ALIGNED = step_inputs.KEY_ALIGNMENT


def label(compiled: bool, aligned: bool) -> str:
    return f"{'compiled' if compiled else 'eager'}, {'aligned' if aligned else 'unaligned'}"


@contextlib.contextmanager
def key_alignment(keys: int):
    """Windows read a multiple of ``keys`` keys inside the block (1: the bounding box itself)."""
    before = step_inputs.KEY_ALIGNMENT
    step_inputs.KEY_ALIGNMENT = keys
    try:
        yield
    finally:
        step_inputs.KEY_ALIGNMENT = before


def one_round(models: dict, prompts, params, batch: int) -> tuple[dict, dict]:
    """Each engine's tokens and median step seconds, the four stepped alternately."""
    engines = {key: BlockServeEngine(models[key[0]], EngineConfig(max_batch_size=batch)) for key in ENGINES}
    ids = {key: [engine.add_request(p, q) for p, q in zip(prompts, params)] for key, engine in engines.items()}
    outputs, times = {key: {} for key in engines}, {key: [] for key in engines}
    while any(engine.has_unfinished_requests() for engine in engines.values()):
        for key, engine in engines.items():
            if not engine.has_unfinished_requests():
                continue
            with key_alignment(ALIGNED if key[1] else 1):
                started = time.perf_counter()
                finished = engine.step().finished
                times[key].append(time.perf_counter() - started)
            outputs[key].update({o.request_id: o.token_ids for o in finished})
    tokens = {key: [outputs[key][i] for i in ids[key]] for key in engines}
    return tokens, {key: median(values) for key, values in times.items()}


def aligned_vs_unaligned(layers: int, workload: Workload, rounds: int) -> dict:
    models = {compiled: llada_shaped(layers, compile=compiled, family=workload.family) for compiled in (False, True)}
    models[True].model.compiled = CompiledForward(models[True].model)
    prompts, params = workload.prompts(models[True])
    for aligned in (True, False):  # compiles every shape either rule meets
        with key_alignment(ALIGNED if aligned else 1):
            timed_run(models[True], prompts, params, workload.batch)
    step_ms = {key: [] for key in ENGINES}
    for _ in range(rounds):
        tokens, medians = one_round(models, prompts, params, workload.batch)
        for key in ENGINES:
            step_ms[key].append(medians[key] * 1e3)
    ms = {key: median(values) for key, values in step_ms.items()}
    reference = tokens[(False, False)]
    return {"family": workload.family, "layers": layers, "requests": workload.requests, "batch": workload.batch,
            "rounds": rounds, "step_ms": {label(*key): round(value, 2) for key, value in ms.items()},
            "eager_aligned_over_unaligned": round(ms[(False, True)] / ms[(False, False)], 3),
            "compiled_aligned_over_unaligned": round(ms[(True, True)] / ms[(True, False)], 3),
            "compiled_over_eager_aligned": round(ms[(True, True)] / ms[(False, True)], 3),
            "compiled_over_eager_unaligned": round(ms[(True, False)] / ms[(False, False)], 3),
            "tokens_equal_to_eager_unaligned": {label(*key): sum(a == b for a, b in zip(tokens[key], reference))
                                                for key in ENGINES}, "of": workload.requests}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="tiny-llada", help="the test fixture whose shape is copied")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16, help="the engines' max_batch_size")
    parser.add_argument("--new-tokens", type=int, default=64, help="every request's cap")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the kernels' own cost, not parallel arithmetic
    workload = Workload(args.family, args.requests, args.batch, args.new_tokens)
    result = aligned_vs_unaligned(args.layers, workload, args.rounds)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
