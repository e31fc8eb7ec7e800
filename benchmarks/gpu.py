"""One prepared GPU run that settles the projection: calibration, the real engine end to end, each run's
trace projected beside what it measured.

    python -m benchmarks gpu --out DIR            # one H200, <= 9 minutes; everything under DIR
    python -m benchmarks gpu --smoke --out DIR    # tiny shapes on the CPU in seconds (CI)

1. ``environment.json``: versions, device, memory.
2. Host model on this device (``benchmarks.measure_host``: operations per kind x seconds per operation,
   the tiny-dimension fixture at 1 and 32 layers).
3. Calibration: forwards of the LLaDA-8B shape (bf16, random weights) over several widths and row
   counts, window rows packed as the engine packs them, each with GPU time (CUDA events) and host time
   (until the call returns, before any sync); ``fit_constants`` fits efficiency, bandwidth efficiency
   and the old launch overhead -> ``calibration.json`` (in DIR, never in the repository).
4. The real engine on the steered HumanEval replay (commit profile, real prompt widths) for
   continuous, block_sync, static and shrink, eager and compiled (a copy of the model loaded with ``compile=True``),
   a warm-up per schedule; every run's trace in ``traces/<mode>-<schedule>.jsonl``.
5. Each trace projected (host model with default and with fitted constants; the old projection) beside
   the run's measured seconds: the error per schedule; MFU = trace FLOPs / elapsed / peak.
6. bf16 batched == solo on the device, default and ``batch_invariant=True`` (``benchmarks.gpu_exactness``,
   a child process per mode; ``exactness-<mode>.json``), in a slice of the budget kept for it.

A time guard runs inside every engine run (checked each step) and between stages: what would overrun
``--time-budget-s`` is cut short and marked. Random weights: the commit profile, not the model, decides
how many positions each step commits, so threshold decoding runs at a real model's pace.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.calibrate_gpu import calibrate, random_lm, write_summary
from benchmarks.gpu_exactness import RESERVE_S, exactness_on_device
from benchmarks.gpu_runs import run_engine_modes
from benchmarks.results_io import meta, versions
from engine.models.config import TransformerConfig

SHAPES = {  # (config, mask id, eos id, logit shift): LLaDA-8B-Instruct's published config and special ids
    "llada-8b": (TransformerConfig(vocab_size=126464, hidden_size=4096, num_layers=32, num_heads=32,
                                   num_kv_heads=32, intermediate_size=12288, rope_theta=500000.0,
                                   max_position_embeddings=4096), 126336, 126081, 0),
}
SMOKE_SHAPES = {
    "llada-tiny": (TransformerConfig(vocab_size=1024, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                                     intermediate_size=128, max_position_embeddings=1024), 1000, 1001, 0),
}


def environment(device: torch.device) -> dict:
    info = {"versions": versions(), "device": str(device)}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info |= {"gpu": torch.cuda.get_device_name(device), "gpu_memory_gib": properties.total_memory / 2**30,
                 "multiprocessors": properties.multi_processor_count}
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, seconds")
    parser.add_argument("--requests", type=int, default=64, help="HumanEval replay requests per run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--time-budget-s", type=float, default=480.0, help="everything after it is cut")
    parser.add_argument("--run-cap-s", type=float, default=40.0, help="most seconds one engine run may take")
    parser.add_argument("--modes", default="eager,compiled")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    deadline = started + args.time_budget_s - (0.0 if args.smoke else RESERVE_S)  # stages before exactness
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    requests, batch_size = (3, 2) if args.smoke else (args.requests, args.batch_size)
    modes = ["eager"] if args.smoke else args.modes.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "environment.json").write_text(json.dumps(environment(device), indent=1) + "\n")
    results: dict = {"meta": meta(["gpu", *(argv or [])]), "smoke": args.smoke, "device": str(device),
                     "dtype": str(dtype), "weights": "random (normal std 0.02)", "models": {}}
    for name, (config, mask_id, eos_id, shift) in (SMOKE_SHAPES if args.smoke else SHAPES).items():
        lm = random_lm(name, config, mask_id, eos_id, shift, device, dtype)
        entry = results["models"][name] = {"parameters_b": sum(p.numel() for p in lm.model.parameters()) / 1e9}
        entry["calibration"] = calibrate(lm, device, args.smoke, deadline)
        entry["runs"] = run_engine_modes(lm, entry["calibration"], requests, batch_size, modes, deadline,
                                         args.run_cap_s, args.out / "traces", args.smoke)
        del lm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results["exactness_bf16"] = exactness_on_device(device.type, args.out, started + args.time_budget_s, args.smoke)
    results["wall_s"] = time.perf_counter() - started
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    summary = write_summary(results, args.out / "summary.txt")
    print(summary)
    return results


if __name__ == "__main__":
    main()
