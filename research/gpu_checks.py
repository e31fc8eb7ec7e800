"""The GPU checks of the compiled step (issue 41), prefix caching (issue 40), Nemotron's modes, tensor parallel,
Fast-dLLM v2 (issue 67) and FP8 weights (issue 65).

    python -m research gpu-checks --out DIR            # one H200, under --time-budget-s
    python -m research gpu-checks --smoke --out DIR    # the same path on the CPU, tiny sizes
    python -m research gpu-checks --stages tensor-parallel --out DIR    # 2 GPUs or more

Stages, in this order (``--stages`` picks some):

1. ``tensor-parallel`` (``research.gpu_tensor_parallel``): each family's fixture in bf16 at
   ``tensor_parallel_size=2`` against 1, stepped in turn: answers compared and step times. On fewer than 2
   GPUs (this project's lent machines have one) it records that it skips.
2. ``compiled``: each family's test fixture, 32 layers deep, float32, 16 requests of 64 new tokens at
   batch 16. Eager and compiled engines step alternately on the same weights. Reported: the median
   step of each, the tokens compared, the graphs compiled, and the CUDA graphs captured and replayed
   (counted at ``torch.cuda.CUDAGraph``'s capture and replay).
3. ``prefix-cache``: SDAR-8B's layer shapes (36 layers, hidden 4096, 32 query and 8 key/value heads, MLP
   12288) with random bf16 weights and the SDAR fixture's tokenizer and vocabulary; one 1,024-token
   instruction before 64 distinct questions, 64-token answers, the cache on against off, interleaved
   (``research.prefix_cache``): measured tok/s, forwarded tokens, hit rate, answers compared.
4. ``compiled-8b``: LLaDA-8B's layer shapes in bf16 (the fixture's vocabulary), 16 requests of 64 new
   tokens at batch 16: eager against compiled with CUDA graphs, stepped alternately.
5. ``compiled-canvas``: DiffusionGemma's fixture, 32 layers deep (``research.compiled_canvas``), float32,
   as stage 2 measures the other families: steps, tokens, graphs, CUDA graphs captured and replayed.

6. ``nemotron``: Nemotron-Labs-Diffusion-8B's layer shapes (34 layers, hidden 4096, 32 query and 8 key/value
   heads, MLP 14336) with random bf16 weights and the fixture's vocabulary, eager: its dLM, autoregressive and
   ``linear_spec`` modes at batch 1 and 16 in turn (``research.nemotron``): tok/s, tokens per forward, model
   calls, speculation's answers against autoregressive ones. What a forward costs is the figure to read; a
   random model's acceptance is not the release's.
7. ``fast-dllm-v2``: Fast_dLLM_v2_7B's layer shapes (Qwen2.5-7B) in bf16 with the fixture's vocabulary, eager,
   ``low_confidence`` 0.9 in sub-blocks of 8, batch 1 and 32 (``research.fast_dllm_v2_7b``): tok/s, tokens per
   forward, model calls.
8. ``fp8``: LLaDA2.0-mini's widths (8 layers) loaded in bf16 and with ``quantization="fp8"``, stepped in turn on
   the same requests (``research.fp8_weights``): step time ratio, weight bytes, memory, ``torch._scaled_mm``
   calls, answer tokens that agree.

``prefix-cache-compiled``, only when named, is stage 3 on a compiled model: each mode runs once to
compile and capture its graphs before the timed rounds. Eagerly the step's host cost is the same with
the cache on and off, which dilutes the gain; CUDA graphs remove most of it.

``DIR/gpu_checks.json`` is rewritten after every stage. A deadline checked before every step stops a
stage that would overrun (a compile in progress cannot be cut); a stage that fails is recorded with
its error and the next one runs.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks.gpu import environment
from benchmarks.host_ops import FIXTURES, with_layers
from benchmarks.results_io import meta
from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig
from engine.models import ModelOptions, load_model
from engine.models.loader import DiffusionLM, apply_model_options
from engine.models.transformer import BidirectionalTransformer
from research import prefix_cache
from research.compiled_step import Workload
from research.fast_dllm_v2_7b import fast_dllm_v2_7b
from research.fp8_weights import fp8_weights
from research.gpu_tensor_parallel import in_turn, tensor_parallel

STAGES = ("tensor-parallel", "compiled", "prefix-cache", "compiled-8b", "compiled-canvas", "nemotron", "fast-dllm-v2",
          "fp8")  # in order
FAMILY_LAYERS = {"tiny-llada": 32, "tiny-sdar": 32, "tiny-llada2": 32, "tiny-dream": 32}
SDAR_8B = dict(num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=12288)
NEMOTRON_8B = dict(num_layers=34, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                   intermediate_size=14336)
LLADA_8B = dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, intermediate_size=12288)
SMOKE_DIMS = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128)


@contextlib.contextmanager
def counting_cuda_graphs():
    """Counts of ``torch.cuda.CUDAGraph.capture_begin`` and ``.replay`` calls inside the block."""
    counts: collections.Counter = collections.Counter()
    graph_class = torch.cuda.CUDAGraph
    originals = {name: getattr(graph_class, name) for name in ("capture_begin", "replay")}

    def counted(name: str):
        def call(self, *args, **kwargs):
            counts[name] += 1
            return originals[name](self, *args, **kwargs)
        return call

    for name in originals:
        setattr(graph_class, name, counted(name))
    try:
        yield counts
    finally:
        for name, method in originals.items():
            setattr(graph_class, name, method)


def cudagraph_counters() -> dict[str, int]:
    """Inductor's own CUDA-graph counters (skips and their kinds), zero on a CPU run."""
    from torch._dynamo.utils import counters
    return {key: value for key, value in counters["inductor"].items() if "cudagraph" in key}


