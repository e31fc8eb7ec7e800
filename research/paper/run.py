"""Reproduce the paper's evaluation side by side on one model, in one process.

    python -m research paper --scale full --device cpu --out benchmarks/results/paper/
    python -m research paper --scale quick --out runs/bench-quick/          # < 3 min
    python -m research paper --scale smoke --only throughput --out runs/b/  # the CI piece

Writes ``results.json`` (raw figures, per-request latencies included, with the one results writer's
meta block), ``report.md`` and PNG figures. The projected columns use the host model
(``benchmarks.perfmodel.host_model``), measured at the start of the run (``benchmarks.measure_host``).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.replay import replay
from benchmarks.results_io import meta
from benchmarks.throughput import load_host_model
from engine.models import load_model
from research.paper import experiments, figures, report
from research.paper.workloads import humaneval_for, tiny_tasks

PIECES = ("throughput", "sweep", "capacity", "ablations")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m research paper", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="paper", choices=["paper"])
    parser.add_argument("--scale", default="full", choices=sorted(experiments.SCALES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--model", default="tiny", help="'tiny' or a local LLaDA/Dream checkpoint directory")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/latest"))
    parser.add_argument("--quick", action="store_const", dest="scale", const="quick", help="= --scale quick")
    parser.add_argument("--smoke", action="store_const", dest="scale", const="smoke", help="= --scale smoke")
    parser.add_argument("--host-model", default="measure", help="'measure' or a host-model JSON file")
    parser.add_argument("--only", default=",".join(PIECES), help=f"comma-separated subset of {PIECES}")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
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
    host = load_host_model(args.host_model, args.device, args.scale)
    results: dict = {"meta": meta(["paper", *(argv or [])], program="python -m research") | {
        "model": args.model, "dtype": args.dtype, "device": args.device, "host_model": host.to_dict(),
        "scale": args.scale, "scale_settings": scale.__dict__, "pieces": pieces}}
    durations = {}

    def timed(piece: str, function, *arguments):
        print(f"== {piece}", flush=True)
        piece_started = time.perf_counter()
        value = function(*arguments, host=host, log=lambda line: print(line, flush=True))
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
    figures.write_all(results, args.out)
    print(f"wrote {args.out}/results.json, report.md and figures in {results['meta']['wall_s']:.0f} s")
    return results


if __name__ == "__main__":
    main()
