"""Eager vs compiled steps on a model whose step cost is host cost: a test fixture's shape, 32 layers deep.

A 32-layer LLaDA-shaped model with hidden size 32 does almost no arithmetic per step, so its CPU step
time is what the host spends issuing operations: the share of a small GPU step that compilation (and
on CUDA, graph capture) exists to remove. Same workload, same weights, both modes in one process,
stepped alternately (lockstep); reported as the ratio of median step times, with the tokens compared and the
number of compiled graphs. The arithmetic is not zero on this CPU (a window step of 8 rows x 32
tokens still scores 128 keys per head in every layer), so the compiled step's time spent inside its
GEMM and attention kernels is measured too (``kernel_ms``, torch.profiler self time): a floor that no
reduction of host work goes below. ``--hidden`` / ``--heads`` shrink the model to where it is lower.
``--mixed`` also runs a 64-request mixed workload (arrivals, different prompt lengths) under all four
schedules on one compiled model and reports the graphs it compiled.

    python -m research compiled-step                 # 32 layers, 16 requests, 3 rounds
    python -m research compiled-step --mixed         # + the 64-request graph count
    python -m research compiled-step --hidden 8 --heads 1   # less arithmetic per operation
    python -m research compiled-step --family tiny-sdar --batch 16 --new-tokens 64 --profile

``--family`` picks the fixture (``tiny-llada``, ``tiny-dream``, ``tiny-sdar``, ``tiny-llada2``),
``--batch`` the engine's rows, ``--new-tokens`` one cap for every request (default: 1-3 blocks), and
``--profile`` adds where the compiled step's time goes by phase (``research.compiled_profile``).
``--ops`` adds each mode's costliest operations a step, the compiled graphs' kernels by name.
``--static-shapes`` compiles bucketed, static shapes, CUDA's rule, instead of the CPU's exact shapes
(``engine.models.compiled_shapes``).
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import time

import torch

from benchmarks.host_ops import FIXTURES, mixed_prompts, with_layers
from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig
from engine.config import SCHEDULES
from engine.models import ModelOptions, load_model
from engine.models.compiled import CompiledForward
from engine.models.loader import DiffusionLM, apply_model_options
from engine.models.transformer import BidirectionalTransformer
from research.compiled_profile import phase_shares, top_operations

# the kernels that do a step's arithmetic (GEMMs, attention): what compiling cannot remove
KERNELS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def timed_run(lm: DiffusionLM, prompts, params, batch: int = 8) -> tuple[list[list[int]], list[float]]:
    """Tokens of every request and the wall time of every step, the workload queued at once."""
    mode = lm.options.compile
    tokens, times = lockstep({mode: lm}, prompts, params, batch)
    return tokens[mode], times[mode]


def lockstep(models: dict[bool, DiffusionLM], prompts, params, batch: int = 8,
             profile: cProfile.Profile | None = None, config: EngineConfig | None = None) -> tuple[dict, dict]:
    """One engine per mode (compile False / True: each its own model object, loaded so, same weights),
    the same workload queued on each, stepped alternately: step i of both runs the same batch, side by
    side in time, so a change in the machine's load falls on both. Tokens and step times per mode;
    ``profile``, when given, runs over the compiled engine's steps only; ``config`` replaces the engine
    config of ``batch`` rows."""
    config = config or EngineConfig(max_batch_size=batch)
    engines = {mode: BlockServeEngine(lm, config) for mode, lm in models.items()}
    ids = {mode: [engine.add_request(p, q) for p, q in zip(prompts, params)] for mode, engine in engines.items()}
    outputs = {mode: {} for mode in engines}
    times = {mode: [] for mode in engines}
    while any(engine.has_unfinished_requests() for engine in engines.values()):
        for mode, engine in engines.items():
            if engine.has_unfinished_requests():
                profiled = profile is not None and mode
                if profiled:
                    profile.enable()
                started = time.perf_counter()
                finished = engine.step().finished
                times[mode].append(time.perf_counter() - started)
                if profiled:
                    profile.disable()
                outputs[mode].update({o.request_id: o.token_ids for o in finished})
    return {mode: [outputs[mode][i] for i in ids[mode]] for mode in engines}, times


def llada_shaped(layers: int, hidden: int | None = None, heads: int | None = None,
                 compile: bool = False, family: str = "tiny-llada") -> DiffusionLM:
    """A test fixture's family and tokenizer (LLaDA's by default) with ``layers`` random layers,
    optionally narrower (``hidden``, ``heads``; the MLP keeps its 2x ratio), run compiled or not: the
    same weights either way."""
    lm = with_layers(load_model(FIXTURES / family, dtype="float32"), layers, compile=compile)
    if hidden is None and heads is None:
        return lm
    config = lm.model.config
    hidden = hidden or config.hidden_size
    heads = heads or config.num_heads
    config = dataclasses.replace(config, hidden_size=hidden, num_heads=heads, num_kv_heads=heads,
                                 intermediate_size=2 * hidden)
    torch.manual_seed(0)
    model = BidirectionalTransformer(config).eval().requires_grad_(False)
    apply_model_options(model, ModelOptions(compile=compile))
    return dataclasses.replace(lm, model=model)


def kernel_ms_per_step(lm: DiffusionLM, prompts, params, batch: int = 8) -> float:
    """Self time of the arithmetic kernels (``KERNELS``) per step, one run under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _, steps = timed_run(lm, prompts, params, batch)
    total_us = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in KERNELS)
    return total_us / 1e3 / len(steps)


