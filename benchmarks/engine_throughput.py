"""Issue 3's performance check: block vs static vs shrink on the tiny model, one process, interleaved.

    python -m benchmarks.engine_throughput                      # 256 demo prompts, 3 rounds (~15 min, 2 cores)
    python -m benchmarks.engine_throughput --requests 16 --rounds 1 --sweep-requests 4   # seconds

Targets (issue 3): block/static tokens/s >= 2.5, block/shrink >= 1.3, block useful_row_fraction >= 0.9,
scheduler overhead (elapsed - model time) <= 5% of elapsed. Also the paper's effective compute ratio
of all three schedules at batch sizes 1, 4 and 16 (batch 16 from the main rounds).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.run import machine_description
from benchmarks.systems import SYSTEMS, interleaved, median_of
from benchmarks.workloads import tiny_tasks
from engine.models import load_model

TARGETS = {"block_over_static": 2.5, "block_over_shrink": 1.3, "block_useful_row_fraction": 0.9,
           "max_scheduler_overhead": 0.05}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=256, help="demo prompts per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sweep-requests", type=int, default=64, help="prompts per batch-1/4 ECR run")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--oracle-lengths", action="store_true",
                        help="cap each request at its true answer length (no EOS stop): see workloads.tiny_tasks")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_throughput.json"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    lm = load_model(args.model, device="cpu", dtype="float32")
    workload = tiny_tasks("demo", args.requests, max_new_tokens=256, oracle_lengths=args.oracle_lengths)
    variants = {system: {"system": system, "max_batch_size": 16} for system in SYSTEMS}
    runs = interleaved(lm, variants, workload, args.rounds)
    medians = {system: {key: median_of(results, key) for key in (
        "tokens_per_s", "useful_row_fraction", "effective_compute_ratio", "scheduler_overhead_fraction",
        "padding_fraction", "denoise_steps", "block_cycles", "elapsed_s", "model_time_s")}
        for system, results in runs.items()}
    for system, results in runs.items():
        medians[system]["tokens_per_s_per_round"] = [r.tokens_per_s for r in results]
        medians[system]["exact_match"] = results[0].accuracy
        medians[system]["outputs_digest"] = results[0].extra["outputs_digest"]
    ecr = {16: {system: medians[system]["effective_compute_ratio"] for system in SYSTEMS}}
    for batch_size in (1, 4):
        sweep = interleaved(lm, {s: {"system": s, "max_batch_size": batch_size} for s in SYSTEMS},
                            workload.head(args.sweep_requests), 1)
        ecr[batch_size] = {system: results[0].stats["effective_compute_ratio"] for system, results in sweep.items()}
    block = medians["block"]
    figures = {
        "block_over_static": block["tokens_per_s"] / medians["static"]["tokens_per_s"],
        "block_over_shrink": block["tokens_per_s"] / medians["shrink"]["tokens_per_s"],
        "block_useful_row_fraction": block["useful_row_fraction"],
        "max_scheduler_overhead": max(m["scheduler_overhead_fraction"] for m in medians.values())}
    met = {key: (value <= TARGETS[key] if key.startswith("max_") else value >= TARGETS[key])
           for key, value in figures.items()}
    result = {"machine": machine_description(), "command": "python -m benchmarks.engine_throughput "
              + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
              "workload": workload.notes, "requests": len(workload), "rounds": args.rounds, "medians": medians,
              "effective_compute_ratio_by_batch": ecr, "figures": figures, "targets": TARGETS, "met": met,
              "identical_outputs": len({m["outputs_digest"] for m in medians.values()}) == 1,
              "wall_s": time.perf_counter() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'system':>8} {'tok/s':>8} {'URF':>6} {'ECR':>6} {'overhead':>9} {'EM':>6}")
    for system, m in medians.items():
        print(f"{system:>8} {m['tokens_per_s']:8.1f} {m['useful_row_fraction']:6.3f} "
              f"{m['effective_compute_ratio']:6.3f} {m['scheduler_overhead_fraction']:9.2%} {m['exact_match']}")
    print("ECR by batch size:", json.dumps(ecr))
    for key, value in figures.items():
        print(f"{key}: {value:.3f} (target {'<=' if key.startswith('max_') else '>='} {TARGETS[key]}) "
              f"{'MET' if met[key] else 'MISSED'}")
    print(f"wrote {args.out} in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
