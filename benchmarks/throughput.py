"""The schedules side by side on the replay workloads: CPU measured, GPU projected with a host model.

    python -m benchmarks throughput --scale full --out DIR            # HumanEval replay, 64 requests, 3 rounds
    python -m benchmarks throughput --workload short --requests 64 --out DIR
    python -m benchmarks throughput --commit-profile none --widths text --out DIR   # the replay before issue 19
    python -m benchmarks throughput --scale quick --compile --out DIR   # every schedule compiled

Every schedule runs the same requests, interleaved round by round, on the model steered to the replay's
answer lengths and commit profile (``benchmarks.replay``). Per schedule: CPU tokens/s (measured),
forwards (refresh / window), rows per forward, padding, steps per block, and each run's own trace
projected for LLaDA-8B shapes on an H200 twice: with the host model (``benchmarks.perfmodel.host_model``,
measured on this machine at the start of the run unless a calibration file is given) and with the old
projection (GPU time + 1.92 ms per forward), plus a sensitivity table of the host-model projection to
its uncertain constants.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import measure_host
from benchmarks.commit_profile import LLADA_THRESHOLD_09
from benchmarks.perfmodel.host_model import HostModel
from benchmarks.perfmodel.projection import load_constants, project
from benchmarks.perfmodel.sensitivity import sensitivity_variants
from benchmarks.replay import WIDTHS, replay
from benchmarks.results_io import write_results
from benchmarks.summary import median, median_item
from benchmarks.systems import SYSTEMS, RunResult, interleaved

SCALES = {"smoke": {"requests": 6, "rounds": 1, "batch_size": 4},
          "quick": {"requests": 24, "rounds": 1, "batch_size": 16},
          "full": {"requests": 64, "rounds": 3, "batch_size": 16}}
STATS_KEYS = ("tokens_per_s", "denoise_steps", "refresh_forwards", "window_forwards", "rows_per_forward",
              "rows_per_window_forward", "padding_fraction", "useful_row_fraction", "effective_compute_ratio",
              "scheduler_overhead_fraction", "generated_tokens")


def project_run(result: RunResult, host: HostModel, model: str = "llada-8b", device: str = "h200") -> dict:
    trace, tokens = result.extra["trace"], result.stats["generated_tokens"]
    constants = load_constants(device)
    new = project(trace, tokens, model, device, constants, host=host)
    old = project(trace, tokens, model, device, constants)
    sensitivity = {label: project(trace, tokens, model, device, c, host=h)["tokens_per_s"]
                   for label, (c, h) in sensitivity_variants(constants, host).items()}
    return {"tokens_per_s": new["tokens_per_s"], "mfu": new["mfu"], "total_s": new["total_s"],
            "refresh_s": new["refresh_s"], "window_s": new["window_s"], "gpu_s": new["gpu_s"],
            "host_s": new["host_s"], "host_bound_calls": new["host_bound_calls"], "calls": new["calls"],
            "old_tokens_per_s": old["tokens_per_s"], "old_mfu": old["mfu"],
            "forward_tokens": sum(record.forward_tokens for record in trace),
            "sensitivity_tokens_per_s": sensitivity, "constants": constants.to_dict()}


def steps_per_block(result: RunResult) -> float:
    blocks = sum(request["num_blocks"] for request in result.requests)
    return sum(record.rows for record in result.extra["trace"]) / max(blocks, 1)


def summarize(runs: dict[str, list[RunResult]], host: HostModel) -> dict:
    table = {}
    for system, results in runs.items():
        middle = median_item(results, key=lambda run: run.tokens_per_s)
        table[system] = {key: median(run.stats[key] for run in results) for key in STATS_KEYS}
        table[system] |= {"tokens_per_s_per_round": [run.tokens_per_s for run in results],
                          "outputs_digest": middle.extra["outputs_digest"],
                          "row_steps_per_block": steps_per_block(middle),
                          "forward_tokens_per_generated_token": sum(
                              r.forward_tokens for r in middle.extra["trace"]) / middle.stats["generated_tokens"],
                          "projected": project_run(middle, host)}
    projected = {system: row["projected"] for system, row in table.items()}

    def ratio(a: str, b: str, key: str = "tokens_per_s") -> float:
        return projected[a][key] / projected[b][key]

    def measured(a: str, b: str) -> float:
        return table[a]["tokens_per_s"] / table[b]["tokens_per_s"]

    figures = {"block_sync_over_static_measured": measured("block_sync", "static"),
               "continuous_over_block_sync_measured": measured("continuous", "block_sync"),
               "block_sync_over_static_projected": ratio("block_sync", "static"),
               "continuous_over_block_sync_projected": ratio("continuous", "block_sync"),
               "continuous_over_shrink_projected": ratio("continuous", "shrink"),
               "block_sync_over_static_old_projection": ratio("block_sync", "static", "old_tokens_per_s"),
               "continuous_over_block_sync_old_projection": ratio("continuous", "block_sync", "old_tokens_per_s")}
    return {"systems": table, "figures": figures,
            "identical_outputs": len({row["outputs_digest"] for row in table.values()}) == 1}


def print_table(name: str, summary: dict) -> None:
    print(f"\n{name}: outputs identical across schedules: {summary['identical_outputs']}")
    print(f"{'schedule':>10} {'CPU tok/s':>9} {'fwd':>5} {'rows/f':>6} {'steps/blk':>9} | {'H200 tok/s*':>11} "
          f"{'MFU*':>6} {'host-bound':>10} | {'old tok/s*':>10}")
    for system, row in summary["systems"].items():
        p = row["projected"]
        print(f"{system:>10} {row['tokens_per_s']:9.1f} {row['denoise_steps']:5.0f} {row['rows_per_forward']:6.2f} "
              f"{row['row_steps_per_block']:9.2f} | {p['tokens_per_s']:11.1f} {p['mfu']:6.1%} "
              f"{p['host_bound_calls']:>4}/{p['calls']:<5} | {p['old_tokens_per_s']:10.1f}")
    print("(* projected from each run's trace: LLaDA-8B shapes on an H200, host model; old: GPU + 1.92 ms)")
    for key, value in summary["figures"].items():
        print(f"  {key}: {value:.3f}")


def markdown(result: dict) -> str:
    """The tables RESULTS.md shows, from a run's raw figures (``throughput.md`` beside the JSON)."""
    lines = []
    for name, summary in result["workloads"].items():
        notes = summary["notes"]
        lines += [f"### replay-{name}: {notes['requests']} requests, {result['rounds']} round(s), batch "
                  f"{result['batch_size']}; commit profile `{notes['commit_profile']}`, prompt widths "
                  f"`{notes['prompt_widths']}` (median {notes['prompt_tokens_median']}), answers median "
                  f"{notes['answer_tokens_median']}; outputs identical across schedules: "
                  f"**{summary['identical_outputs']}**", "",
                  "| schedule | CPU tok/s (rounds) | forwards | rows per forward | row-steps per block | forward "
                  r"tokens per generated token | **H200 tok/s\*** (host model) | MFU\* | host-bound forwards | "
                  r"old projection tok/s\* (MFU) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for system, row in summary["systems"].items():
            p = row["projected"]
            rounds = " / ".join(f"{value:.0f}" for value in row["tokens_per_s_per_round"])
            lines.append(f"| {system} | {row['tokens_per_s']:.1f} ({rounds}) | {row['denoise_steps']:.0f} | "
                         f"{row['rows_per_forward']:.2f} | {row['row_steps_per_block']:.2f} | "
                         f"{row['forward_tokens_per_generated_token']:.1f} | **{p['tokens_per_s']:.0f}** | "
                         f"{p['mfu']:.1%} | {p['host_bound_calls']}/{p['calls']} | "
                         f"{p['old_tokens_per_s']:.0f} ({p['old_mfu']:.1%}) |")
        labels = list(next(iter(summary["systems"].values()))["projected"]["sensitivity_tokens_per_s"])
        lines += ["", r"Sensitivity of the host-model projection (H200 tok/s\*, one constant moved at a time):", "",
                  "| schedule | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
        for system, row in summary["systems"].items():
            values = row["projected"]["sensitivity_tokens_per_s"]
            lines.append(f"| {system} | " + " | ".join(f"{values[label]:.0f}" for label in labels) + " |")
        lines += ["", "| ratio | value |", "|---|---|"]
        lines += [f"| {key} | {value:.3f} |" for key, value in summary["figures"].items()] + [""]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="full", choices=sorted(SCALES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/throughput"))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--workload", default="humaneval", choices=["humaneval", "short", "both"])
    parser.add_argument("--requests", type=int, default=None, help="requests per run (HumanEval has 164)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--commit-profile", default=LLADA_THRESHOLD_09.name)
    parser.add_argument("--widths", default="bpe", choices=WIDTHS)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="every schedule on a model loaded with compile=True")
    parser.add_argument("--host-model", default="measure",
                        help="'measure' (at the start of the run) or a host-model JSON file")
    args = parser.parse_args(argv)
    for key, value in SCALES[args.scale].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def load_host_model(spec: str, device: str, scale: str = "full") -> HostModel:
    if spec == "measure":  # the smoke scale measures a shallower model: its ops per layer are the same
        return measure_host.measure(device=device, **({"deep_layers": 4, "prompts": 4, "repeats": 1}
                                                     if scale == "smoke" else {}))
    return HostModel.from_dict(__import__("json").loads(Path(spec).read_text()))


def main(argv: list[str] | None = None) -> dict:
    import torch

    from benchmarks.plots import measured_vs_projected
    from engine.models import load_model

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    host = load_host_model(args.host_model, args.device, args.scale)
    print(f"host model: {host.to_dict()}", flush=True)
    lm = load_model(args.model, device=args.device, dtype="float32", compile=args.compile)
    result = {"batch_size": args.batch_size, "rounds": args.rounds, "requests": args.requests, "compile": args.compile,
              "host_model": host.to_dict(), "projection": {"model": "llada-8b", "device": "h200"}, "workloads": {}}
    names = ["humaneval", "short"] if args.workload == "both" else [args.workload]
    for name in names:
        workload = replay(name, lm, args.requests, profile=args.commit_profile, widths=args.widths)
        variants = {system: {"system": system, "max_batch_size": args.batch_size} for system in SYSTEMS}
        runs = interleaved(workload.steered(lm), variants, workload.workload, args.rounds)
        summary = summarize(runs, host)
        result["workloads"][name] = {"notes": workload.workload.notes} | summary
        print_table(name, summary)
    path = write_results(args.out, "throughput", result, ["throughput", *(argv or [])])
    figure = measured_vs_projected(result, args.out / "throughput.png")
    (args.out / "throughput.md").write_text(markdown(result))
    print(f"wrote {path} and {figure}")
    return result
