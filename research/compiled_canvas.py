"""DiffusionGemma's compiled step against its eager step, on a model whose step cost is host cost.

    python -m research compiled-canvas                    # the fixture at 3 and 32 layers, 3 rounds
    python -m research compiled-canvas --layers 32 --rounds 2 --batch 16

The DiffusionGemma fixture (hidden size 32, canvases of 8) does almost no arithmetic per step, so its
CPU step time is what the host spends issuing operations: what compiling removes, and on CUDA what
graph capture removes. The 32-layer copy repeats the fixture's three layers (sliding, global, global)
with their weights. Eager and compiled engines run the same requests on the same weights, stepped
alternately (``research.compiled_step.lockstep``), after one run that compiles every bucket the
workload meets. Reported: median step of each mode and their ratio, per round; tokens compared; the
graphs compiled and the warm-up's seconds.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from benchmarks.host_ops import mixed_prompts
from benchmarks.results_io import write_results
from benchmarks.summary import median
from engine import EngineConfig
from engine.models import ModelOptions, load_model
from engine.models.diffusion_gemma.model import DiffusionGemmaTransformer
from engine.models.loader import DiffusionLM, apply_model_options
from research.compiled_step import lockstep

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-diffusion_gemma"


def gemma_with_layers(num_layers: int, compile: bool, device: str = "cpu") -> DiffusionLM:
    """The fixture with ``num_layers`` layers, layer i a copy of the fixture's layer ``i mod 3`` (its last is
    global, as the release's), run compiled or not."""
    lm = load_model(FIXTURE, device=device)
    source = lm.model
    count = source.config.num_layers
    config = dataclasses.replace(source.config, layers=tuple(source.config.layers[i % count]
                                                             for i in range(num_layers)))
    with torch.device(device):
        model = DiffusionGemmaTransformer(config)
    state = {name: tensor for name, tensor in source.state_dict().items() if not name.startswith("layers.")}
    for index in range(num_layers):
        layer = source.layers[index % count].state_dict()
        state |= {f"layers.{index}.{name}": tensor for name, tensor in layer.items()}
    model.load_state_dict(state)
    model.eval().requires_grad_(False)
    apply_model_options(model, ModelOptions(compile=compile))
    return dataclasses.replace(lm, model=model)


def eager_vs_compiled(num_layers: int, requests: int, batch: int, new_tokens: int, rounds: int) -> dict:
    models = {mode: gemma_with_layers(num_layers, mode) for mode in (False, True)}
    prompts, params = mixed_prompts(models[True], requests)
    params = [dataclasses.replace(p, max_new_tokens=new_tokens) for p in params]
    config = EngineConfig(max_batch_size=batch)
    started = time.perf_counter()
    lockstep({True: models[True]}, prompts, params, batch, config=config)  # compiles every bucket it meets
    warmup_s = time.perf_counter() - started
    medians: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        tokens, times = lockstep(models, prompts, params, batch, config=config)
        for mode in medians:
            medians[mode].append(median(times[mode]))
    eager, compiled = median(medians[False]), median(medians[True])
    graphs = models[True].model.compiled
    return {"layers": num_layers, "requests": requests, "batch": batch, "new_tokens": new_tokens, "rounds": rounds,
            "eager_step_ms": round(eager * 1e3, 2), "compiled_step_ms": round(compiled * 1e3, 2),
            "compiled_over_eager": round(compiled / eager, 3),
            "per_round_ratios": [round(c / e, 3) for e, c in zip(medians[False], medians[True])],
            "tokens_equal": sum(a == b for a, b in zip(tokens[False], tokens[True])), "of": requests,
            "graphs": graphs.num_graphs, "compile_failures": graphs.compile_failures, "warmup_s": round(warmup_s, 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="3,32")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {}
    for layers in map(int, args.layers.split(",")):
        results[layers] = row = eager_vs_compiled(layers, args.requests, args.batch, args.new_tokens, args.rounds)
        print(json.dumps(row), flush=True)
    if args.out is not None:
        write_results(args.out, "compiled_canvas", {"results": results}, ["compiled-canvas", *(argv or [])],
                      program="python -m research")
    return results


if __name__ == "__main__":
    main()
