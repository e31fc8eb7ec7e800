"""Eager vs compiled steps of the demo job's engine: the shipped tiny model on the demo prompts.

The engine is the one ``configs/tiny-cpu.yaml`` runs (its engine section, chat-formatted prompts sorted
by length, as the job's length buckets feed them, one thread). Unlike ``research.compiled_step``'s deep,
narrow copies, this step is bound by its arithmetic: 16 rows of ~90 tokens refreshed at most steps. So
it shows what padding costs a compiled step. Both modes run in lockstep after the compiled one has met
every shape once, and the report gives the ratio of total and median step times, the graphs compiled
and the tokens compared. ``--static-shapes`` compiles CUDA's bucketed shapes instead of exact ones.

    python -m research compiled-job-step                  # 256 demo prompts
    python -m research compiled-job-step --static-shapes  # the bucketed rule, for comparison
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.summary import median
from engine import SamplingParams
from engine.models import load_model
from engine.models.compiled import CompiledForward
from pipeline.config import load_config
from research.compiled_step import lockstep

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG = REPO_ROOT / "configs" / "tiny-cpu.yaml"


def demo_workload(count: int) -> tuple[list, list[SamplingParams]]:
    """The first ``count`` demo rows as chat messages, shortest first, with the job's sampling."""
    config = load_config(CONFIG)
    rows = [json.loads(line) for line in (REPO_ROOT / config.input).read_text().splitlines()][:count]
    rows.sort(key=lambda row: len(row[config.prompt_column]))
    prompts = [[{"role": "user", "content": row[config.prompt_column]}] for row in rows]
    params = SamplingParams(max_new_tokens=config.sampling.max_new_tokens, temperature=config.sampling.temperature)
    return prompts, [params] * len(rows)


def eager_vs_compiled(count: int, static_shapes: bool) -> dict:
    config = load_config(CONFIG)
    models = {mode: load_model(config.model, device="cpu", dtype=config.dtype, compile=mode) for mode in (False, True)}
    models[True].model.compiled = CompiledForward(models[True].model, static_shapes)
    prompts, params = demo_workload(count)
    started = time.perf_counter()
    lockstep({True: models[True]}, prompts, params, config=config.engine)  # compiles every shape it meets
    compile_s = time.perf_counter() - started
    tokens, times = lockstep(models, prompts, params, config=config.engine)
    total = {mode: sum(times[mode]) for mode in times}
    medians = {mode: median(times[mode]) for mode in times}
    forward = models[True].model.compiled
    return {"prompts": count, "static_shapes": static_shapes, "steps": len(times[True]),
            "eager_total_s": round(total[False], 2), "compiled_total_s": round(total[True], 2),
            "compiled_over_eager_total": round(total[True] / total[False], 3),
            "compiled_over_eager_median": round(medians[True] / medians[False], 3),
            "first_run_with_compiling_s": round(compile_s, 1), "graphs": forward.num_graphs,
            "shapes": sorted(map(list, forward.shapes), key=str),
            "tokens_equal": sum(a == b for a, b in zip(tokens[False], tokens[True])), "of": count}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=256, help="demo rows to run")
    parser.add_argument("--static-shapes", action="store_true", help="bucketed static shapes (CUDA's rule)")
    args = parser.parse_args(argv)
    torch.set_num_threads(load_config(CONFIG).torch_threads)
    result = eager_vs_compiled(args.prompts, args.static_shapes)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