def failure(error: Exception) -> dict:
    return {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}


def shaped(fixture: str, dims: dict, device: str, dtype: torch.dtype, compile: bool = False) -> DiffusionLM:
    """``fixture``'s family, tokenizer and vocabulary with random layers of ``dims``, built on ``device``."""
    lm = load_model(FIXTURES / fixture, device=device, dtype="float32")
    config = dataclasses.replace(lm.model.config, **dims)
    torch.manual_seed(0)
    with torch.device(device):
        model = BidirectionalTransformer(config)
    model = model.to(dtype).eval().requires_grad_(False)
    apply_model_options(model, ModelOptions(compile=compile))
    return dataclasses.replace(lm, model=model)


def alternate(models: dict[str, DiffusionLM], prompts, params, batch: int, stop_at: float) -> dict:
    """Engines over ``models`` stepped in turn until done or ``stop_at``: each mode's step seconds and
    answers, and whether the deadline cut the run."""
    config = EngineConfig(max_batch_size=batch, max_model_len=256)  # prompts of <= 45 tokens, <= 64 new
    engines = {mode: BlockServeEngine(lm, config) for mode, lm in models.items()}
    return in_turn(engines, prompts, params, stop_at)


def eager_vs_compiled(models: dict[str, DiffusionLM], requests: int, new_tokens: int, batch: int,
                      stop_at: float) -> dict:
    """One warm-up run of the compiled model (it compiles its buckets), then both modes alternately."""
    lm = models["compiled"]
    prompts, params = Workload(requests=requests, new_tokens=new_tokens).prompts(lm)
    started = time.perf_counter()
    with counting_cuda_graphs() as warmup:
        alternate({"compiled": lm}, prompts, params, batch, stop_at)
    compile_s = time.perf_counter() - started
    with counting_cuda_graphs() as measured:
        run = alternate(models, prompts, params, batch, stop_at)
    steps = {mode: median(times) * 1e3 if times else None for mode, times in run["steps"].items()}
    equal = None if run["answers"] is None else sum(
        a == b for a, b in zip(run["answers"]["eager"], run["answers"]["compiled"]))
    return {"requests": requests, "new_tokens": new_tokens, "batch": batch, "cut": run["cut"],
            "steps": {mode: len(times) for mode, times in run["steps"].items()},
            "eager_step_ms": steps["eager"], "compiled_step_ms": steps["compiled"],
            "compiled_over_eager": steps["compiled"] / steps["eager"] if steps["eager"] and steps["compiled"] else None,
            "tokens_equal": equal, "of": requests, "warmup_s": compile_s,
            "graphs": lm.model.compiled.num_graphs, "shapes": sorted(map(list, lm.model.compiled.shapes), key=str),
            "compile_failures": lm.model.compiled.compile_failures,
            "cuda_graphs_captured": warmup["capture_begin"] + measured["capture_begin"],
            "captured_after_warmup": measured["capture_begin"], "cuda_graph_replays": measured["replay"],
            "inductor_cudagraph_counters": cudagraph_counters()}


def compiled_families(device: str, smoke: bool, stop_at: float,
                      families: tuple[str, ...] = tuple(FAMILY_LAYERS)) -> dict:
    out = {}
    for fixture in families:
        layers = FAMILY_LAYERS[fixture]
        if time.perf_counter() > stop_at:
            out[fixture] = "skipped: time budget"
            continue
        base = load_model(FIXTURES / fixture, device=device, dtype="float32")
        models = {mode: with_layers(base, 2 if smoke else layers, device=device, compile=mode == "compiled")
                  for mode in ("eager", "compiled")}
        try:
            out[fixture] = {"layers": 2 if smoke else layers} | eager_vs_compiled(
                models, 4 if smoke else 16, 8 if smoke else 64, 4 if smoke else 16, stop_at)
        except Exception as error:  # the next family still runs
            out[fixture] = failure(error)
        print(f"compiled {fixture}: {json.dumps(out[fixture])}", flush=True)
    return out