def kernel_floor(models: dict[bool, DiffusionLM], prompts, params, batch: int = 8,
                 runs: int = 2) -> dict[str, float]:
    """Per mode, the least kernel time per step over ``runs`` profiled runs, the modes alternating."""
    samples = {mode: [] for mode in models}
    for _ in range(runs):
        for mode, lm in models.items():
            samples[mode].append(kernel_ms_per_step(lm, prompts, params, batch))
    return {("compiled" if mode else "eager"): round(min(values), 2) for mode, values in samples.items()}


@dataclasses.dataclass(frozen=True)
class Workload:
    """The fixture and the requests a comparison runs: ``new_tokens`` None gives caps of 1-3 blocks."""

    family: str = "tiny-llada"
    requests: int = 16
    batch: int = 8
    new_tokens: int | None = None

    def prompts(self, lm: DiffusionLM) -> tuple[list, list]:
        prompts, params = mixed_prompts(lm, self.requests)
        if self.new_tokens is not None:
            params = [dataclasses.replace(p, max_new_tokens=self.new_tokens) for p in params]
        return prompts, params


def eager_vs_compiled(layers: int, workload: Workload, rounds: int, hidden: int | None = None,
                      heads: int | None = None, profile: bool = False, floor: bool = True,
                      static_shapes: bool = False, operations: bool = False) -> dict:
    models = {mode: llada_shaped(layers, hidden, heads, mode, workload.family) for mode in (False, True)}
    lm = models[True]
    lm.model.compiled = CompiledForward(lm.model, static_shapes)
    prompts, params = workload.prompts(lm)
    started = time.perf_counter()
    timed_run(lm, prompts, params, workload.batch)  # compiles every bucket this workload meets
    compile_s = time.perf_counter() - started
    medians = {False: [], True: []}
    for _ in range(rounds):
        tokens, times = lockstep(models, prompts, params, workload.batch)
        for mode in medians:
            medians[mode].append(median(times[mode]))
    eager, compiled = median(medians[False]), median(medians[True])
    config = lm.model.config
    phases = {}
    if profile:
        profiler = cProfile.Profile()
        _, times = lockstep(models, prompts, params, workload.batch, profiler)
        phases = {"compiled_phases_ms": phase_shares(profiler, len(times[True]))}
    if operations:
        phases |= {f"{'compiled' if mode else 'eager'}_operations": top_operations(
            lambda model=model: len(timed_run(model, prompts, params, workload.batch)[1]))
            for mode, model in models.items()}
    return {"family": workload.family, "layers": layers, "hidden": config.hidden_size, "heads": config.num_heads,
            "requests": workload.requests, "batch": workload.batch, "rounds": rounds,
            "eager_step_ms": round(eager * 1e3, 2), "compiled_step_ms": round(compiled * 1e3, 2),
            "compiled_over_eager": round(compiled / eager, 3),
            "per_round_ratios": [round(c / e, 3) for e, c in zip(medians[False], medians[True])],
            "kernel_ms": kernel_floor(models, prompts, params, workload.batch) if floor else None,
            "compile_s": round(compile_s, 1), "graphs": lm.model.compiled.num_graphs, "static_shapes": static_shapes,
            "tokens_equal": sum(a == b for a, b in zip(tokens[False], tokens[True])), "of": workload.requests} | phases


def mixed_graph_count(count: int = 64) -> dict:
    """Graphs a compiled model needs for a mixed run: arrivals mid-flight, prompt lengths and caps
    varied, every schedule."""
    lm = with_layers(load_model(FIXTURES / "tiny-llada", dtype="float32"), 2, compile=True)
    prompts, params = mixed_prompts(lm, count)
    for schedule in SCHEDULES:
        engine = BlockServeEngine(lm, EngineConfig(max_batch_size=16, schedule=schedule))
        for index, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request(prompt, p)
            if index % 4 == 3:
                engine.step()  # arrivals while others run
        while engine.has_unfinished_requests():
            engine.step()
    return {"requests": count, "schedules": list(SCHEDULES), "graphs": lm.model.compiled.num_graphs,
            "shapes": sorted(map(list, lm.model.compiled.shapes), key=str)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=None, help="hidden size (default: the fixture's, 32)")
    parser.add_argument("--heads", type=int, default=None, help="attention heads (default: the fixture's, 4)")
    parser.add_argument("--family", default="tiny-llada", help="the test fixture whose shape is copied")
    parser.add_argument("--batch", type=int, default=8, help="the engine's max_batch_size")
    parser.add_argument("--new-tokens", type=int, default=None, help="every request's cap (default: 1-3 blocks)")
    parser.add_argument("--profile", action="store_true", help="also the compiled step's time by phase")
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument("--static-shapes", action="store_true", help="bucketed static shapes (CUDA's rule)")
    parser.add_argument("--ops", action="store_true",
                        help="also each mode's costliest operations a step, inductor's kernels by name")
    parser.add_argument("--no-kernel-floor", action="store_true",
                        help="skip the profiled kernel floor (a deep MoE copy's trace took over ten minutes)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # host cost, not parallel arithmetic
    workload = Workload(args.family, args.requests, args.batch, args.new_tokens)
    if args.ops:  # before compiling: the generated kernels then record themselves
        torch._inductor.config.cpp.enable_kernel_profile = True
    result = {"step": eager_vs_compiled(args.layers, workload, args.rounds, args.hidden, args.heads, args.profile,
                                        not args.no_kernel_floor, args.static_shapes, args.ops)}
    if args.mixed:
        result["mixed"] = mixed_graph_count()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
