"""Reproduce the paper's evaluation side by side on one model, in one process.

    python -m benchmarks.run --suite paper --device cpu --out benchmarks/results/cpu-full/
    python -m benchmarks.run --suite paper --quick --out /tmp/bench-quick/          # < 3 min
    python -m benchmarks.run --suite paper --smoke --only throughput --out /tmp/b/  # the CI piece

Writes ``results.json`` (raw figures, per-request latencies included), ``report.md`` and PNG figures.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks import experiments, plots, report
from benchmarks.replay import replay
from benchmarks.workloads import humaneval_for, tiny_tasks
from engine.models import load_model

PIECES = ("throughput", "sweep", "capacity", "ablations")


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs ({cpu}), torch {torch.__version__} with {torch.get_num_threads()} "
            f"threads, Python {platform.python_version()}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="paper", choices=["paper"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--model", default="tiny", help="'tiny' or a local LLaDA/Dream checkpoint directory")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/latest"))
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="scale", const="quick", help="< 3 min on 2 cores")
    size.add_argument("--smoke", action="store_const", dest="scale", const="smoke", help="seconds: CI")
    parser.add_argument("--only", default=",".join(PIECES), help=f"comma-separated subset of {PIECES}")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.set_defaults(scale="full")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(PIECES)
    if unknown:
        parser.error(f"--only: unknown piece(s) {sorted(unknown)}; choose from {PIECES}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    scale = experiments.SCALES[args.scale]
    pieces = args.only.split(",")
    started = time.perf_counter()
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    heldout = tiny_tasks("heldout", scale.heldout)
    humaneval = humaneval_for(lm, scale.humaneval, scale.humaneval_max_new_tokens)
    replay_code = replay("humaneval", lm, scale.replay_requests)  # answer lengths replayed, EOS steered
    replay_short = replay("short", lm, scale.replay_requests)
    code_lm, short_lm = replay_code.steered(lm), replay_short.steered(lm)
    results: dict = {"meta": {
        "command": "python -m benchmarks.run " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(), "model": args.model, "dtype": args.dtype, "device": args.device,
        "scale": args.scale, "scale_settings": scale.__dict__, "pieces": pieces}}
    durations = {}

    def timed(piece: str, function, *arguments):
        print(f"== {piece}", flush=True)
        piece_started = time.perf_counter()
        value = function(*arguments, log=lambda line: print(line, flush=True))
        durations[piece] = time.perf_counter() - piece_started
        return value

    if "throughput" in pieces:
        cases = [(heldout, lm), (humaneval, lm), (replay_code.workload, code_lm), (replay_short.workload, short_lm)]
        results["throughput"] = timed("throughput", experiments.throughput, cases, scale)
    if "sweep" in pieces:
        results["batch_sweep"] = timed("sweep", experiments.batch_sweep, short_lm,
                                       replay_short.workload.head(scale.sweep_requests), scale)
    if "capacity" in pieces:
        results["capacity"] = {w.name: timed(f"capacity {w.name}", experiments.capacity, model, w, scale)
                               for w, model in ((heldout.head(scale.ablation_requests), lm),
                                                (replay_code.workload, code_lm))}
    if "ablations" in pieces:
        results["ablations"] = timed("ablations", experiments.ablations, short_lm, replay_short.workload, scale)
    results["meta"]["durations_s"] = durations
    results["meta"]["wall_s"] = time.perf_counter() - started

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (args.out / "report.md").write_text(report.render(results))
    plots.write_all(results, args.out)
    print(f"wrote {args.out}/results.json, report.md and figures in {results['meta']['wall_s']:.0f} s")
    return results


if __name__ == "__main__":
    main()