def prefix_cache_8b(device: str, smoke: bool, stop_at: float, compile: bool = False) -> dict:
    dims, dtype = (SMOKE_DIMS, torch.float32) if smoke else (SDAR_8B, torch.bfloat16)
    lm = shaped("tiny-sdar", dims, device, dtype, compile=compile)
    scale = dict(instruction=128 if smoke else 1024, requests=8 if smoke else 64, answer=16 if smoke else 64,
                 rounds=1 if smoke else 2)
    settings = prefix_cache.FAMILIES["sdar"][1]
    warmup_s = 0.0
    if compile:  # every graph either mode needs is compiled and captured before the timed rounds
        started = time.perf_counter()
        for caching in (False, True):
            prefix_cache.measure(lm, settings, "instruction", caching, scale, "sdar-8b")
        warmup_s = time.perf_counter() - started
    return {"dims": dims, "dtype": str(dtype), "scale": scale, "compiled": compile, "warmup_s": warmup_s,
            "instruction": prefix_cache.compare(lm, settings, "instruction", scale, "sdar-8b")}


def compiled_8b(device: str, smoke: bool, stop_at: float) -> dict:
    dims, dtype = (SMOKE_DIMS, torch.float32) if smoke else (LLADA_8B, torch.bfloat16)
    models = {mode: shaped("tiny-llada", dims, device, dtype, compile=mode == "compiled")
              for mode in ("eager", "compiled")}
    models["compiled"].model.load_state_dict(models["eager"].model.state_dict())
    return {"dims": dims, "dtype": str(dtype)} | eager_vs_compiled(models, 4 if smoke else 16, 8 if smoke else 64,
                                                                    4 if smoke else 16, stop_at)


def compiled_canvas(device: str, smoke: bool, stop_at: float) -> dict:
    """DiffusionGemma's compiled canvases against its eager step (stage 4)."""
    from research.compiled_canvas import gemma_with_layers

    layers = 2 if smoke else 32
    models = {mode: gemma_with_layers(layers, mode == "compiled", device) for mode in ("eager", "compiled")}
    return {"layers": layers} | eager_vs_compiled(models, 4 if smoke else 16, 16 if smoke else 64,
                                                  4 if smoke else 16, stop_at)


def nemotron_8b(device: str, smoke: bool, stop_at: float) -> dict:
    """Nemotron-Labs-Diffusion's three modes at the 8B's layer shapes (stage 5)."""
    from engine.models.anchored.model import AnchoredTransformer
    from research.nemotron import measure, workload

    dims, dtype = (SMOKE_DIMS, torch.float32) if smoke else (NEMOTRON_8B, torch.bfloat16)
    lm = load_model(FIXTURES / "tiny-nemotron_labs_diffusion", device=device, dtype="float32")
    torch.manual_seed(0)
    with torch.device(device):
        model = AnchoredTransformer(dataclasses.replace(lm.model.config, **dims))
    model = model.to(dtype).eval().requires_grad_(False)
    apply_model_options(model, ModelOptions())
    rows = measure(dataclasses.replace(lm, model=model), dims["num_layers"], workload(4 if smoke else 16),
                   [1, 4] if smoke else [1, 16], 8 if smoke else 64, 1 if smoke else 2, max_model_len=256)
    return {"dims": dims, "dtype": str(dtype), "measured": rows}


RUNNERS = {"compiled": compiled_families, "compiled-canvas": compiled_canvas, "prefix-cache": prefix_cache_8b,
           "compiled-8b": compiled_8b, "prefix-cache-compiled": functools.partial(prefix_cache_8b, compile=True),
           "nemotron": nemotron_8b, "tensor-parallel": tensor_parallel, "fast-dllm-v2": fast_dllm_v2_7b,
           "fp8": fp8_weights}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m research gpu-checks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--families", default=",".join(FAMILY_LAYERS), help="the compiled stage's fixtures")
    parser.add_argument("--time-budget-s", type=float, default=420.0)
    argv = sys.argv[1:] if argv is None else argv  # the record's command holds the options given
    args = parser.parse_args(argv)
    started = time.perf_counter()
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"meta": meta(["gpu-checks", *(argv or [])], program="python -m research"),
                     "environment": environment(torch.device(device)),
                     "stages": {}}
    stages = args.stages.split(",")
    if unknown := set(stages) - set(RUNNERS):
        parser.error(f"unknown stages {sorted(unknown)}; the stages are {', '.join(RUNNERS)}")
    for index, stage in enumerate(stages):
        # each stage may run until its share of what is left, the last one until the end
        stop_at = started + args.time_budget_s
        stop_at = time.perf_counter() + (stop_at - time.perf_counter()) / (len(stages) - index) * (
            1.6 if index < len(stages) - 1 else 1.0)
        stage_started = time.perf_counter()
        try:
            extra = (tuple(args.families.split(",")),) if stage == "compiled" else ()
            results["stages"][stage] = RUNNERS[stage](device, args.smoke, stop_at, *extra)
        except Exception as error:  # the next stage still runs; the error is the result
            results["stages"][stage] = failure(error)
        results["stages"][stage] = {"seconds": time.perf_counter() - stage_started} | results["stages"][stage]
        print(f"== {stage} done after {time.perf_counter() - started:.0f} s", flush=True)
        (args.out / "gpu_checks.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return results


if __name__ == "__main__":
    main()
